"""Contract tests: the MLA EAGLE-3 head's facts (DRAFTER["mla"] in engines/vllm_tables.py and engines/sglang.py,
read by drafter/mla.py and drafter/head.py) against each release's own loader code (vLLM's
model_executor/models/deepseek_eagle3.py, SGLang's srt/models/kimi_k25_eagle3.py), and the draft-config model
types vLLM rewrites into its MTP drafter's (SpeculativeConfig.hf_config_override)."""
from __future__ import annotations

import ast

import pytest
from packaging.version import Version

from specdeploy.drafter.mla import layer_params
from specdeploy.engines import upstream
from specdeploy.engines import sglang as sg
from specdeploy.engines import vllm as vl

pytestmark = pytest.mark.contract

VLLM = sorted({"0.16.0", "0.17.0", "0.18.0", "0.19.0", "0.20.0", "0.21.0", "0.22.0", "0.22.1", "0.24.0", "0.26.0",
               "0.27.0", "0.32.0", "0.33.0"}, key=Version)
SGLANG = sorted({"0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.16", "0.5.20", "0.5.22", "0.5.23"}, key=Version)
MLA_V, MLA_S = vl.DRAFTER["mla"], sg.DRAFTER["mla"]


def _text(path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _class(src: str, name: str) -> str:
    """The source of one class of a module."""
    tree = ast.parse(src)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    assert node is not None, name
    return ast.get_source_segment(src, node)


def _method(src: str, cls: str, name: str) -> str:
    body = _class(src, cls)
    tree = ast.parse(body)
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert fn is not None, (cls, name)
    return ast.get_source_segment(body, fn)


def _returns(src: str, cls: str, name: str) -> bool:
    fn = ast.parse(_method(src, cls, name))
    return any(isinstance(r, ast.Return) and r.value is not None for r in ast.walk(fn))


def _on(pair, version) -> bool | None:
    yes, no = pair
    if yes is not None and yes.contains(version):
        return True
    if no is not None and no.contains(version):
        return False
    return None


def _flat(s: str) -> str:
    return "".join(s.split())


@pytest.mark.parametrize("version", VLLM)
def test_vllm_mla_head(version):
    vllm = upstream.source("vllm", version) / "vllm"
    src = _text(vllm / "model_executor/models/deepseek_eagle3.py")
    assert bool(src) == MLA_V["read"].contains(version) == vl.DRAFTER["archs"]["Eagle3DeepseekV2ForCausalLM"] \
        .contains(version)
    if not src:
        return
    model = _class(src, "DeepseekV2Eagle3Model")
    top = _class(src, "Eagle3DeepseekV2ForCausalLM")
    layer = _class(src, "DeepseekV2Eagle3DecoderLayer")
    sw = MLA_V["switches"]
    assert _on(sw["fc_norm"]["top"], version) == ('getattr(self.config, "fc_norm", False)' in model)
    assert _on(sw["norm_output"]["top"], version) == ('getattr(self.config, "norm_output", False)' in model)
    for where in ("top", "eagle_config"):  # no release's MLA head builds input_norm
        assert _on(sw["norm_before_fc"][where], version) is False and "norm_before_fc" not in src
    combine = _method(src, "Eagle3DeepseekV2ForCausalLM", "combine_hidden_states")
    applied = "self.model.fc_norm" in combine
    assert applied == MLA_V["fc_norm_applied"].contains(version)
    assert (("self.fc_norm = nn.ModuleList" in model) and not applied) == MLA_V["fc_norm_unapplied"] \
        .contains(version)
    assert "use_aux_hidden_state" not in src and MLA_V["fc_runs_without_aux"]  # fc runs whatever the switch
    assert ("len(layer_ids) if layer_ids else 3" in model and '"num_aux_hidden_states"' in model) == \
        MLA_V["aux_count_from_ids"].contains(version)
    assert "bias=False" in model.split("self.fc = ")[1][:400] and MLA_V["fc_bias_key"] is None
    # what happens to a checkpoint name the head has no parameter for
    inner = _method(src, "DeepseekV2Eagle3Model", "load_weights")
    after = inner.split("if name not in params_dict:")
    dropped = len(after) > 1 and "continue" in after[1][:80]
    assert dropped == MLA_V["unknown_tensor_dropped"].contains(version)
    stacked = "name = name.replace(weight_name, param_name)\n                param = params_dict[name]" in inner
    assert stacked == MLA_V["unknown_stacked_raises"].contains(version)
    raises = "AutoWeightsLoader(self)" in inner and "ignore_unexpected" not in inner
    assert raises == MLA_V["unknown_tensor_raises"].contains(version) == MLA_V["unknown_bias_dropped"] \
        .contains(version)
    if raises:
        utils = _text(vllm / "model_executor/models/utils.py")
        assert "There is no module or parameter named" in utils and 'ignore_unexpected_suffixes.append(".bias")' \
            in utils
    assert (not _returns(src, "Eagle3DeepseekV2ForCausalLM", "load_weights")) == \
        MLA_V["missing_tensor_uninitialised"].contains(version)
    # names: midlayer. -> layers.0., the stacked shards, num_hidden_layers layers, layer 0 twice as wide
    assert '"midlayer."' in model and '"layers.0."' in model and MLA_V["llama_multi_layer"] is None
    for shard in (".q_a_proj", ".kv_a_proj_with_mqa", ".gate_proj", ".up_proj"):
        assert f'"{shard}"' in model
    assert "range(self.config.num_hidden_layers)" in model and vl.DRAFTER.get("mla_max_layers") is None
    assert "input_size=2 * self.hidden_size if layer_idx == 0 else self.hidden_size" in layer
    for norm in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
        assert f"self.{norm} = RMSNorm(config.hidden_size" in _flat(layer).replace("RMSNorm(", "RMSNorm(") or \
            f"self.{norm}=RMSNorm(config.hidden_size" in _flat(layer)
    assert "if self.layer_idx == 0:" in layer  # only layer 0 runs hidden_norm
    # the latent attention: q_a/kv_a fused only with q_lora_rank, which the loader assumes
    attn = _class(_text(vllm / "model_executor/models/deepseek_v2.py"), "DeepseekV2MLAAttention")
    flat = _flat(attn)
    assert "ifself.q_lora_rankisnotNone:self.fused_qkv_a_proj=" in flat
    assert "self.q_a_layernorm=RMSNorm(self.q_lora_rank" in flat
    assert "self.kv_a_layernorm=RMSNorm(self.kv_lora_rank" in flat
    assert "self.num_heads*self.qk_head_dim" in flat and "self.num_heads*(self.qk_nope_head_dim+self.v_head_dim)" \
        in flat and "self.num_heads*self.v_head_dim" in flat
    assert MLA_V["needs_q_lora_rank"].contains(version)
    # the head is an EAGLE model of the proposer: a checkpoint without lm_head shares the target's
    assert "process_eagle_weight(self, name)" in top and vl.DRAFTER["shares_missing_lm_head"].contains(version)


@pytest.mark.parametrize("version", SGLANG)
def test_sglang_mla_head(version):
    srt = upstream.source("sglang", version) / "sglang" / "srt"
    src = _text(srt / "models/kimi_k25_eagle3.py")
    assert bool(src) == MLA_S["read"].contains(version) == sg.DRAFTER["archs"]["Eagle3DeepseekV2ForCausalLM"] \
        .contains(version)
    if not src:
        return
    model = _class(src, "Eagle3MLAModel")
    top = _class(src, "Eagle3DeepseekV2ForCausalLM")
    layer = _class(src, "Eagle3MLADecoderLayer")
    sw = MLA_S["switches"]
    assert _on(sw["fc_norm"]["top"], version) == ('getattr(config, "fc_norm"' in model)
    assert _on(sw["use_aux_norm"]["top"], version) == ('"use_aux_norm"' in model)
    assert _on(sw["norm_output"]["top"], version) == ('getattr(config, "norm_output"' in model)
    assert "norm_before_fc" not in src and "input_norm" not in src
    assert _on(sw["norm_before_fc"]["top"], version) is False
    # fc fuses the ids' count: eagle_config first, then the top level, else 3
    count = src.split("def _get_eagle_aux_layer_count", 1)[1].split("\nclass ", 1)[0]
    assert count.index('eagle_config.get("eagle_aux_hidden_state_layer_ids")') < \
        count.index('getattr(config, "eagle_aux_hidden_state_layer_ids", None)') and "return 3" in count
    assert MLA_S["aux_count_keys"] == ("nested", "top") and MLA_S["aux_count_from_ids"].contains(version)
    assert 'bias=getattr(config, "bias", False)' in model and MLA_S["fc_bias_key"].contains(version)
    assert "if hidden_states.shape[-1] != embeds.shape[-1]:" in model  # fc only for fused aux states
    assert 'raise ValueError("EAGLE3 currently only supports 1 layer")' in model and sg.DRAFTER["mla_max_layers"] == 1
    assert "requires q_lora_rank" in layer and MLA_S["needs_q_lora_rank"].contains(version)
    assert "attn.fused_qkv_a_proj_with_mqa = ReplicatedLinear(\n            2 * config.hidden_size" in layer
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        assert f"self.{norm} = RMSNorm" in layer
    load = _method(src, "Eagle3DeepseekV2ForCausalLM", "load_weights")
    assert 're.sub(r"^layers\\.0\\.", "midlayer.", name)' in load and MLA_S["llama_multi_layer"] is None
    assert "skipping unexpected weight" in load and MLA_S["unknown_tensor_dropped"].contains(version)
    assert MLA_S["unknown_tensor_logged"]
    assert "torch.cat(\n                        [cached_a_proj[q_name], cached_a_proj[kv_name]]" in load
    assert (not _returns(src, "Eagle3DeepseekV2ForCausalLM", "load_weights")) == \
        MLA_S["missing_tensor_uninitialised"].contains(version)
    assert 'name == "t2d"' in load and sg.DRAFTER["reads_t2d"] is False
    assert "aux_norm_low" not in src and MLA_S["legacy_aux_norm_names"] is None
    # the vocabulary head: the target's without draft_vocab_size, the embedding when tied
    assert "if draft_vocab_size is None:\n                self.load_lm_head_from_target = True" in top
    assert "if config.tie_word_embeddings:\n            self.lm_head = self.model.embed_tokens" in top
    assert sg.DRAFTER["lm_head_from_target_without_draft_vocab_size"].contains(version)
    assert sg.DRAFTER["tied_lm_head_is_embedding"].contains(version)
    # residual before hidden_norm: norm_before_residual False only
    assert "residual = hidden_states\n        embeds = self.input_layernorm(embeds)\n        hidden_states = " \
        "self.hidden_norm(hidden_states)" in layer and sg.DRAFTER["norm_before_residual"] is False
    attn = _flat(_class(_text(srt / "models/deepseek_v2.py"), "DeepseekV2AttentionMLA"))
    assert "self.q_a_layernorm=RMSNorm(self.q_lora_rank" in attn and "self.kv_a_layernorm=RMSNorm(" \
        "self.kv_lora_rank" in attn and "self.num_heads*(self.qk_nope_head_dim+self.v_head_dim)" in attn


def _rewritten(src: str) -> set[str]:
    """The draft-config model types hf_config_override compares against (every branch it has rewrites the
    config into an MTP drafter's)."""
    tree = ast.parse(src)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "hf_config_override")
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "model_type":
            out |= {k.value for c in node.comparators for k in ast.walk(c)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return out


@pytest.mark.parametrize("version", ["0.16.0", "0.18.0", "0.22.0", "0.26.0", "0.27.0", "0.32.0", "0.33.0"])
def test_vllm_rewrites_these_draft_model_types(version):
    spec = _text(upstream.source("vllm", version) / "vllm" / "config" / "speculative.py")
    got = _rewritten(spec)
    for mt, span in vl.DRAFTER["mtp_rewritten_model_types"].items():
        assert (mt in got) == span.contains(version), (mt, version)
    assert "deepseek_mtp" in got and '"DeepSeekMTPModel"' in spec
    for mt in vl.DRAFTER["convert_model_types"].values():
        assert mt not in got, mt  # what convert writes instead is left alone
    # the override applies to the draft model config whatever the method
    assert "hf_overrides=SpeculativeConfig.hf_config_override" in spec or \
        "SpeculativeConfig.compose_draft_hf_overrides(" in spec or "SpeculativeConfig.hf_config_override," in spec


def test_layer_params_of_the_published_kimi_head():
    """The parameter list the doctor builds for the published TorchSpec Kimi-K2.5 MLA head's config equals the
    shapes its checkpoint holds (tests/data/drafters/corpus/lightseekorg-kimi-k2.5-eagle3-mla.json)."""
    import json
    from pathlib import Path
    e = json.loads((Path(__file__).resolve().parents[1] / "data/drafters/corpus/lightseekorg-kimi-k2.5-eagle3-mla.json")
                   .read_text())
    want = {n: tuple(s) for n, (_, s) in e["tensors"].items() if n.startswith("layers.0.")}
    assert layer_params(e["config"], e["config"]["hidden_size"], 0) == want


@pytest.mark.parametrize("version", VLLM)
def test_vllm_head_vocabulary_map_and_norm_order(version):
    """From 0.32.0 the Llama and MLA heads build draft_id_to_target_id only for a draft vocabulary smaller than
    the target's (a shipped d2t beside a full one then reaches no parameter); input_norm is applied before the
    per-aux fc_norm wherever both exist."""
    from specdeploy.drafter.head import known
    models = upstream.source("vllm", version) / "vllm" / "model_executor" / "models"
    llama = _text(models / "llama_eagle3.py")
    mla = _text(models / "deepseek_eagle3.py")
    none = "self.draft_id_to_target_id = None" in llama
    assert known(vl.DRAFTER["d2t_needs_draft_vocabulary"], version) is none
    if mla:
        assert ("self.draft_id_to_target_id = None" in mla) == none
    combine = _method(llama, "Eagle3LlamaForCausalLM", "combine_hidden_states") \
        if "def combine_hidden_states" in _class(llama, "Eagle3LlamaForCausalLM") else ""
    both = "self.model.input_norm(" in combine and "self.model.fc_norm" in combine
    assert both == vl.DRAFTER["input_norm_then_fc_norm"].contains(version)
    if both:
        assert combine.index("self.model.input_norm(") < combine.index("self.model.fc_norm")


@pytest.mark.parametrize("version", [v for v in SGLANG if Version(v) >= Version("0.5.12")])
def test_sglang_norm_order(version):
    llama = _text(upstream.source("sglang", version) / "sglang" / "srt" / "models" / "llama_eagle3.py")
    both = "hidden_states = self.input_norm(hidden_states)" in llama and "zip(self.fc_norm, chunks)" in llama
    assert both == sg.DRAFTER["input_norm_then_fc_norm"].contains(version), version
    if both:
        assert llama.index("hidden_states = self.input_norm(hidden_states)") < llama.index("zip(self.fc_norm, chunks)")


@pytest.mark.parametrize("version", VLLM)
def test_vllm_aux_capture_of_llama_and_deepseek_targets(version):
    """Which aux ids the Llama and DeepSeek (Kimi) target models can capture: layer 0 (its residual is None) and
    the final output as id n (the layer count)."""
    models = upstream.source("vllm", version) / "vllm" / "model_executor" / "models"
    f = vl.DRAFTER
    llama = _text(models / "llama.py")
    ds = _class(_text(models / "deepseek_v2.py"), "DeepseekV2Model")
    # Llama: from 0.18.0 _maybe_add_hidden_state before the first layer and after every layer (idx + 1)
    llama_new = "self._maybe_add_hidden_state(" in llama and "idx + 1" in llama
    assert llama_new == (not f["aux_layer_zero_fails_llama"].contains(version)) == \
        f["aux_final_layer_llama"].contains(version)
    # DeepSeek: hidden_states + residual before each layer (0 fails) wherever it captures at all
    captures = "aux_hidden_state_layers" in ds
    assert captures == f["aux_layer_zero_fails_deepseek"].contains(version)
    if captures:
        assert "hidden_states + residual" in ds and "residual is not None" not in ds.split("aux_hidden_states")[1][:400]
    assert ("self.end_layer in self.aux_hidden_state_layers" in ds) == f["aux_final_layer_deepseek"].contains(version)
