"""Triage of a large log: wall time, CPU time and peak memory of ``specdeploy triage FILE`` on a generated log
(default 200 MB: interleaved vLLM V1 worker INFO records, then a real corpus crash at the end).

    python3 bench/bench_triage_large.py [--mb 200] [--runs 3] [--crash vllm-7801-v0-flattened-nccl.log]

The log is written to a temporary directory and removed afterwards. Each run is a fresh
``python -m specdeploy.cli triage`` process; its CPU time and peak RSS come from getrusage of the child.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "triage"


def write_log(path: Path, mb: int, crash: str) -> int:
    lines = [f"(Worker_TP{tp} pid={4100 + tp}) INFO 02-21 19:48:{s:02d} [default_loader.py:291] Loading weights "
             f"took 1.{tp}{s} seconds, shard {s:05d} of 00064\n" for tp in range(8) for s in range(60)]
    block = "".join(lines).encode()
    with open(path, "wb") as fh:
        for _ in range(mb * (1 << 20) // len(block)):
            fh.write(block)
        fh.write((CORPUS / crash).read_bytes())
    return path.stat().st_size


def run_once(path: Path) -> tuple[float, float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "triage", str(path)], capture_output=True, text=True,
                       env=env, cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    root = next((ln.split(None, 1)[1] for ln in r.stdout.splitlines() if ln.startswith("root_cause")), "(none)")
    return wall, cpu, after.ru_maxrss / 1024, root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--crash", default="vllm-7801-v0-flattened-nccl.log")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "large.log"
        size = write_log(path, args.mb, args.crash)
        print(f"log: {size / 1e6:.0f} MB, crash from {args.crash} at the end")
        walls, cpus = [], []
        for i in range(args.runs):
            wall, cpu, rss, root = run_once(path)
            walls.append(wall)
            cpus.append(cpu)
            print(f"run {i + 1}: wall {wall:.2f} s, cpu {cpu:.2f} s, peak rss (largest child so far) {rss:.0f} MB, "
                  f"root {root[:80]}")
        print(f"median wall {statistics.median(walls):.2f} s, median cpu {statistics.median(cpus):.2f} s")


if __name__ == "__main__":
    main()
