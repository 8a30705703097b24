"""The acceptance oracle's whole sweep: every variant (testing/oracle_variants.py, or with ``--set mla`` the MLA
heads of testing/oracle_mla.py) served by the real vLLM CPU build of a release, the engine's accepted tokens per
draft position recorded in tests/data/drafters/oracle/vllm-<release>[-mla].json, and the doctor's verdict on each
printed beside it (agree, excluded as recorded, or differ). Variants whose only errors `drafter convert` repairs
are converted and served again: the record says what the converted pair measured.

    python bench/drafter_oracle.py 0.16.0 0.32.0 [--only NAME ...] [--no-write] [--resume] [--set mla]

On two shared cores: 0.16.0's 211 variants took 27 min, a refused variant restarts the driver (imports again);
the suite's tests re-measure a rotating sample and hold the doctor to the whole record
(tests/unit/drafter/test_oracle_record.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specdeploy.testing import oracle, oracle_mla  # noqa: E402


def _set(which: str | None):
    """(variants, drafters builder, measure, doctor pair writer) of a variant set."""
    if which == "mla":
        from specdeploy.testing import oracle_mla as m
        return m.variants(), m.drafters, m.measure
    from specdeploy.testing.oracle_variants import variants
    return variants(), oracle.drafters, oracle.measure


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("versions", nargs="+")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--set", choices=["mla"], help="the MLA heads (oracle_mla.py) instead of the Llama heads")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--resume", action="store_true", help="keep the recorded rows of unchanged variants")
    ap.add_argument("--timeout", type=float, default=6 * 3600, help="seconds for one release's sweep")
    ap.add_argument("--max-rss-mib", type=int, default=5120, help="a driver restarts past this resident memory")
    a = ap.parse_args(argv)
    every, build, measure = _set(a.set)
    vs = [v for v in every if not a.only or v.name in a.only]
    say = lambda m: print(f"[oracle] {m}", file=sys.stderr, flush=True)  # noqa: E731
    t, dirs = build(vs, say)
    _, write_pair = oracle_mla.variant_set(a.set)
    for version in a.versions:
        t0 = time.time()
        path = oracle.record_path(version, a.set)
        kept: dict = {}
        if a.resume and path.is_file():  # rows measured before for the same pairs (of every variant: --only
            old = json.loads(path.read_text())["variants"]  # measures the named ones and keeps the others)
            kept = {v.name: old[v.name] for v in every
                    if v.name in old and old[v.name]["fingerprint"] == v.fingerprint()
                    and not (a.only and v.name in a.only)}

        def record(got, kept=kept, version=version, t0=t0):
            rec = oracle.make_record(version, vs, got, time.time() - t0, a.set, {v.name for v in every})
            rec["variants"] = {**kept, **rec["variants"]}
            rec["complete"] = set(rec["variants"]) == {v.name for v in every}
            return rec

        def partial(got, path=path):
            if not a.no_write:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record(got), indent=1, sort_keys=True) + "\n")
        todo = {n: p for n, p in dirs.items() if n not in kept}
        got = measure(version, t, todo, progress=say, on_batch=partial, timeout=a.timeout,
                      max_rss_mib=a.max_rss_mib)
        secs = time.time() - t0
        rec = record(got)
        with tempfile.TemporaryDirectory() as tmp:
            conv = oracle.convert_and_measure(version, t, dirs, vs, Path(tmp), progress=say, measure_fn=measure,
                                              timeout=a.timeout, max_rss_mib=a.max_rss_mib)
        for name, row in conv.items():
            if name in rec["variants"]:
                rec["variants"][name]["converted"] = row
        counts: dict[str, int] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for v in vs:
                row = rec["variants"].get(v.name)
                if row is None:
                    continue
                tt, d = write_pair(v, Path(tmp))
                doc = oracle.doctor(d, tt, version)
                row["doctor"] = doc["errors"]
                j = oracle.judge(v.name, version, doc["errors"], row["verdict"])
                counts[j] = counts.get(j, 0) + 1
                print(f"{version} {j:8} {v.name:40} oracle {row['verdict']:9} {row['rate0']} doctor "
                      f"{doc['errors'] or 'ok'}" + (f" converted {row['converted'].get('verdict')}"
                                                    if 'converted' in row else ""))
        print(f"vLLM {version}{' ' + a.set if a.set else ''}: {len(vs)} variants in {secs:.0f} s: {counts}")
        if not a.no_write:
            path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
