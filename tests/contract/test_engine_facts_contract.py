"""The facts the simulator checks command lines against (src/specdeploy/engines/facts.json) are what the real
releases say: re-extracted from the downloaded sources, and equal to what the independent contract readers in
upstream_facts.py find."""
from __future__ import annotations

import json

import pytest

from specdeploy.engines import upstream
from specdeploy.testing import engine_facts

from .upstream_facts import sglang_flags, vllm_flags, vllm_spec_keys

pytestmark = pytest.mark.contract

RECORDED = [(e, v) for e, vs in json.loads(engine_facts.FACTS_FILE.read_text()).items() for v in vs]


@pytest.mark.parametrize("engine,version", RECORDED)
def test_recorded_facts_match_the_release(engine, version):
    root = upstream.source(engine, version)
    fresh = engine_facts.extract(engine, root)
    rec = engine_facts.recorded(engine, version)
    assert {k: sorted(v) for k, v in rec.items()} == fresh, \
        f"refresh: python -m specdeploy.testing.engine_facts record {engine} {version}"
    if engine == "vllm":
        assert rec["flags"] == vllm_flags(root) and rec["spec_keys"] == vllm_spec_keys(root)
        assert {"eagle3", "ngram"} <= rec["spec_methods"] and "bogus" not in rec["spec_methods"]
    else:
        assert rec["flags"] == sglang_flags(root)
        assert {"EAGLE", "EAGLE3"} <= rec["spec_methods"]
