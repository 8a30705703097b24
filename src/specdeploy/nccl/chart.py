"""PNG chart of an NCCL sweep: latency per all-reduce size for each candidate."""
from __future__ import annotations

from pathlib import Path


def sweep_chart(results_list: list[dict], out: Path, mode: str = "graph", chosen: str | None = None) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results_list), figsize=(7 * len(results_list), 5), squeeze=False)
    for ax, results in zip(axes[0], results_list):
        for c in results["candidates"]:
            if c["status"] != "ok" or mode not in c:
                continue
            pts = sorted((int(k), v["median_us"]) for k, v in c[mode].items())
            style = dict(lw=2.5, color="black") if c["name"] == chosen else dict(lw=1, alpha=0.8)
            if c["name"] == "default":
                style = dict(lw=2, ls="--", color="tab:blue")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=c["name"], **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"tokens per all-reduce (x {results['hidden']} bf16)")
        ax.set_ylabel(f"median latency, {mode} (us)")
        base = " ".join(f"{k}={v}" for k, v in results.get("base_env", {}).items()) or "as found"
        ax.set_title(f"{results['gpus']} GPUs, {results['candidates'][0].get('device', '')} ({base})", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
