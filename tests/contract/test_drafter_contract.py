"""Contract tests: the drafter doctor's engine facts (engines/{vllm,sglang}.py DRAFTER) against the real loader
code of each engine release (vLLM sdists, SGLang wheels; downloaded at test time, sha256-verified, cached)."""
from __future__ import annotations

import pytest
from packaging.version import Version

from specdeploy.engines import upstream
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


# --- the head each release builds (DRAFTER["switches"] and the loader facts read by drafter/head.py) ----------
def _agrees(pair, version, present: bool, what):
    yes, no = pair
    if yes is not None and yes.contains(version):
        assert present, (what, version, "claimed read")
    if no is not None and no.contains(version):
        assert not present, (what, version, "claimed not read")


def _load_weights_returns(text: str, cls: str) -> bool:
    """Whether cls.load_weights returns a value (the loader then checks every parameter was loaded)."""
    import ast
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "load_weights":
                    return any(isinstance(r, ast.Return) and r.value is not None for r in ast.walk(fn))
    raise AssertionError(f"no {cls}.load_weights")


@pytest.mark.parametrize("version", VLLM_READ)
def test_vllm_head_facts(version):
    vllm = upstream.source("vllm", version) / "vllm"
    f = vl.DRAFTER
    llama = _text(vllm / "model_executor/models/llama_eagle3.py")
    algos = _text(vllm / "transformers_utils/configs/speculators/algos.py")
    sw = f["switches"]
    _agrees(sw["use_aux_hidden_state"]["eagle_config"], version, '"use_aux_hidden_state" in eagle_config' in llama,
            "use_aux_hidden_state")
    _agrees(sw["norm_before_fc"]["top"], version, 'getattr(self.config, "norm_before_fc", False)' in llama, "nbf top")
    _agrees(sw["norm_before_fc"]["eagle_config"], version, '"norm_before_fc", getattr(self.config' in llama,
            "nbf eagle_config")
    for key in ("norm_before_fc", "fc_norm", "norm_output"):
        _agrees(sw[key]["speculators"], version, f'pre_trained_config["{key}"]' in algos, f"speculators {key}")
    for key in ("fc_norm", "norm_output"):
        _agrees(sw[key]["top"], version, f'getattr(self.config, "{key}", False)' in llama, key)
    assert ("len(layer_ids) if layer_ids else 3" in llama) == f["aux_count_from_ids"].contains(version)
    assert ('getattr(config, "attention_bias", False)' in llama) == f["attention_bias"].contains(version)
    utils = _text(vllm / "model_executor/models/utils.py")
    raises = "param = params_dict[name]" in llama or ("AutoWeightsLoader(self)" in llama
                                                     and "There is no module or parameter named" in utils)
    assert raises == f["unknown_tensor_raises"].contains(version)
    assert (not _load_weights_returns(llama, "Eagle3LlamaForCausalLM")) == \
        f["missing_tensor_uninitialised"].contains(version)
    assert ('skip_substrs.append("fc.")' in llama or 'orig_to_new_substr["fc."] = None' in llama) == \
        (not f["fc_always_built"])
    skips = 'skip_substrs.append("input_norm.")' in llama or 'orig_to_new_substr["input_norm."] = None' in llama
    assert skips == f["skips_unbuilt_input_norm"].contains(version)
    assert "tie_word_embeddings" not in llama


@pytest.mark.parametrize("version", [v for v in SGLANG_READ if Version(v) >= Version("0.5.11")])
def test_sglang_head_facts(version):
    srt = upstream.source("sglang", version) / "sglang" / "srt"
    f = sg.DRAFTER
    llama = _text(srt / "models/llama_eagle3.py")
    sw = f["switches"]
    runner = "".join(_text(p) for p in (srt / "model_executor").rglob("*.py"))
    _agrees(sw["use_aux_hidden_state"]["eagle_config"], version, '"use_aux_hidden_state", True' in runner, "aux")
    flat = "".join(llama.split())
    nbf = 'eagle_config.get("norm_before_fc",getattr(config,"norm_before_fc",False))' in flat
    for where in ("top", "eagle_config"):
        _agrees(sw["norm_before_fc"][where], version, nbf, f"nbf {where}")
    _agrees(sw["fc_norm"]["top"], version, 'getattr(config, "fc_norm"' in llama, "fc_norm")
    _agrees(sw["use_aux_norm"]["top"], version, '"use_aux_norm"' in llama, "use_aux_norm")
    _agrees(sw["norm_output"]["top"], version, 'getattr(config, "norm_output"' in llama, "norm_output")
    assert ("len(layer_ids) if layer_ids else 3" in llama) == f["aux_count_from_ids"].contains(version)
    assert ('"aux_norm_low": "fc_norm.0"' in llama) == f["legacy_aux_norm_names"].contains(version)
    assert ('bias=getattr(config, "bias", False)' in llama) == f["fc_bias_key"].contains(version)
    assert ("if param_name in params_dict" in llama) == f["unknown_tensor_dropped"].contains(version)
    assert (not _load_weights_returns(llama, "LlamaForCausalLMEagle3")) == \
        f["missing_tensor_uninitialised"].contains(version)
    assert ("use_aux_hidden_state" not in llama) == f["fc_always_built"]  # fc is built whatever the switch
    tied = "if self.config.tie_word_embeddings:" in llama and "self.lm_head = self.model.embed_tokens" in llama
    assert tied == f["tied_lm_head_is_embedding"].contains(version)


# --- EAGLE-3 target support (engines/eagle3_targets.py) -------------------------------------------------------
@pytest.mark.parametrize("engine,version", [("vllm", v) for v in vl.VLLM.eagle3_targets_read]
                         + [("sglang", v) for v in sg.SGLang.eagle3_targets_read])
def test_eagle3_target_table(engine, version):
    cls = vl.VLLM if engine == "vllm" else sg.SGLang
    archs, types = cls.eagle3_targets_from_source(upstream.source(engine, version))
    table = {a for a, span in cls.eagle3_targets.items() if span.contains(version)}
    assert archs == table, (sorted(archs - table), sorted(table - archs))
    wl = cls.eagle3_whitelist_span
    assert (types is not None) == (wl is not None and wl.contains(version))
    if types is not None:
        assert set(types) == {t for t, span in cls.eagle3_whitelist.items() if span.contains(version)}
