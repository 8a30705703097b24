"""The acceptance oracle re-measured on the real vLLM CPU builds: a deterministic sample of the recorded variants,
rotating with the day (testing.oracle.sample), served again by the release; the engine must measure what the
record says (a drifting record fails here), the doctor must agree with it, and a variant that `drafter convert`
repairs reaches full acceptance once converted. One engine process per release serves the sample and the
converted pair (a refused variant goes last: it ends the process); the MLA heads are sampled on 0.32.0 (their
DeepSeek target is bfloat16, another process). The whole sweep is bench/drafter_oracle.py; the doctor is held
to every recorded variant in tests/unit/drafter/test_oracle_record.py."""
from __future__ import annotations

import pytest

from specdeploy.drafter import convert
from specdeploy.testing import oracle, oracle_mla, realrun

pytestmark = pytest.mark.realengine

N = 4  # recorded variants per release and run
RELEASES = ("0.16.0", "0.32.0")
# A variant whose only errors convert repairs, per release: it collapses as exported and holds converted.
CONVERTED = {"0.16.0": "A-aux-v2-layer-ids-key", "0.32.0": "N-nbf-missing"}


@pytest.fixture(scope="module", autouse=True)
def tiny_cache():
    realrun.tiny_cache_from_env()


def _ordered(names: list[str], rec: dict) -> list[str]:
    """The sample with at most one refused variant, last (a refusal ends the engine process)."""
    ok = [n for n in names if rec["variants"][n]["verdict"] != "refused"]
    refused = [n for n in names if rec["variants"][n]["verdict"] == "refused"]
    return ok + refused[:1]


def _check(release: str, rec: dict, names: list[str], got: dict, vs: dict, dirs: dict, t):
    for n in names:
        row = rec["variants"][n]
        assert vs[n].fingerprint() == row["fingerprint"]
        assert oracle.verdict(got[n]) == row["verdict"], (release, n, got[n], row)
        d = oracle.doctor(dirs[n], t, release)
        assert oracle.judge(n, release, d["errors"], row["verdict"]) in ("agree", "excluded"), (n, d, row)
        if row["verdict"] == "holds":  # the engine's own counters: position 0 accepted, position 1 never
            assert got[n]["per_pos"][0] >= oracle.HOLDS * got[n]["drafts"]


@pytest.mark.parametrize("release", RELEASES)
def test_recorded_acceptance_is_what_the_engine_measures(release, tmp_path):
    rec = oracle.load_record(release)
    vs, _ = oracle_mla.variant_set(rec)
    conv = CONVERTED[release]
    names = _ordered(oracle.sample([n for n in rec["variants"] if n in vs and n != conv], release, N), rec)
    t, dirs = oracle.drafters([vs[n] for n in names + [conv]])
    before = oracle.doctor(dirs[conv], t, release)
    assert before["errors"]
    out = tmp_path / "converted"
    meta = convert(dirs[conv], t, "vllm", out, release)
    assert meta["check"]["ok"] and meta["actions"]
    cases = {conv: dirs[conv], conv + "-converted": out, **{n: dirs[n] for n in names}}
    got = oracle.measure(release, t, cases, timeout=600)
    assert oracle.verdict(got[conv]) in ("collapses", "refused"), got[conv]
    assert oracle.verdict(got[conv + "-converted"]) == "holds", got[conv + "-converted"]
    _check(release, rec, names, got, vs, dirs, t)


def test_mla_heads_on_0_32_0():
    rec = oracle.load_record("0.32.0", "mla")
    vs = oracle_mla.by_name()
    names = _ordered(["M-as-trained"] + oracle.sample([n for n in rec["variants"] if n != "M-as-trained"],
                                                     "0.32.0-mla", 2), rec)
    t, dirs = oracle_mla.drafters([vs[n] for n in names])
    got = oracle_mla.measure("0.32.0", t, dirs, timeout=600)
    _check("0.32.0", rec, names, got, vs, dirs, t)
