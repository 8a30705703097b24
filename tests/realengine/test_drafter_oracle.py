"""The acceptance oracle re-measured on the real vLLM CPU builds: a deterministic sample of the recorded variants,
rotating with the day (testing.oracle.sample), served again by the release; the engine must measure what the
record says (a drifting record fails here), the doctor must agree with it, and a variant that `drafter convert`
repairs reaches full acceptance once converted. The whole sweep is bench/drafter_oracle.py; the doctor is held
to every recorded variant in tests/unit/drafter/test_oracle_record.py."""
from __future__ import annotations

import pytest

from specdeploy.drafter import convert
from specdeploy.testing import oracle, realrun
from specdeploy.testing.oracle_variants import by_name

pytestmark = pytest.mark.realengine

N = 5  # variants per release and run: about a minute of two cores per release


@pytest.fixture(scope="module", autouse=True)
def tiny_cache():
    realrun.tiny_cache_from_env()


RECORDED = sorted(p.stem.removeprefix("vllm-") for p in oracle.RECORDS.glob("vllm-*.json"))


def test_a_release_is_recorded():
    assert "0.16.0" in RECORDED


@pytest.mark.parametrize("release", RECORDED)
def test_recorded_acceptance_is_what_the_engine_measures(release, tmp_path):
    rec = oracle.load_record(release)
    vs = by_name()
    names = oracle.sample([n for n in rec["variants"] if n in vs], release, N)
    assert len(names) == min(N, len(rec["variants"]))
    t, dirs = oracle.drafters([vs[n] for n in names])
    got = oracle.measure(release, t, dirs, timeout=900)
    for n in names:
        row = rec["variants"][n]
        assert vs[n].fingerprint() == row["fingerprint"]
        assert oracle.verdict(got[n]) == row["verdict"], (n, got[n], row)
        d = oracle.doctor(dirs[n], t, release)
        assert oracle.judge(n, release, d["errors"], row["verdict"]) in ("agree", "excluded"), (n, d, row)
        if row["verdict"] == "holds":  # the engine's own counters: position 0 accepted, position 1 never
            assert got[n]["per_pos"][0] >= oracle.HOLDS * got[n]["drafts"]


@pytest.mark.parametrize("release,name", [("0.32.0", "N-nbf-missing"), ("0.16.0", "A-aux-v2-layer-ids-key")])
def test_converted_pair_reaches_full_acceptance(release, name, tmp_path):
    """A variant whose only errors convert repairs: the engine collapses on it as exported and holds on the
    converted copy."""
    v = by_name()[name]
    t, dirs = oracle.drafters([v])
    before = oracle.doctor(dirs[name], t, release)
    assert before["errors"]
    out = tmp_path / "converted"
    meta = convert(dirs[name], t, "vllm", out, release)
    assert meta["check"]["ok"] and meta["actions"]
    got = oracle.measure(release, t, {name: dirs[name], name + "-converted": out}, timeout=600)
    assert oracle.verdict(got[name]) in ("collapses", "refused"), got[name]
    assert oracle.verdict(got[name + "-converted"]) == "holds", got[name + "-converted"]
