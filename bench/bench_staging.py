"""Staging throughput against plain cp and rsync on the same files, side by side and interleaved.

A file set of real random bytes (several GB) is written under /var/tmp; each round copies it once with every
method in a rotated order, with the page cache dropped before each copy (as root) so reads come from disk.
`cp` runs twice per round: the second is the A/A line, the spread between two identical methods. The staging
copy runs with read-back sha256 verification (the default) and with header checks only. Then the time of a
no-change `stage` (the redeploy case) is measured. Everything written is removed at the end.

    python bench/bench_staging.py --gb 4 --rounds 3 --out bench/results/staging
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from specdeploy.hostscripts import staging
from specdeploy.checkpoint.safetensors_io import write_sparse


def make_set(root: Path, gb: float, shards: int) -> int:
    """A checkpoint-shaped file set: config, index, shards of random bytes (safetensors headers included)."""
    root.mkdir(parents=True)
    per = int(gb * 1e9 / shards) // 4096 * 4096
    rng = random.Random(7)
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"model.layers.{i}.mlp.experts.weight_packed"
        path = root / name
        write_sparse(path, {tensor: ("U8", (per,))})
        with open(path, "r+b") as fh:  # fill the tensor with random bytes, 64 MiB at a time
            fh.seek(path.stat().st_size - per)
            left = per
            while left:
                n = min(left, 64 << 20)
                fh.write(rng.randbytes(n))
                left -= n
        weight_map[tensor] = name
    (root / "config.json").write_text('{"model_type": "deepseek_v3"}')
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return sum(p.stat().st_size for p in root.iterdir())


def drop_caches():
    subprocess.run(["sync"], check=True)
    if os.geteuid() == 0:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run(method: str, src: Path, dst: Path, jobs: int) -> float:
    drop_caches()
    t0 = time.monotonic()
    if method.startswith("cp"):
        subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    elif method == "rsync":
        subprocess.run(["rsync", "-a", f"{src}/", f"{dst}/"], check=True)
    elif method == "rsync --sparse":
        subprocess.run(["rsync", "-a", "--sparse", f"{src}/", f"{dst}/"], check=True)
    elif method == "staging (sha256 read-back)":
        staging.copy_tree(src, dst, jobs=jobs, verify_hash=True)
    elif method == "staging (headers only)":
        staging.copy_tree(src, dst, jobs=jobs, verify_hash=False)
    subprocess.run(["sync"], check=True)  # count the write-back for every method alike
    el = time.monotonic() - t0
    if method.startswith("staging"):
        assert staging.verify(dst).ok
    shutil.rmtree(dst)
    return el


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--out", type=Path, default=Path("bench/results/staging"))
    a = ap.parse_args()
    work = Path(a.dir) / f"specdeploy-bench-staging-{os.getpid()}"
    methods = ["cp", "cp (A/A)", "rsync", "rsync --sparse", "staging (sha256 read-back)", "staging (headers only)"]
    times: dict[str, list[float]] = {m: [] for m in methods}
    try:
        total = make_set(work / "src", a.gb, a.shards)
        print(f"file set: {total / 1e9:.2f} GB in {a.shards} shards of random bytes, {os.cpu_count()} CPUs",
              flush=True)
        for r in range(a.rounds):
            order = methods[r % len(methods):] + methods[:r % len(methods)]
            for m in order:
                el = run(m, work / "src", work / "dst", a.jobs)
                times[m].append(el)
                print(f"round {r + 1} {m:28s} {el:6.2f} s  {total / el / 1e9:5.2f} GB/s", flush=True)
        link = work / "models" / "kimi"
        link.parent.mkdir()
        staging.stage(work / "src", link, jobs=a.jobs)
        noop = []
        for _ in range(5):
            drop_caches()
            t0 = time.monotonic()
            out = staging.stage(work / "src", link, jobs=a.jobs)
            noop.append(time.monotonic() - t0)
            assert out["changed"] is False
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rsync_med = statistics.median(times["rsync"])
    rows = []
    for m in methods:
        med = statistics.median(times[m])
        rows.append({"method": m, "median_s": med, "min_s": min(times[m]), "max_s": max(times[m]),
                     "gbps_median": total / med / 1e9, "gbps_min": total / max(times[m]) / 1e9,
                     "gbps_max": total / min(times[m]) / 1e9, "vs_rsync": rsync_med / med})
    result = {"bytes": total, "shards": a.shards, "rounds": a.rounds, "jobs": a.jobs, "cpus": os.cpu_count(),
              "rows": rows, "raw": times, "noop_stage_s": noop}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "staging.json").write_text(json.dumps(result, indent=2))
    print("\n| method | GB/s median (min-max) | vs rsync |\n|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['gbps_median']:.2f} ({r['gbps_min']:.2f}-{r['gbps_max']:.2f}) | "
              f"{r['vs_rsync']:.2f}x |")
    print(f"\nno-change stage: median {statistics.median(noop) * 1e3:.1f} ms (max {max(noop) * 1e3:.1f} ms) over "
          f"{len(noop)} runs, caches dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
