"""The doctor held to the acceptance oracle's measured record (tests/data/drafters/oracle/vllm-<release>.json,
written by bench/drafter_oracle.py from the real engine): on every recorded variant the doctor finds an error
exactly where the engine's acceptance collapsed (or the engine refused the pair) and none where it held, on the
model runner that measured it; a recorded exclusion must still differ exactly as recorded. The pairs are written
header-only (configs, tensor names and shapes, the real d2t/t2d): the doctor's whole input. Seconds, no engine."""
from __future__ import annotations

import json
import time

import pytest

from specdeploy.testing import oracle
from specdeploy.testing.oracle_variants import by_name, variants, write_sparse_pair

RECORDS = sorted(oracle.RECORDS.glob("vllm-*.json"))  # exclusions.json beside them


def test_records_exist_and_cover_the_variants():
    # 0.32.0's record is written by `python bench/drafter_oracle.py 0.32.0` (not yet measured in full here)
    assert {p.stem for p in RECORDS} >= {"vllm-0.16.0"}
    names = {v.name for v in variants()}
    assert len(names) >= 200
    for p in RECORDS:
        rec = json.loads(p.read_text())
        assert rec["runner"] == oracle.RUNNER and rec["variants"]
        if rec.get("complete"):
            assert set(rec["variants"]) == names, p


def _cases():
    for p in RECORDS:
        rec = json.loads(p.read_text())
        for name in sorted(rec["variants"]):
            yield pytest.param(rec["release"], name, rec["variants"][name], id=f"{rec['release']}-{name}")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle-pairs")
    vs = by_name()
    return root, vs


@pytest.mark.parametrize("release,name,row", list(_cases()))
def test_doctor_agrees_with_measured_acceptance(release, name, row, pairs, tmp_path):
    root, vs = pairs
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
    if got["errors"] and v.defect and verdict == "agree":
        assert set(got["errors"]) & set(v.defect), (name, got["errors"], v.defect)
    conv = row.get("converted")
    if conv and "verdict" in conv and conv["verdict"] != "not converted":
        assert conv["verdict"] == "holds", (name, conv)  # convert's output reaches full acceptance


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


def test_a_check_stays_under_100_ms(pairs):
    root, vs = pairs
    worst = 0.0
    for name in ("A-aux-both", "N-nbf-nested", "X-as-trained", "A-d2t-shifted", "V-as-trained"):
        t, d = write_sparse_pair(vs[name], root)
        oracle.doctor(d, t, "0.32.0")  # imports warm
        t0 = time.perf_counter()
        for _ in range(5):
            oracle.doctor(d, t, "0.32.0")
        worst = max(worst, (time.perf_counter() - t0) / 5 * 1000)
    assert worst < 100, f"{worst:.1f} ms"
