"""Time `specdeploy drafter check` on a ~2 GB sparse drafter (hidden 7168, draft vocab 32000), and show that
it reads only headers and d2t/t2d: the bytes read are counted with /proc/self/io."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from specdeploy.drafter import check
from specdeploy.testing.fixtures import write_drafter

REPO = Path(__file__).resolve().parents[1]


def rchar() -> int:
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def main(reps: int = 20):
    with tempfile.TemporaryDirectory() as td:
        d = write_drafter(Path(td) / "drafter")
        size = os.path.getsize(d / "model.safetensors")
        target = REPO / "examples/models/kimi-k2.5-int4"
        check(d, target, "sglang")  # warm
        times = []
        r0 = rchar()
        for _ in range(reps):
            t = time.perf_counter()
            check(d, target, "sglang")
            times.append(time.perf_counter() - t)
        read = (rchar() - r0) / reps
        times.sort()
        print(f"drafter checkpoint: {size / 1e9:.2f} GB apparent")
        print(f"check: median {times[len(times) // 2] * 1e3:.1f} ms, min {times[0] * 1e3:.1f} ms over {reps} runs")
        print(f"bytes read per check: {read / 1e6:.2f} MB ({100 * read / size:.3f}% of the checkpoint)")


if __name__ == "__main__":
    main()
