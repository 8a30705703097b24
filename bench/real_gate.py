"""The speculation gate on the real vLLM CPU build: a baseline run without speculation, then one run with the
tiny target's "good" EAGLE-3 drafter and one with its "random" drafter, each engine started from the command
line specdeploy renders (testing/realrun.py) and measured by specdeploy's own gate (gate.gate); prints one
markdown row per run.

    PYTHONPATH=src python3 bench/real_gate.py [--concurrency 1,4] [--requests 16] [--max-tokens 64] [--k 1]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specdeploy.speculation.gate import gate  # noqa: E402
from specdeploy.testing import realrun, tinymodels  # noqa: E402


def measure(target: Path, drafter: Path | None, logdir: Path, concurrency, requests, max_tokens, k,
            baseline=None) -> dict:
    hv = realrun.host_vars(target, drafter, k=k)
    eng = realrun.serve(hv, logdir)
    try:
        return gate(eng.url, "vllm", concurrency, requests, max_tokens, None, baseline, k if drafter else None)
    finally:
        eng.stop()


def runs(kind: str, concurrency, requests, max_tokens, k, workdir: Path):
    """(name, report) for the baseline, the good drafter and the random drafter, in that order."""
    target = tinymodels.target(kind)
    base = measure(target, None, workdir / "baseline", concurrency, requests, max_tokens, k)
    yield "baseline (no speculation)", base
    for quality in ("good", "random"):
        yield (f"EAGLE-3 {quality} drafter, k={k}",
               measure(target, tinymodels.drafter(kind, quality), workdir / quality, concurrency, requests,
                       max_tokens, k, base))


def row(name: str, rep: dict) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)
    cells = []
    for lv in rep["levels"]:
        cells.append(f"c={lv['concurrency']}: {lv['output_tps']:.1f} tok/s, AL {f(lv.get('acceptance_length'), '.2f')}"
                     f", speedup {f(lv.get('speedup'), '.2f')}")
    return f"| {name} | {'; '.join(cells)} | {rep.get('verdict') or '-'} | {rep.get('reason')} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", default="llama", choices=tinymodels.KINDS)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the three reports here")
    a = ap.parse_args(argv)
    levels = [int(c) for c in a.concurrency.split(",")]
    realrun.tiny_cache_from_env()
    t0 = time.time()
    out = {}
    print("| run | per concurrency: output tokens/s, acceptance length, speedup | verdict | reason |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="real-gate-") as tmp:
        for name, rep in runs(a.kind, levels, a.requests, a.max_tokens, a.k, Path(tmp)):
            out[name] = rep
            print(row(name, rep), flush=True)
    print(f"\n{time.time() - t0:.0f} s in all", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
