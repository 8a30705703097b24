"""PNG chart of an NCCL choice: latency per all-reduce size (median over rounds), and each candidate's weighted
decode latency relative to the default, round by round, with its 95% interval and the A/A control."""
from __future__ import annotations

import statistics
from pathlib import Path


def choice_chart(items: list[tuple[str, dict]], choice, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdeploy.nccl.choose import load_rounds
    from specdeploy.nccl.tune import AA_NAME

    meta, rounds = load_rounds(items)
    mode = choice.mode
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 5.5))
    names = list(choice.candidates)
    for n in names:
        per = [r.runs[n][mode] for r in rounds if r.runs.get(n, {}).get("status") == "ok" and mode in r.runs[n]]
        if not per:
            continue
        sizes = sorted({int(k) for p in per for k in p})
        med = [statistics.median(p[str(t)]["median_us"] for p in per if str(t) in p) for t in sizes]
        style = {"lw": 1, "alpha": 0.8}
        if n == choice.chosen:
            style = {"lw": 2.5, "color": "black"}
        if n == "default":
            style = {"lw": 2, "ls": "--", "color": "tab:blue"}
        ax.plot(sizes, med, marker="o", ms=3, label=n, **style)
    for t in choice.not_nccl:
        ax.axvspan(t / 1.3, t * 1.3, color="0.9", lw=0)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"tokens per all-reduce (x {meta['hidden']} bf16); grey: carried by the engine, not NCCL")
    ax.set_ylabel(f"latency, {mode} (us, median over rounds)")
    base = " ".join(f"{k}={v}" for k, v in meta.get("base_env", {}).items()) or "as found"
    ax.set_title(f"{choice.gpus} GPUs ({base}), {choice.rounds} round(s)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)

    rows = [(n, choice.candidates[n]) for n in names if choice.candidates[n].decode and n != "default"]
    rows.sort(key=lambda x: x[1].decode.ratio)
    if choice.aa and choice.aa.decode:
        rows.append(("A/A (" + AA_NAME + ")", choice.aa))
    for y, (n, c) in enumerate(rows):
        d = c.decode
        key = AA_NAME if n.startswith("A/A") else n
        pts = []
        for r in rounds:
            rec, dflt = r.runs.get(key), r.runs.get("default")
            if not rec or not dflt or rec["status"] != "ok" or dflt["status"] != "ok":
                continue
            w = [sum(wt * rec[mode][str(t)]["median_us"] for t, wt in choice.weights.items()),
                 sum(wt * dflt[mode][str(t)]["median_us"] for t, wt in choice.weights.items())]
            pts.append(w[0] / w[1])
        color = "black" if n == choice.chosen else ("tab:gray" if key == AA_NAME else "tab:orange")
        bx.scatter(pts, [y] * len(pts), s=12, color=color, alpha=0.6)
        bx.errorbar([d.ratio], [y], xerr=[[d.ratio - d.lo], [d.hi - d.ratio]], fmt="D", color=color, capsize=3)
    bx.axvline(1.0, color="tab:blue", ls="--", lw=1)
    bx.axvline(1 - choice.criteria.get("min_gain", 0.03), color="tab:green", ls=":", lw=1)
    bx.set_yticks(range(len(rows)), [n for n, _ in rows], fontsize=7)
    bx.set_xlabel("weighted decode latency / default's in the same round (dots: rounds; diamond: geomean, 95% CI)")
    bx.set_title(f"chosen: {choice.chosen}", fontsize=9)
    bx.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    from specdeploy.values.outputs import save_png
    try:
        save_png(fig, out, "--chart", "nccl choose", dpi=110)
    finally:
        plt.close(fig)
    return out
