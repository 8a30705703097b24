"""Does freezing the controller's heap before Ansible forks its workers keep a worker's cost flat as the fleet grows
(specdeploy.deploy.forking, docs/fleet.md)? For each size, a fresh simulated fleet (specdeploy.testing.fleetsim) and
the real `ansible/deploy.yml` run with the freeze on and off (SPECDEPLOY_FORK_FREEZE=0), the two arms interleaved
and their order alternated each round, each from a fresh copy of the fleet's state: the controller's CPU (the
ansible-playbook process and every worker it forked) and wall time per host, the ratio on/off per size with its
spread over the rounds, and each arm's growth exponent (log-log least squares over the sizes from 64 hosts on).
By default the plays tagged deploy_preflight run (the converged check, the preflight and what is tagged always);
--full runs a whole first deploy. JSON and a PNG chart beside it.

    nice -n 5 python3 bench/fleet_fork.py --sizes 64,256 --runs 2 --out bench/fleet_fork

Nothing outside the temporary directory is written; no host is reached (the test-only connection plugin). Run it
from a clone that nothing edits while it runs (docs/fleet.md)."""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from fleet_scale import fit, sizes_arg  # noqa: E402

from specdeploy.deploy.forking import SWITCH  # noqa: E402
from specdeploy.testing import fleetsim  # noqa: E402

PROBE = {fleetsim.FREEZE_PROBE: "1"}  # the simulated hosts count calls from unfrozen workers
ARMS = {"on": PROBE, "off": {SWITCH: "0", **PROBE}}


def one_run(n: int, base: Path, fresh: Path, arm: str, r: int, full: bool, timeout: float) -> dict:
    inv, state = base / "inv", base / f"state-{arm}-{r}"
    shutil.copytree(fresh, state)
    run = fleetsim.playbook(inv, state, tags=None if full else "deploy_preflight", timeout=timeout,
                            env_extra=ARMS[arm])
    hosts = fleetsim.host_names(n)
    unfrozen = sum(fleetsim.host_state(state, h).get("unfrozen_module_calls", 0) for h in hosts)
    shutil.rmtree(state, ignore_errors=True)
    out = {"arm": arm, "round": r, "rc": run.rc, "wall_s": round(run.wall_s, 2), "cpu_s": round(run.cpu_s, 2),
           "cpu_per_host_s": round(run.cpu_s / n, 4), "changed": run.changed, "failed_hosts": run.failed_hosts,
           "hosts_in_recap": len(run.recap), "unfrozen_module_calls": unfrozen}
    if run.rc:
        out["tail"] = run.output[-2000:]
    return out


def one_size(n: int, runs: int, full: bool, timeout: float) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"fleet-fork-{n}-"))
    try:
        fleetsim.write_inventory(base / "inv", base / "fresh", n)
        rows = []
        for r in range(runs):
            for arm in (("off", "on") if r % 2 == 0 else ("on", "off")):
                rows.append(one_run(n, base, base / "fresh", arm, r, full, timeout))
                row = rows[-1]
                print(f"    {n} hosts, round {r + 1}, freeze {arm}: {row['wall_s']:.1f} s wall, "
                      f"{row['cpu_s']:.1f} s CPU ({row['cpu_per_host_s']:.3f} s per host), rc {row['rc']}, "
                      f"unfrozen module calls {row['unfrozen_module_calls']}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    per = {arm: [x for x in rows if x["arm"] == arm] for arm in ARMS}
    ratios = [a["cpu_s"] / b["cpu_s"] for a, b in zip(per["on"], per["off"])]
    return {"hosts": n, "runs": rows,
            "cpu_per_host_s": {arm: statistics.median(x["cpu_per_host_s"] for x in xs) for arm, xs in per.items()},
            "wall_s": {arm: statistics.median(x["wall_s"] for x in xs) for arm, xs in per.items()},
            "cpu_ratio_on_off": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
            "ok": all(x["rc"] == 0 and x["hosts_in_recap"] >= n and not x["failed_hosts"] for x in rows)
            and all(x["unfrozen_module_calls"] == 0 for x in per["on"])
            and all(x["unfrozen_module_calls"] > 0 for x in per["off"])}


def chart(record: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes = [s["hosts"] for s in record["sizes"]]
    for arm, style in (("off", "o--"), ("on", "s-")):
        (line,) = ax.plot(sizes, [s["cpu_per_host_s"][arm] for s in record["sizes"]], style,
                          label=f"freeze {arm}: median (exponent {record['exponent_cpu'][arm]})")
        rounds = [(s["hosts"], r["cpu_per_host_s"]) for s in record["sizes"] for r in s["runs"] if r["arm"] == arm]
        ax.scatter([n for n, _ in rounds], [v for _, v in rounds], color=line.get_color(), marker="x", s=30,
                   label=f"freeze {arm}: each round")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("simulated hosts")
    ax.set_ylabel("controller CPU per host, s")
    ax.set_title(f"{record['what']}: controller CPU per host")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=sizes_arg, default=[64, 256])
    ap.add_argument("--runs", type=int, default=2, choices=range(1, 11), metavar="1..10")
    ap.add_argument("--full", action="store_true", help="a whole first deploy instead of --tags deploy_preflight")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per run, seconds")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "fleet_fork", help="writes OUT.json and OUT.png")
    a = ap.parse_args(argv)
    what = "first deploy" if a.full else "--tags deploy_preflight"
    record: dict = {"what": what, "sizes": []}
    for n in a.sizes:
        print(f"{n} hosts ({what}):", flush=True)
        record["sizes"].append(one_size(n, a.runs, a.full, a.timeout))
    for key, field in (("exponent_cpu", "cpu_per_host_s"), ("exponent_wall", "wall_s")):
        record[key] = {}
        for arm in ARMS:
            pts = {s["hosts"]: s[field][arm] * (s["hosts"] if field == "cpu_per_host_s" else 1)
                   for s in record["sizes"]}
            b = fit(pts)
            record[key][arm] = round(b, 3) if b is not None else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    chart(record, a.out.with_suffix(".png"))
    for s in record["sizes"]:
        r = s["cpu_ratio_on_off"]
        print(f"{s['hosts']} hosts: CPU per host off {s['cpu_per_host_s']['off']:.3f} s, on "
              f"{s['cpu_per_host_s']['on']:.3f} s; on/off {r['median']:.3f} (rounds {r['min']:.3f}-{r['max']:.3f})")
    print(f"growth exponent, CPU: {record['exponent_cpu']}; wall: {record['exponent_wall']}")
    return 0 if all(s["ok"] for s in record["sizes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
