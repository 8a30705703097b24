"""Contract tests of the serving layouts: every flag a rank's command line carries exists in the pinned release's
sources, for the first and last release of every span, leader and followers alike; and SGLang's DP-attention
spelling changes where the adapter says."""
from __future__ import annotations

import pytest
from packaging.version import Version

from specdeploy.engines import get_adapter, upstream
from specdeploy.hostvars.schema import validate_host
from specdeploy.topology import Member, resolve

from .spans import endpoints
from .upstream_facts import sglang_flags, vllm_flags

pytestmark = pytest.mark.contract


def _group(engine, version, layout, n=2):
    v = {"specdeploy_engine": engine, "specdeploy_engine_version": version, "specdeploy_hardware": "h200_nvl8",
         "specdeploy_model_path": "/models/kimi", "specdeploy_topology": layout, "specdeploy_group": "g",
         "specdeploy_dist_interface": "ib0", "specdeploy_router": "sglang-router"}
    roles = ["prefill", "decode"] if layout == "pd" else [None] * n
    members = [Member(f"h{i}", f"10.0.0.{i + 1}", validate_host(f"h{i}", {**v, "specdeploy_pd_role": r}
                                                                 if r else v)) for i, r in enumerate(roles)]
    ranks = resolve(members)
    adapter = get_adapter(engine, version)
    return [adapter.command(m.hv, None, ranks[m.name]).argv for m in members]


def _layouts(engine, version):
    a = get_adapter(engine, version)
    return [k for k, s in a.layouts.items() if k != "single" and s.contains(version)]


@pytest.mark.parametrize("version", endpoints("vllm"))
def test_vllm_rank_flags_exist(version):
    flags = vllm_flags(upstream.source("vllm", version))
    for layout in _layouts("vllm", version):
        for argv in _group("vllm", version, layout, 3):
            missing = [a for a in argv if a.startswith("--") and a not in flags]
            assert not missing, f"vLLM {version} {layout}: {missing}"


@pytest.mark.parametrize("version", sorted(set(endpoints("sglang")) | {"0.5.21"}, key=Version))
def test_sglang_rank_flags_exist_and_dp_attention_is_spelled_per_release(version):
    flags = sglang_flags(upstream.source("sglang", version))
    for layout in _layouts("sglang", version):
        for argv in _group("sglang", version, layout, 3):
            missing = [a for a in argv if a.startswith("--") and a not in flags]
            assert not missing, f"SGLang {version} {layout}: {missing}"
    assert ("--attn-dp-size" in flags) == get_adapter("sglang", version).has("attn_dp_size"), version
