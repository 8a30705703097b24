"""The operator's day-2 loop on one host, counted in full loads and in time, with and without a weight-cache daemon.

    python3 bench/day2_loop.py [--checkpoint-gb 600] [--read-gbps G] [--probe-dir /var/tmp] [--probe-gib 2]
                               [--out bench/day2/day2.json]

The loop: the first deploy, the speculation gate (a baseline and a speculative engine), a regate (the same two),
a canary of a new drafter, a flag change, a crash restart, a rollback of the flag change. Each step's engine starts
are counted from what the deploy does (deploy/weights.py decides them: the same function the role calls), so the
count is the tool's own, not a guess.

What the time of a start is made of:
- the weights: a full load reads the checkpoint (``--checkpoint-gb``) at the host's read speed. Measured here:
  this machine's sequential read of a file written for the purpose, uncached (O_DIRECT), and from the page cache
  (the speed a restart gets when the checkpoint stayed in the host's memory, which the deploy's page-cache warm
  checks and keeps where the host's memory holds it). ``--read-gbps`` gives the disk's speed instead (a GPU
  host's NVMe).
- everything else (compile, autotune, CUDA graphs, KV cache): not measurable without a GPU. The figures used are
  the published ModelExpress measurement of DeepSeek-V4-Pro on 8x B200 (ai-dynamo/modelexpress
  docs/BENCHMARKS.md): API ready in 8 min 1 s with weights from cold local storage (of which the weights 1 min
  10 s), 7 min with weights over P2P RDMA (11 s), 1 min 44 s with P2P weights and the kernel artifacts kept. So:
  about 6 min 50 s of a cold start is not weights, about 1 min 33 s is not when the compile caches survive.
- an attach: the daemon hands over IPC handles; sgl-project/sglang#27139 measured under 1 s for a 235 GB FP8
  checkpoint (disk 306-327 s). 1 s is used.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

GB = 1e9
GIB = 1 << 30
INIT_COLD_S = 8 * 60 + 1 - 70     # ModelExpress, DeepSeek-V4-Pro 8xB200: ready 8m01s, of which weights 1m10s
INIT_CACHED_S = 60 + 44 - 11      # ready 1m44s with P2P weights (11 s) and kernel artifacts kept
ATTACH_S = 1.0                    # sglang#27139: IPC handles for 235 GB in under 1 s

# (step, what changes): each step's engine restarts as the deploy decides them
LOOP = [
    ("first deploy", {"first": True}),
    ("gate: baseline engine", {}),
    ("gate: speculative engine", {}),
    ("regate: baseline engine", {}),
    ("regate: speculative engine", {}),
    ("canary: a new drafter", {}),
    ("a flag change", {}),
    ("a crash restart (systemd)", {"crash": True}),
    ("rollback of the flag change", {"rollback": True}),
]


def measure_read(directory: Path, gib: float) -> dict:
    """Sequential read speed here: a file of random bytes written for the purpose, read once with O_DIRECT (the
    disk) and twice through the page cache (the second: memory)."""
    path = directory / f"specdeploy-readprobe-{os.getpid()}"
    size = int(gib * GIB) // (1 << 20) * (1 << 20)
    block = 16 << 20
    try:
        with open(path, "wb") as f:
            chunk = os.urandom(block)
            for _ in range(size // block):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
        t0 = time.perf_counter()
        n = 0
        try:
            while True:
                got = os.readv(fd, [buf])
                if not got:
                    break
                n += got
        finally:
            os.close(fd)
        disk_s = time.perf_counter() - t0
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
            times.append(time.perf_counter() - t0)
        return {"bytes": n, "disk_gbps": n / disk_s / GB, "page_cache_gbps": size / times[-1] / GB,
                "o_direct": hasattr(os, "O_DIRECT"), "where": str(directory)}
    finally:
        path.unlink(missing_ok=True)


def loop_counts(cached: bool) -> list[dict]:
    """Each step's restarts, as deploy/weights.py decides them for a host whose engine attaches to a daemon
    (``cached``) or not."""
    from specdeploy.deploy.weights import restarts
    plan = {"weight_cache": {"unit": "specdeploy-vllm-weights.service", "key": "k"} if cached else None,
            "weight_cache_why": "no daemon"}
    out = []
    for step, what in LOOP:
        if what.get("first"):
            r = restarts(plan, True, "inactive", "", False)
        elif what.get("crash"):  # systemd restarts the engine; the daemon it is bound to still runs
            r = {"daemon": False, "engine": True, "full_load": not cached}
        else:
            r = restarts(plan, True, "active", "k", False)
        out.append({"step": step, "full_load": bool(r["full_load"]), "engine": bool(r["engine"])})
    return out


def times(steps: list[dict], checkpoint_gb: float, disk_gbps: float, page_gbps: float | None, compile_kept: bool,
          cached: bool) -> tuple[int, float]:
    """(full loads, seconds of serving lost over the loop)."""
    init = INIT_CACHED_S if compile_kept else INIT_COLD_S
    loads, total = 0, 0.0
    for i, s in enumerate(steps):
        if s["full_load"]:
            loads += 1
            speed = disk_gbps if (i == 0 or page_gbps is None) else page_gbps
            total += checkpoint_gb / speed + init
        elif s["engine"]:
            total += ATTACH_S + init
    return loads, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint-gb", type=float, default=600.0)
    ap.add_argument("--read-gbps", type=float, default=None, help="the disk's sequential read (default: measured)")
    ap.add_argument("--probe-dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--probe-gib", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    m = measure_read(a.probe_dir, a.probe_gib)
    disk = a.read_gbps or m["disk_gbps"]
    rows = []
    for label, cached, warm, kept in (
            ("no daemon, every start reads the disk, compile caches lost", False, False, False),
            ("no daemon, every start reads the disk, compile caches kept", False, False, True),
            ("no daemon, restarts read the page cache (warmed), compile caches kept", False, True, True),
            ("weight-cache daemon, compile caches kept", True, False, True)):
        steps = loop_counts(cached)
        loads, secs = times(steps, a.checkpoint_gb, disk, m["page_cache_gbps"] if warm else None, kept, cached)
        rows.append({"scenario": label, "full_loads": loads, "engine_starts": sum(s["engine"] for s in steps),
                     "minutes": round(secs / 60, 1)})
    doc = {"checkpoint_gb": a.checkpoint_gb, "read": m, "disk_gbps_used": disk,
           "assumptions": {"init_cold_s": INIT_COLD_S, "init_compile_kept_s": INIT_CACHED_S, "attach_s": ATTACH_S},
           "loop": [s for s, _ in LOOP], "rows": rows, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"read here ({m['where']}, {m['bytes'] / GIB:.1f} GiB): disk {m['disk_gbps']:.2f} GB/s (O_DIRECT), "
          f"page cache {m['page_cache_gbps']:.2f} GB/s; a {a.checkpoint_gb:.0f} GB checkpoint at {disk:.2f} GB/s: "
          f"{a.checkpoint_gb / disk / 60:.1f} min")
    print(f"| scenario ({len(LOOP)} engine starts) | full loads | serving lost |\n|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['full_loads']} | {r['minutes']} min |")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
