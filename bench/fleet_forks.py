"""A whole first deploy of one simulated fleet under different forks, interleaved (bench/README.md, "A batch larger
than the forks"). Each run starts from a fresh copy of the same state; prints one JSON line per run.

    python3 bench/fleet_forks.py --hosts 64 --batch-percent 40 --forks 25,26 --runs 2
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from specdeploy.testing import fleetsim  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 bench/fleet_forks.py")
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--batch-percent", type=int, default=40)
    ap.add_argument("--forks", default="25,26", help="comma-separated forks, one arm each")
    ap.add_argument("--runs", type=int, default=2, help="rounds; the arms' order is reversed every other round")
    a = ap.parse_args(argv)
    arms = [int(f) for f in a.forks.split(",")]
    base = Path(tempfile.mkdtemp(prefix="fleet-forks-"))
    fleetsim.write_inventory(base / "inv", base / "fresh", a.hosts,
                             extra_group_vars={"specdeploy_rolling_batch_percent": a.batch_percent})
    for r in range(a.runs):
        for forks in arms if r % 2 == 0 else arms[::-1]:
            state = base / f"state-{r}-{forks}"
            shutil.copytree(base / "fresh", state)
            run = fleetsim.playbook(base / "inv", state, forks=forks, timeout=3600)
            print(json.dumps({"round": r, "forks": forks, "rc": run.rc, "wall_s": round(run.wall_s, 1),
                              "cpu_s": round(run.cpu_s, 1), "cpu_per_host_s": round(run.cpu_s / a.hosts, 3),
                              "changed": run.changed,
                              "batches": run.output.count("TASK [A batch moves whole serving groups")}), flush=True)
            shutil.rmtree(state, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
