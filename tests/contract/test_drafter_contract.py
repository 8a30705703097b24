"""Contract tests: the drafter doctor's engine facts (engines/{vllm,sglang}.py DRAFTER) against the real loader
code of each engine release (vLLM sdists, SGLang wheels; downloaded at test time, sha256-verified, cached)."""
from __future__ import annotations

import pytest
from packaging.version import Version

from specdeploy import upstream
from specdeploy.engines import sglang as sg
from specdeploy.engines import vllm as vl

from .spans import _spans, endpoints

pytestmark = pytest.mark.contract

# The releases read when the tables were written, and the first and last release of every span in DRAFTER.
VLLM_READ = sorted({"0.16.0", "0.18.0", "0.22.0", "0.27.0", "0.33.0"} | set(endpoints("vllm", _spans(vl.DRAFTER, []))),
                   key=Version)
SGLANG_READ = sorted({"0.5.6", "0.5.11", "0.5.12", "0.5.13", "0.5.23"}
                     | set(endpoints("sglang", _spans(sg.DRAFTER, []))), key=Version)


def _text(path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


@pytest.mark.parametrize("version", VLLM_READ)
def test_vllm_drafter_facts(version):
    vllm = upstream.source("vllm", version) / "vllm"
    f = vl.DRAFTER
    registry = _text(vllm / "model_executor/models/registry.py")
    for arch, span in f["archs"].items():
        assert (f'"{arch}":' in registry) == span.contains(version), (arch, version)
    # method eagle3: X -> Eagle3X unless already Eagle3-named
    assert 'else f"Eagle3{arch}"' in _text(vllm / "transformers_utils/configs/eagle.py")
    base = _text(vllm / "transformers_utils/configs/speculators/base.py")
    assert '["verifier"]["name_or_path"]' in base and "transformer_layer_config" in base
    algos = _text(vllm / "transformers_utils/configs/speculators/algos.py")
    assert '"norm_before_residual", True' in algos
    assert ('"qwen3": "Eagle3Qwen3ForCausalLM"' in algos) == f["speculators_model_types"]["qwen3"].contains(version)
    runner = _text(vllm / "v1/worker/gpu_model_runner.py")
    reads_nested = 'eagle_config.get("eagle_aux_hidden_state_layer_ids")' in runner
    if f["aux_nested_read_as_is"].contains(version):
        assert reads_nested and "layer_ids = [i + 1" not in runner.split('eagle_config.get("eagle_aux')[1][:200]
    if f["aux_nested_ignored"].contains(version):
        assert not reads_nested
    llama = _text(vllm / "model_executor/models/llama_eagle3.py")
    assert "range(self.config.num_hidden_layers)" in llama and "midlayer." in llama
    proposer = "".join(_text(p) for p in (vllm / "v1/spec_decode").glob("*.py"))
    assert "_maybe_share_lm_head" in proposer and "has_own_lm_head" in proposer


@pytest.mark.parametrize("version", SGLANG_READ)
def test_sglang_drafter_facts(version):
    srt = upstream.source("sglang", version) / "sglang" / "srt"
    f = sg.DRAFTER
    llama = _text(srt / "models/llama_eagle3.py")
    assert "EntryClass = [LlamaForCausalLMEagle3]" in llama
    multi = f["llama_multi_layer"].contains(version)
    assert ('"midlayer": "layers.0"' in llama) == multi
    assert ("only supports 1 layer" in llama) == (not multi)
    assert ("load_lm_head_from_target = True" in llama) == \
        f["lm_head_from_target_without_draft_vocab_size"].contains(version)
    assert "norm_before_residual" not in llama
    mla = _text(srt / "models/kimi_k25_eagle3.py")
    assert ("EntryClass = [Eagle3DeepseekV2ForCausalLM]" in mla) == f["archs"]["Eagle3DeepseekV2ForCausalLM"].contains(
        version)
    if mla:
        assert "only supports 1 layer" in mla
    heuristic = "layer_ids[0] == 1" in _text(srt / "models/deepseek_v2.py")
    assert heuristic == f["aux_deepseek_heuristic"].contains(version)
