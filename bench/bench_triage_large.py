"""Triage of a large log: wall time, CPU time and peak memory of ``specdeploy triage FILE`` on a generated log
(default 200 MB: interleaved vLLM V1 worker INFO records, then a real corpus crash at the end).

    python3 bench/bench_triage_large.py [--mb 200] [--runs 3] [--crash vllm-7801-v0-flattened-nccl.log]
                                        [--shape plain|docker-json|journald-html]
    python3 bench/bench_triage_large.py --rewrap

``--shape`` writes every line (the crash's too) in the shape an operator may hand over: docker's json-file records,
or journald lines pasted from a web page (HTML-escaped). The log is written to a temporary directory and removed
afterwards. Each run is a fresh ``python -m specdeploy.cli triage`` process; its CPU time and peak RSS come from
getrusage of the child.

``--rewrap`` runs the whole cross product the unit test samples: every corpus log in every pair of forms (each form
around each other form, tests/unit/triage/test_triage_formats.py), and counts the answers that differ from the log
as posted (exit status 1 if any does).
"""
from __future__ import annotations

import argparse
import html
import json
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


SHAPES = {
    "plain": lambda line: line,
    "docker-json": lambda line: json.dumps({"log": line + "\n", "stream": "stderr",
                                            "time": "2026-02-21T19:48:13.123456789Z"}),
    "journald-html": lambda line: html.escape(f"Feb 21 19:48:13.123456 gpu-a specdeploy-vllm[4100]: {line}"),
}


def write_log(path: Path, mb: int, crash: str, shape: str = "plain") -> int:
    wrap = SHAPES[shape]
    lines = [wrap(f"(Worker_TP{tp} pid={4100 + tp}) INFO 02-21 19:48:{s:02d} [default_loader.py:291] Loading weights "
                  f"took 1.{tp}{s} seconds, shard {s:05d} of 00064") + "\n" for tp in range(8) for s in range(60)]
    block = "".join(lines).encode()
    tail = "".join(wrap(line) + "\n" for line in (CORPUS / crash).read_text().splitlines()).encode()
    with open(path, "wb") as fh:
        for _ in range(mb * (1 << 20) // len(block)):
            fh.write(block)
        fh.write(tail)
    return path.stat().st_size


def rewrap() -> int:
    """Every corpus log in every form around every form; the number of answers that differ from the as-posted one."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "unit" / "triage"), str(REPO / "src")]
    import yaml
    from test_triage_formats import ALL_FORMS, _nest

    from specdeploy.triage import read_log, triage_lines
    index = yaml.safe_load((CORPUS / "index.yaml").read_text())["logs"]
    t0 = time.perf_counter()
    runs = wrong = 0
    for entry in index:
        lines = read_log(CORPUS / entry["file"])
        want = triage_lines(lines)
        want = (want.outcome, want.root_cause, want.signature)
        for outer_name, outer in ALL_FORMS.items():
            for inner_name, inner in ALL_FORMS.items():
                got = triage_lines([_nest(outer, inner)(line) for line in lines])
                runs += 1
                if (got.outcome, got.root_cause, got.signature) != want:
                    wrong += 1
                    if wrong <= 20:
                        print(f"differs: {entry['file']} in {outer_name}({inner_name}): {got.root_cause!r:.100}")
    print(f"rewrap: {len(index)} logs x {len(ALL_FORMS)} x {len(ALL_FORMS)} forms = {runs} triages in "
          f"{time.perf_counter() - t0:.0f} s; {wrong} differ from the log as posted")
    return 1 if wrong else 0


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
    ap.add_argument("--shape", default="plain", choices=sorted(SHAPES))
    ap.add_argument("--rewrap", action="store_true", help="the whole cross product of the rewrap test's forms")
    args = ap.parse_args()
    if args.rewrap:
        sys.exit(rewrap())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "large.log"
        size = write_log(path, args.mb, args.crash, args.shape)
        print(f"log: {size / 1e6:.0f} MB ({args.shape}), crash from {args.crash} at the end")
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
