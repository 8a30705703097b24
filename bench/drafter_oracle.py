"""The acceptance oracle's whole sweep: every variant (testing/oracle_variants.py) served by the real vLLM CPU
build of a release, the engine's accepted tokens per draft position recorded in
tests/data/drafters/oracle/vllm-<release>.json, and the doctor's verdict on each printed beside it (agree,
excluded as recorded, or differ). Variants whose only errors `drafter convert` repairs are converted and served
again: the record says what the converted pair measured.

    python bench/drafter_oracle.py 0.16.0 0.32.0 [--only NAME ...] [--no-write]

Minutes per release on two cores (the engine starts once per variant); the suite's tests re-measure a rotating
sample and hold the doctor to the whole record (tests/unit/drafter/test_oracle_record.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specdeploy.testing import oracle  # noqa: E402
from specdeploy.testing.oracle_variants import variants  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("versions", nargs="+")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--resume", action="store_true", help="keep the recorded rows of unchanged variants")
    a = ap.parse_args(argv)
    vs = [v for v in variants() if not a.only or v.name in a.only]
    say = lambda m: print(f"[oracle] {m}", file=sys.stderr, flush=True)  # noqa: E731
    t, dirs = oracle.drafters(vs, say)
    for version in a.versions:
        t0 = time.time()
        path = oracle.record_path(version)
        kept: dict = {}
        if a.resume and path.is_file():  # rows measured before for the same pairs
            old = json.loads(path.read_text())["variants"]
            kept = {v.name: old[v.name] for v in vs if v.name in old and old[v.name]["fingerprint"] == v.fingerprint()}

        def partial(got, kept=kept, version=version, t0=t0, path=path):
            if a.no_write:
                return
            rec = oracle.make_record(version, vs, got, time.time() - t0)
            rec["variants"] = {**kept, **rec["variants"]}
            rec["complete"] = len(rec["variants"]) == len(variants())
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        todo = {n: p for n, p in dirs.items() if n not in kept}
        got = oracle.measure(version, t, todo, progress=say, on_batch=partial)
        secs = time.time() - t0
        rec = oracle.make_record(version, vs, got, secs)
        rec["variants"] = {**kept, **rec["variants"]}
        rec["complete"] = len(rec["variants"]) == len(variants())
        with tempfile.TemporaryDirectory() as tmp:
            conv = oracle.convert_and_measure(version, t, dirs, vs, Path(tmp), progress=say)
        for name, row in conv.items():
            if name in rec["variants"]:
                rec["variants"][name]["converted"] = row
        counts: dict[str, int] = {}
        for v in vs:
            row = rec["variants"].get(v.name)
            if row is None:
                continue
            d = oracle.doctor(dirs[v.name], t, version)
            row["doctor"] = d["errors"]
            j = oracle.judge(v.name, version, d["errors"], row["verdict"])
            counts[j] = counts.get(j, 0) + 1
            print(f"{version} {j:8} {v.name:40} oracle {row['verdict']:9} {row['rate0']} doctor "
                  f"{d['errors'] or 'ok'}" + (f" converted {row['converted']['verdict']}" if 'converted' in row
                                              else ""))
        print(f"vLLM {version}: {len(vs)} variants in {secs:.0f} s: {counts}")
        if not a.no_write:
            p = oracle.record_path(version)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
