"""The doctor held to the acceptance oracle's measured records (tests/data/drafters/oracle/vllm-<release>*.json,
written by bench/drafter_oracle.py from the real engine): on every recorded variant the doctor finds an error
exactly where the engine's acceptance collapsed (or the engine refused the pair) and none where it held, on the
model runner that measured it; a recorded exclusion must still differ exactly as recorded. The pairs are written
header-only (configs, tensor names and shapes, the real d2t/t2d): the doctor's whole input. Seconds, no engine."""
from __future__ import annotations

import json
import time

import pytest

from specdeploy.testing import oracle, oracle_mla
from specdeploy.testing.oracle_variants import family, variants

RECORDS = sorted(oracle.RECORDS.glob("vllm-*.json"))  # exclusions.json beside them
RELEASES = ("0.16.0", "0.32.0")  # the pinned releases, both measured in full
MIN_VARIANTS = 200


def _load(p):
    return json.loads(p.read_text())


def test_both_pinned_releases_are_recorded_in_full():
    names = {v.name for v in variants()}
    assert len(names) >= MIN_VARIANTS
    by_release = {(r["release"], r.get("set")): r for r in map(_load, RECORDS)}
    for release in RELEASES:
        rec = by_release.get((release, None))
        assert rec is not None, f"no record of vLLM {release}: run python bench/drafter_oracle.py {release}"
        assert rec["runner"] == oracle.RUNNER and rec["complete"], (release, rec.get("complete"))
        assert set(rec["variants"]) == names and len(rec["variants"]) >= MIN_VARIANTS, release
    for rec in by_release.values():
        vs, _ = oracle_mla.variant_set(rec)
        if rec.get("complete"):
            assert set(rec["variants"]) == set(vs), (rec["release"], rec.get("set"))


def _cases():
    for p in RECORDS:
        rec = _load(p)
        for name in sorted(rec["variants"]):
            yield pytest.param(rec, name, id=f"{p.stem.removeprefix('vllm-')}-{name}")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("oracle-pairs")


def _base(name: str) -> str:
    head = name.split("-", 1)[0]
    return f"{head}-aux-both" if head in ("A", "D", "S", "E", "N", "F") else f"{head}-as-trained"


@pytest.mark.parametrize("rec,name", list(_cases()))
def test_doctor_agrees_with_measured_acceptance(rec, name, root):
    release = rec["release"]
    vs, write_sparse_pair = oracle_mla.variant_set(rec)
    row = rec["variants"][name]
    assert name in vs, f"{name} is recorded but no longer generated: re-run bench/drafter_oracle.py {release}"
    v = vs[name]
    assert v.fingerprint() == row["fingerprint"], \
        f"{name} changed since it was measured: re-run bench/drafter_oracle.py {release}"
    t, d = write_sparse_pair(v, root)
    got = oracle.doctor(d, t, release)
    verdict = oracle.judge(name, release, got["errors"], row["verdict"])
    assert verdict in ("agree", "excluded"), (
        f"{release} {name}: the engine measured {row['verdict']} (position 0: {row['rate0']}, "
        f"{row.get('error') or ''}), the doctor says {got['errors'] or 'ok'} {got['messages']}")
    base = rec["variants"].get(_base(name), {})
    if got["errors"] and v.defect and verdict == "agree" and base.get("verdict") == "holds":
        assert set(got["errors"]) & set(v.defect), (name, got["errors"], v.defect)  # the error names the defect
    conv = row.get("converted")
    if conv and conv.get("verdict") not in (None, "not converted") and family(name) is None:
        assert conv["verdict"] == "holds", (name, conv)  # convert's output reaches full acceptance


def test_every_repairable_error_was_converted_and_measured():
    """A recorded variant whose doctor errors are all ones convert repairs, and whose defect shows in the files,
    carries the converted pair's measurement."""
    from specdeploy.drafter import check, is_convertible
    for p in RECORDS:
        rec = _load(p)
        if not rec.get("complete"):
            continue
        vs, write_sparse_pair = oracle_mla.variant_set(rec)
        import tempfile
        from pathlib import Path
        with tempfile.TemporaryDirectory() as tmp:
            for name, row in rec["variants"].items():
                if family(name) is not None or row["verdict"] == "holds":
                    continue
                t, d = write_sparse_pair(vs[name], Path(tmp))
                errs = check(d, t, "vllm", rec["release"], runner=oracle.RUNNER).errors
                if errs and all(is_convertible(f) for f in errs):
                    assert row.get("converted", {}).get("verdict") == "holds", (p.stem, name, row.get("converted"))


def test_an_exclusion_that_starts_agreeing_fails():
    """judge() says 'differ' when a recorded exclusion no longer differs as recorded."""
    key = ("A-aux-both", "9.9.9")
    oracle.EXCLUDED[key] = oracle.Exclusion(("aux layers",), "holds", "test")
    try:
        assert oracle.judge("A-aux-both", "9.9.9", ["aux layers"], "holds") == "excluded"
        assert oracle.judge("A-aux-both", "9.9.9", [], "holds") == "differ"        # now agrees
        assert oracle.judge("A-aux-both", "9.9.9", ["d2t"], "holds") == "differ"   # differs otherwise
    finally:
        del oracle.EXCLUDED[key]


def test_every_exclusion_is_of_an_invisible_family_and_recorded():
    data = json.loads((oracle.RECORDS / "exclusions.json").read_text())
    rows = {(r["release"], r.get("set")): r for r in map(_load, RECORDS)}
    for x in data["exclusions"]:
        assert family(x["name"]) == x["why"] and x["why"] in data["why"], x
        rec = rows[(x["release"], x.get("set"))]
        assert rec["variants"][x["name"]]["verdict"] == x["oracle"], x


def test_a_check_stays_under_100_ms(root):
    from specdeploy.testing.oracle_variants import by_name, write_sparse_pair
    vs = by_name()
    worst = 0.0
    for name in ("A-aux-both", "N-nbf-nested", "X-as-trained", "A-d2t-shifted", "V-as-trained"):
        t, d = write_sparse_pair(vs[name], root)
        oracle.doctor(d, t, "0.32.0")  # imports warm
        t0 = time.perf_counter()
        for _ in range(5):
            oracle.doctor(d, t, "0.32.0")
        worst = max(worst, (time.perf_counter() - t0) / 5 * 1000)
    assert worst < 100, f"{worst:.1f} ms"
