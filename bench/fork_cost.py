"""What one fork costs as the forking process's heap grows (docs/fleet.md, "Forks cost what the controller holds").

Ansible forks its controller once per host and task. This builds a heap of small dicts of strings (the shape of a
controller's variables), freezes it (as specdeploy's fork callback does), then forks a short-lived child per round
that reads a few thousand of those objects and allocates a little, as a worker does, and exits; the parent writes
a little between forks, as it does when it takes a result. It reports CPU per fork in the parent and in the
child and their minor faults, for each heap size, in one run:

    python3 bench/fork_cost.py --mb 20,100,160,300 --forks 300 [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def cpu(who: int) -> tuple[float, int]:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def one(mb: int, forks: int) -> dict:
    heap = [{f"k{j}": "v" * 40 + str(i * 10 + j) for j in range(10)} for i in range(mb * 1024 * 1024 // 1400)]
    gc.freeze()
    try:
        p0, c0, t0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.monotonic()
        for i in range(forks):
            pid = os.fork()
            if pid == 0:  # the worker: read some inherited objects, allocate some of its own, exit
                n = sum(len(d) for d in heap[i * 50:i * 50 + 3000])
                _ = [{"a": k} for k in range(20000)]
                os._exit(0 if n >= 0 else 1)
            os.waitpid(pid, 0)
            heap.append({"result": i})  # the controller takes a result
        p1, c1, t1 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.monotonic()
        return {"heap_mb": mb, "rss_mb": round(rss_mb(), 1), "forks": forks,
                "parent_ms": (p1[0] - p0[0]) / forks * 1e3, "child_ms": (c1[0] - c0[0]) / forks * 1e3,
                "parent_minflt": (p1[1] - p0[1]) / forks, "child_minflt": (c1[1] - c0[1]) / forks,
                "wall_ms": (t1 - t0) / forks * 1e3}
    finally:
        gc.unfreeze()
        del heap
        gc.collect()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="20,100,160,300", help="heap sizes in MB, comma-separated")
    ap.add_argument("--forks", type=int, default=300)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in a.mb.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--mb {a.mb!r}: give sizes in MB as integers separated by commas, e.g. 20,100")
    if not sizes or min(sizes) < 1 or max(sizes) > 4096 or not 1 <= a.forks <= 10000:
        ap.error("--mb from 1 to 4096 MB each; --forks from 1 to 10000")
    if os.environ.get("FORK_COST_CHILD"):  # one size, in the fresh process the loop below started
        print(json.dumps(one(sizes[0], a.forks)))
        return 0
    rows = []
    for mb in sizes:  # each size in a fresh process, so an earlier heap's arenas do not count
        out = subprocess.run([sys.executable, __file__, "--mb", str(mb), "--forks", str(a.forks)],
                             env={**os.environ, "FORK_COST_CHILD": str(mb)}, capture_output=True, text=True,
                             check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(r)
        print(f"heap {r['heap_mb']:5d} MB (RSS {r['rss_mb']:6.1f} MB): parent {r['parent_ms']:.2f} ms/fork "
              f"({r['parent_minflt']:.0f} faults), child {r['child_ms']:.2f} ms ({r['child_minflt']:.0f} faults), "
              f"wall {r['wall_ms']:.2f} ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "cpus": os.cpu_count()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
