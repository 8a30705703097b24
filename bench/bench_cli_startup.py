"""CLI start-up: wall and CPU time of one specdeploy command (default ``preflight -i inventory/example``) for this
working tree and, side by side, for an earlier commit, runs interleaved on the same machine.

    python3 bench/bench_cli_startup.py [--before COMMIT] [--runs 5] [--importtime] [-- preflight -i inventory/example]

Each tree runs ``python -m specdeploy.cli ...`` from its own directory with its own ``src`` first on PYTHONPATH
(relative paths such as inventory/example are each tree's own). One unmeasured run per tree first writes the
bytecode caches (PYTHONDONTWRITEBYTECODE is dropped for the runs: an installed package has them, and without
them every start compiles specdeploy's modules again). Rounds alternate the order of the trees. --importtime
adds, per tree, the top-level imports by cumulative time from ``python -X importtime`` (one more run each).
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CMD = ["preflight", "-i", "inventory/example"]


def commit_of(ref: str) -> str:
    r = subprocess.run(["git", "rev-parse", "--short=12", ref], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"--before {ref}: not a commit of {REPO} ({r.stderr.strip()})")
    return r.stdout.strip()


def export(ref: str, dest: Path) -> Path:
    """The tree of a commit, extracted (no checkout, no worktree entry in the repository)."""
    data = subprocess.run(["git", "archive", "--format=tar", ref], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def run_once(tree: Path, cmd: list[str], extra: list[str] | None = None) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the child, exit code, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tree / "src"), os.environ.get("PYTHONPATH"))
                                                     if p))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached, not compiled on every start
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *(extra or []), "-m", "specdeploy.cli", *cmd], cwd=tree, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.returncode, r.stderr


def top_imports(stderr: str, n: int) -> list[tuple[float, str]]:
    """Top-level entries of -X importtime output by cumulative time (ms)."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if not cumulative.strip().isdigit() or name[1:2] == " ":  # header, or nested (indented) import
            continue
        out.append((int(cumulative) / 1000, name.strip()))
    return sorted(out, reverse=True)[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="an earlier commit to compare against (e.g. main before a change), or a "
                    "directory holding such a tree")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--importtime", action="store_true", help="also list the slowest top-level imports per tree")
    ap.add_argument("cmd", nargs="*", help="specdeploy arguments (after --); default: preflight -i inventory/example")
    a = ap.parse_args()
    cmd = a.cmd or DEFAULT_CMD
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-") as tmp:
        trees = {f"this tree ({head}{'+changes' if dirty else ''})": REPO}
        if a.before and Path(a.before).is_dir():  # an exported tree (a machine without the repository's history)
            trees[f"before ({Path(a.before).name})"] = Path(a.before).resolve()
        elif a.before:
            trees[f"before ({commit_of(a.before)})"] = export(a.before, Path(tmp) / "before")
        for tree in trees.values():  # bytecode caches, and a check that the command runs at all
            _, _, rc, err = run_once(tree, cmd)
            if rc not in (0, 1):
                print(f"{tree}: specdeploy {' '.join(cmd)} exited {rc}:\n{err[-2000:]}", file=sys.stderr)
                return 2
        walls: dict[str, list[float]] = {k: [] for k in trees}
        cpus: dict[str, list[float]] = {k: [] for k in trees}
        names = list(trees)
        bare = []  # the interpreter alone, with this environment's site-packages (.pth files included)
        for i in range(a.runs):
            for name in (names if i % 2 == 0 else names[::-1]):
                wall, cpu, _, _ = run_once(trees[name], cmd)
                walls[name].append(wall)
                cpus[name].append(cpu)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            bare.append(time.perf_counter() - t0)
        print(f"specdeploy {' '.join(cmd)}: {a.runs} runs each, interleaved; {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'tree':40} {'wall median':>11} {'min':>6} {'max':>6} {'CPU median':>11}")
        for name in names:
            w, c = walls[name], cpus[name]
            print(f"{name:40} {statistics.median(w):10.2f}s {min(w):5.2f}s {max(w):5.2f}s "
                  f"{statistics.median(c):10.2f}s")
        print(f"{'python -c pass (interpreter start-up)':40} {statistics.median(bare):10.2f}s {min(bare):5.2f}s "
              f"{max(bare):5.2f}s")
        if a.importtime:
            for name, tree in trees.items():
                print(f"\n{name}: slowest top-level imports (ms, cumulative, one run with -X importtime)")
                for ms, mod in top_imports(run_once(tree, cmd, ["-X", "importtime"])[3], 12):
                    print(f"  {ms:7.0f}  {mod}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
