"""Every generated case of the security classes (tests/robust_security.py: hostile output targets, hostile names,
terminal control, secrets by value, depth and size, concurrency), each in its own scratch tree, with the checks of
``robust_security.run``; and, as real processes, every writer against every system path inside a private mount
namespace (overlays on the system directories, the root read-only) and every writer race ``--races`` times.
The suite (tests/unit/cli/test_security.py) runs a deterministic sample of them; this runs them all. Run from
the repository root:

    PYTHONPATH=src python3 bench/security_sweep.py [--class CLASS] [--match TEXT] [-v]

Prints one line per failing case and a count per class; exit 1 when any case fails."""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import robust_security as rs  # noqa: E402
import robust_security_outputs as rso  # noqa: E402
from _pytest.monkeypatch import MonkeyPatch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--class", dest="cls", choices=rs.CLASSES)
    ap.add_argument("--match", default="")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--races", type=int, default=5, help="repetitions of each writer race (concurrency)")
    args = ap.parse_args()
    cases = [c for c in rs.all_cases() if (not args.cls or c.cls == args.cls) and args.match in c.id]
    ran, failed, secs = Counter(), Counter(), Counter()
    for case in cases:
        root = Path(tempfile.mkdtemp(prefix="specdeploy-sweep-"))
        mp = MonkeyPatch()
        t0 = time.perf_counter()
        try:
            rs.run(case, root, mp)
            if args.v:
                print(f"ok   {case.cls}/{case.id}")
        except AssertionError as exc:
            failed[case.cls] += 1
            print(f"FAIL {case.cls}/{case.id}: {str(exc).splitlines()[0][:300]}", flush=True)
        finally:
            mp.undo()
            rs.close_peers()
            rso.release_locks()
            shutil.rmtree(root, ignore_errors=True)
            ran[case.cls] += 1
            secs[case.cls] += time.perf_counter() - t0
    extra = []  # what runs as real processes: system paths in a private mount namespace, writers racing
    if not args.cls or args.cls == "output-targets":
        if rso.namespace_problem() is None:
            extra += [("output-targets", f"system-{w}-{t}", lambda tmp, c=(w, t, a): rso.system_case(*c, tmp))
                      for w, t, a in rso.system_cases()]
        else:
            print(f"system paths not run: no private mount namespace ({rso.namespace_problem()})")
    if not args.cls or args.cls == "concurrency":
        extra += [("concurrency", f"race-{w}-{s}-{i}", lambda tmp, c=(w, s): rso.race(*c, tmp))
                  for w in sorted(rso.RACES) for s in ("absent", "own") for i in range(args.races)]
    for cls, name, fn in extra:
        if args.match not in name:
            continue
        tmp = Path(tempfile.mkdtemp(prefix="specdeploy-sweep-"))
        t0 = time.perf_counter()
        try:
            fn(tmp)
            if args.v:
                print(f"ok   {cls}/{name}")
        except AssertionError as exc:
            failed[cls] += 1
            print(f"FAIL {cls}/{name}: {str(exc).splitlines()[0][:300]}", flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            ran[cls] += 1
            secs[cls] += time.perf_counter() - t0
    rs.rc.cleanup_template()
    for cls in rs.CLASSES:
        if ran[cls]:
            print(f"{cls:18s} {ran[cls]:4d} cases, {failed[cls]:3d} failed, {secs[cls]:6.1f} s")
    print(f"security sweep: {sum(ran.values())} cases, {sum(failed.values())} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
