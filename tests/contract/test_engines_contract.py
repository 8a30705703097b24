"""Contract tests: every flag, speculative-config key and metric name specdeploy uses exists in the real
upstream source of each tested engine version (downloaded at test time, sha256-verified, cached)."""
from __future__ import annotations

import pytest
from packaging.version import Version

from specdeploy.engines import upstream
from specdeploy.engines import Span, get_adapter
from specdeploy.engines import sglang as sg
from specdeploy.engines import vllm as vl
from specdeploy.hostvars.schema import validate_host

from .spans import endpoints
from .upstream_facts import (
    exposed,
    sglang_flags,
    sglang_metric_names,
    vllm_flags,
    vllm_metric_names,
    vllm_spec_keys,
)

pytestmark = pytest.mark.contract

# The first and last release of every span the adapters' tables claim (plus 0.17.1, the last patched vLLM).
VLLM_TESTED = sorted(set(endpoints("vllm")) | {"0.17.1"}, key=Version)
SGLANG_TESTED = endpoints("sglang")


def _host(engine, version, **kw):
    base = {"specdeploy_engine": engine, "specdeploy_engine_version": version,
            "specdeploy_hardware": "rtx_pro_6000_pcie", "specdeploy_model_path": "/models/kimi",
            "specdeploy_spec_enabled": True, "specdeploy_drafter_path": "/models/drafter",
            "specdeploy_expert_parallel": True, "specdeploy_max_model_len": 65536,
            "specdeploy_api_key_file": "/tmp/key"}
    if not get_adapter(engine, version).capabilities.get("config_file", Span()).contains(version):
        base["specdeploy_api_key_file"] = None  # refused where the key could only go on the command line
    base.update(kw)
    return validate_host("contract", base)


@pytest.mark.parametrize("version", VLLM_TESTED)
def test_vllm_flags_exist(version):
    root = upstream.source("vllm", version)
    flags = vllm_flags(root)
    adapter = get_adapter("vllm", version)
    claimed = [f for f in vl.FLAGS if adapter.flag_exists(f)]
    missing = [f for f in claimed if f not in flags]
    assert not missing, f"vLLM {version} lacks flags: {missing}"
    argv = adapter.command(_host("vllm", version)).argv
    emitted = [a for a in argv if a.startswith("--")]
    assert [f for f in emitted if f not in flags] == [], f"vLLM {version}"
    assert "--speculative-config" in emitted and "--attention-backend" in emitted


@pytest.mark.parametrize("version", VLLM_TESTED)
def test_vllm_speculative_config_keys(version):
    keys = vllm_spec_keys(upstream.source("vllm", version))
    for key, span in vl.SPEC_KEYS.items():
        if span.contains(version):
            assert key in keys, f"vLLM {version}: SpeculativeConfig has no '{key}'"
        elif span.until and Version(version) >= Version(span.until):
            assert key not in keys, f"vLLM {version}: '{key}' is still there (table says removed in {span.until})"
    emitted = get_adapter("vllm", version).spec_config(_host("vllm", version), "/d")
    assert set(emitted) <= keys


@pytest.mark.parametrize("version", VLLM_TESTED)
def test_vllm_metric_names(version):
    defined = vllm_metric_names(upstream.source("vllm", version))
    missing = [n for n in get_adapter("vllm", version).metric_names() if not exposed(n, defined)]
    assert not missing, f"vLLM {version} does not define {missing}"


@pytest.mark.parametrize("version", VLLM_TESTED)
def test_vllm_kimi_capability_matches_source(version):
    root = upstream.source("vllm", version)
    spec_py = (root / "vllm/config/speculative.py").read_text()
    ds = (root / "vllm/model_executor/models/deepseek_v2.py").read_text()
    has_whitelist = "aux_hidden_states_supported" in spec_py or "eagle3_target_supported" in spec_py
    assert get_adapter("vllm", version).has("eagle3_target_whitelist") == has_whitelist
    whitelist_ok = not has_whitelist or '"kimi_k2"' in spec_py
    upstream_support = whitelist_ok and "SupportsEagle3" in ds
    assert get_adapter("vllm", version).has("kimi_eagle3_upstream") == upstream_support


@pytest.mark.parametrize("version", SGLANG_TESTED)
def test_sglang_flags_metrics_and_kimi_support(version):
    root = upstream.source("sglang", version)
    flags = sglang_flags(root)
    adapter = get_adapter("sglang", version)
    missing = [f for f in sg.FLAGS if adapter.flag_exists(f) and f not in flags]
    assert not missing, f"SGLang {version} lacks flags: {missing}"
    argv = adapter.command(_host("sglang", version)).argv
    assert [a for a in argv if a.startswith("--") and a not in flags] == []
    assert "--tp-size" in argv and "--tp" not in argv
    assert ("--config" in argv) == adapter.has("config_file")
    defined = sglang_metric_names(root)
    assert [n for n in adapter.metric_names() if not exposed(n, defined)] == []
    assert [n for n in adapter.metrics.all_names() - adapter.metric_names() if exposed(n, defined)] == []
    kimi_file = root / "sglang/srt/models/kimi_k25.py"
    kimi = kimi_file.read_text() if kimi_file.is_file() else ""
    got = adapter.eagle3_target(["KimiK25ForConditionalGeneration"], "kimi_k25")[0]
    assert got is None or got == ("set_eagle3_layers_to_capture" in kimi)
