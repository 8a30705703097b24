"""Two trees' first deploys of the simulated fleet, interleaved: does a change make the controller's time per host
grow less with the fleet? (bench/README.md, "The deploy play forgets every result nothing later reads").

    python3 bench/deploy_ab.py --base REV [--head REV] --sizes 64,256 --rounds 2 [--out FILE]

Each arm is a frozen copy of its tree (``git archive``, bytecode compiled), so editing the checkout while it runs
changes nothing. Every round runs each size once per arm, the arms in ABBA order from one round to the next. Each
run is a fresh simulated fleet and a whole first deploy (``fleetsim.write_inventory``, ``fleetsim.playbook``) in a
process of its own, which reports its wall time, the controller's CPU (ansible-playbook and every worker) and the
largest resident memory of those processes. The result gives, per arm, the CPU per host at each size (every run and
the median) and the growth exponent fitted from the medians, and per size the ratio of the arms in each round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import fleet_scale  # noqa: E402  (its sizes and its exponent fit)

RUN_ONE = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
from specdeploy.testing import fleetsim
n, timeout = int(sys.argv[1]), float(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    inv, state = Path(tmp) / "inv", Path(tmp) / "state"
    fleetsim.write_inventory(inv, state, n)
    r = fleetsim.playbook(inv, state, timeout=timeout)
print(json.dumps({"rc": r.rc, "wall_s": r.wall_s, "cpu_s": r.cpu_s, "changed": r.changed,
                  "failed_hosts": r.failed_hosts,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def two_sizes(text: str) -> list[int]:
    sizes = fleet_scale.sizes_arg(text)
    if len(sizes) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least two sizes, to fit an exponent")
    return sizes


def freeze(rev: str, dest: Path) -> str:
    """The tree at ``rev``, written to ``dest`` with its bytecode compiled; returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode:
        raise SystemExit(f"deploy_ab: {rev!r} is not a commit of {REPO} (give --base/--head a revision git knows)")
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit.stdout.strip()], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise SystemExit(f"deploy_ab: git archive {rev} failed")
    subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash",
                    str(dest / "src"), str(dest / "ansible")], check=False, stdout=subprocess.DEVNULL)
    return commit.stdout.strip()


def run_one(tree: Path, n: int, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    p = subprocess.run([sys.executable, "-c", RUN_ONE, str(n), str(timeout)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=timeout + 120)
    if p.returncode:
        return {"rc": p.returncode, "error": (p.stderr or p.stdout)[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the control arm's revision")
    ap.add_argument("--head", default="HEAD", help="the changed arm's revision (default HEAD)")
    ap.add_argument("--sizes", type=two_sizes, default=[64, 256])
    ap.add_argument("--rounds", type=int, default=2, choices=range(1, 11), metavar="1..10")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per deploy, seconds")
    ap.add_argument("--out", type=Path, default=None, help="JSON result (default: print only)")
    a = ap.parse_args(argv)

    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="deploy-ab-") as tmp:
        arms = {"base": Path(tmp) / "base", "head": Path(tmp) / "head"}
        commits = {"base": freeze(a.base, arms["base"]), "head": freeze(a.head, arms["head"])}
        total = a.rounds * len(a.sizes) * 2
        for r in range(a.rounds):
            for n in a.sizes:
                order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
                for arm in order:
                    t0 = time.time()
                    rec = {"round": r + 1, "hosts": n, "arm": arm, "started": t0,
                           "load_before": list(os.getloadavg()), **run_one(arms[arm], n, a.timeout)}
                    runs.append(rec)
                    per_host = rec["cpu_s"] / n if rec.get("rc") == 0 else float("nan")
                    print(f"[{len(runs)}/{total}] round {r + 1}, {n} hosts, {arm}: rc {rec.get('rc')}, "
                          f"{rec.get('wall_s', 0):.1f} s wall, {per_host:.2f} s CPU per host, "
                          f"{rec.get('max_rss_mb', 0):.1f} MB", flush=True)

    summary: dict = {"arms": {}, "ratio_head_to_base": {}}
    for arm in ("base", "head"):
        per_size = {}
        for n in a.sizes:
            vals = [x["cpu_s"] / n for x in runs if x["arm"] == arm and x["hosts"] == n and x.get("rc") == 0]
            per_size[n] = {"cpu_per_host": vals, "median": statistics.median(vals) if vals else None}
        medians = [per_size[n]["median"] for n in a.sizes]
        summary["arms"][arm] = {"commit": commits[arm], "sizes": per_size, "exponent_cpu": None if None in medians
                                else fleet_scale.fit({n: m * n for n, m in zip(a.sizes, medians)}, start=1)}
    for n in a.sizes:
        ratios = []
        for r in range(1, a.rounds + 1):
            pair = {x["arm"]: x for x in runs if x["round"] == r and x["hosts"] == n and x.get("rc") == 0}
            if len(pair) == 2:
                ratios.append(pair["head"]["cpu_s"] / pair["base"]["cpu_s"])
        summary["ratio_head_to_base"][n] = ratios
    result = {"machine": {"cpus": os.cpu_count()}, "sizes": a.sizes, "rounds": a.rounds, "runs": runs, **summary}
    print(json.dumps({k: result[k] for k in ("arms", "ratio_head_to_base")}, indent=1))
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(x.get("rc") == 0 for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
