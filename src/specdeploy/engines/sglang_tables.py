"""SGLang's facts per release, read from its sources: versions, capabilities, serving layouts and flags, the
all-reduce paths in front of NCCL, load formats, how it loads an EAGLE-3 drafter, speculative methods, the release
specdeploy pins, the CUDA of its images. The adapter (``engines/sglang.py``) answers from these tables; the
contract tests check them against the sources."""
from __future__ import annotations

from specdeploy.engines.base import Pin, Span, SpecMethod

VERSIONS = (
    "0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.2", "0.5.3", "0.5.3.post1", "0.5.3.post2",
    "0.5.3.post3", "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3", "0.5.5", "0.5.5.post1",
    "0.5.5.post2", "0.5.5.post3", "0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1",
    "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1",
    "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
    "0.5.22", "0.5.23",
)

CAPABILITIES = {
    # (EAGLE-3 target support, Kimi-K2.5's from 0.5.10 included, is in engines/eagle3_targets.py.)
    # --config YAML file, merged into the command line (server_args_config_parser.py): lets the API key stay off
    # the command line. Absent in 0.5.2, present from 0.5.3.
    "config_file": Span("0.5.3"),
    # --speculative-adaptive-config with batch-size slots ({"1": {"candidate_steps": [...]}, "8": ...})
    "adaptive_spec_per_batch": Span("0.5.13"),
    # Eagle3DeepseekV2ForCausalLM (MLA drafter head), as in DRAFTER["archs"].
    "mla_eagle3_drafter": Span("0.5.12"),
    # --attn-dp-size N (fields/parallel.py): attention data parallelism of its own. Before 0.5.22 it is
    # --dp-size N --enable-dp-attention; 0.5.22 deprecated that spelling (rewritten to attn_dp_size) and made
    # --dp-size count model replicas, which it refuses across nodes.
    "attn_dp_size": Span("0.5.22"),
}

# Serving layouts (values.topology), read from the release sources (docs/topology.md): multi-node TP (--nnodes,
# --node-rank, --dist-init-addr), DP attention with --ep-size, and PD disaggregation (--disaggregation-mode,
# --disaggregation-transfer-backend mooncake or nixl, --disaggregation-bootstrap-port on prefill servers) are in
# 0.5.1 and in 0.5.23.
LAYOUTS = {"single": Span(), "tp": Span(), "dp_ep": Span(), "pd": Span()}
LAYOUT_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr", "--disaggregation-mode",
                "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port", "--enable-dp-attention",
                "--attn-dp-size")

FLAGS = {f: Span() for f in (
    "--model-path", "--served-model-name", "--host", "--port", "--tp-size", "--ep-size", "--context-length",
    "--mem-fraction-static", "--trust-remote-code", "--enable-metrics", "--disable-custom-all-reduce",
    "--attention-backend", "--speculative-algorithm", "--speculative-draft-model-path",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
    "--kv-cache-dtype", "--max-running-requests", "--chunked-prefill-size",
    "--tool-call-parser", "--reasoning-parser", "--watchdog-timeout",
    "--dist-timeout", "--page-size", "--moe-runner-backend")}
FLAGS["--config"] = CAPABILITIES["config_file"]
FLAGS.update({f: Span() for f in LAYOUT_FLAGS})
FLAGS["--attn-dp-size"] = CAPABILITIES["attn_dp_size"]
FLAGS["--dp-size"] = Span()
# Scheduler metrics are recorded on attention-TP rank 0 only unless this is set (scheduler.py in 0.5.1 and 0.5.6,
# observability/scheduler_metrics_mixin.py in 0.5.10, observability/metrics_collector.py in 0.5.23): present in
# every release the adapter takes. Each scheduler's series carries tp_rank, pp_rank, moe_ep_rank and, under DP,
# dp_rank; the exporter aggregates them (speculation/exporter.py).
FLAGS["--enable-metrics-for-all-schedulers"] = Span()
FLAGS["--speculative-draft-model-quantization"] = Span("0.5.7")  # absent in 0.5.6.post2, present in 0.5.7

# All-reduce paths in front of NCCL, read from sglang/srt/distributed/ (custom_all_reduce.py,
# parallel_state.py) in the 0.5.1, 0.5.10, 0.5.16 and 0.5.23 wheels. The custom all-reduce (world sizes 2, 4, 6,
# 8; on more than two GPUs only with full NVLink) takes size < 8 MiB on CUDA up to 0.5.8.post1 and size <= 8 MiB
# from 0.5.9 (the x86_64 wheels of 0.5.1 to 0.5.10 read). MSCCL++, torch symmetric memory and the PCIe-IPC
# all-reduce (0.5.23) are off unless enabled, so they are not listed.
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_AR_MAX = 8192 * 1024
CUSTOM_AR_INCLUSIVE = Span("0.5.9")
# FlashInfer all-reduce fusion is switched on automatically for KimiK25ForConditionalGeneration on SM90/SM100
# with TP > 1 (seen in 0.5.10, 0.5.16, 0.5.23; absent in 0.5.1; 0.5.2 to 0.5.9 not read). Its size bound is
# per workspace and not recorded here, so sizes above the custom all-reduce's are "unknown" there.
FI_FUSION_AUTO = Span("0.5.10")
FI_FUSION_ABSENT = Span(None, "0.5.2")
FI_FUSION_CC = ("9.0", "10.0")

FLAGS["--load-format"] = Span()

# --load-format choices that load a safetensors checkpoint (LoadFormat in sglang/srt/configs/load_config.py);
# 0.5.6 has none of the fast loaders, 0.5.10 has fastsafetensors and runai_streamer (releases between them are
# not claimed), instanttensor first appears in 0.5.22.
LOAD_FORMATS = {
    "auto": Span(), "safetensors": Span(),
    "fastsafetensors": Span("0.5.10"), "runai_streamer": Span("0.5.10"),
    "instanttensor": Span("0.5.22"),
}

# How SGLang loads an EAGLE-3 drafter (models/llama_eagle3.py, models/kimi_k25_eagle3.py,
# model_runner aux-layer lookup), read from the 0.5.6, 0.5.10-0.5.14, 0.5.18, 0.5.20 and 0.5.23 wheels.
# The doctor (drafter/) consults this table.
DRAFTER = {
    # The speculators format is not read (transformer_layer_config is ignored): convert flattens it.
    "reads_speculators": False,
    "aux_key": "eagle_config.eagle_aux_hidden_state_layer_ids",
    "convert_archs": {"llama": "LlamaForCausalLMEagle3", "mla": "Eagle3DeepseekV2ForCausalLM"},
    "eagle3_prefix": False,
    # EntryClass names a drafter config may use (no aliasing: the name must match).
    "archs": {"LlamaForCausalLMEagle3": Span(), "Eagle3DeepseekV2ForCausalLM": Span("0.5.12")},
    # Only eagle_config.eagle_aux_hidden_state_layer_ids is read, in SGLang numbering (output of layer L;
    # the target captures L+1); without it the target default [2, n//2, n-3] (vLLM numbering) is used.
    # From 0.5.13 the DeepSeek/Kimi target adds 1 only when the first id is 1 and otherwise takes the ids
    # as they are.
    "aux_deepseek_heuristic": Span("0.5.13"),
    # Llama drafters: exactly 1 decoder layer named midlayer.* until 0.5.11; from 0.5.12 num_hidden_layers
    # layers named layers.N.* (midlayer.* is renamed to layers.0.*). Unmatched names are dropped silently.
    "llama_multi_layer": Span("0.5.12"),
    "mla_max_layers": 1,  # kimi_k25_eagle3.py raises unless num_hidden_layers == 1
    # Llama drafter: no draft_vocab_size in the config -> the target's lm_head is loaded; with
    # draft_vocab_size set, lm_head must be in the checkpoint (otherwise it stays uninitialised).
    # (load_lm_head_from_target in llama_eagle3.py, from 0.5.2; 0.5.1.post3 does not have it.)
    # The same flag makes the draft worker load the target's lm_head over a trained one (set_embed_and_head in
    # speculative/eagle_worker_v2.py, 0.5.23; kimi_k25_eagle3.py sets it alike): a checkpoint's own lm_head is kept
    # only when draft_vocab_size is set.
    "lm_head_from_target_without_draft_vocab_size": Span("0.5.2"),
    # t2d is skipped by the Llama and Kimi EAGLE-3 loaders (llama_eagle3.py, kimi_k25_eagle3.py, 0.5.23).
    "reads_t2d": False,
    # The Llama EAGLE-3 decoder layer implements only norm_before_residual = False.
    "norm_before_residual": False,
    # --- the Llama EAGLE-3 head the loader builds (models/llama_eagle3.py), read in the 0.5.11, 0.5.12,
    # 0.5.13, 0.5.16, 0.5.17, 0.5.18, 0.5.19, 0.5.20, 0.5.22 and 0.5.23 wheels; older releases were not read ---
    # Config switches: switch -> {where it is read: (releases that read it there, releases that do not)}
    # ("top": the config's top level; "eagle_config": the nested dict, read first).
    "switches": {
        # eagle_config.use_aux_hidden_state False: the target captures no aux states (model_runner) and the
        # head skips fc (its input is then hidden_size wide); fc is built all the same.
        "use_aux_hidden_state": {"eagle_config": (Span("0.5.11"), None)},
        "norm_before_fc": {"top": (Span("0.5.17"), Span("0.5.11", "0.5.17")),
                           "eagle_config": (Span("0.5.17"), Span("0.5.11", "0.5.17"))},
        "fc_norm": {"top": (Span("0.5.12"), Span("0.5.11", "0.5.12"))},
        "use_aux_norm": {"top": (Span("0.5.12"), Span("0.5.11", "0.5.12"))},  # the older name of fc_norm
        "norm_output": {"top": (Span("0.5.12"), Span("0.5.11", "0.5.12"))},
    },
    "aux_count_from_ids": Span("0.5.12"),
    # input_norm, then the per-aux fc_norm (read in 0.5.17, 0.5.20 and 0.5.23): a missing input_norm.weight (ones)
    # is a uniform scale those norms remove
    "input_norm_then_fc_norm": Span("0.5.17"),
    # aux_norm_low/mid/high.* are renamed to fc_norm.0/1/2.*
    "legacy_aux_norm_names": Span("0.5.12"),
    # the config key "bias" gives fc a bias
    "fc_bias_key": Span("0.5.11"),
    # A checkpoint tensor the head has no parameter for is dropped without a word (load_weights matches
    # names against named_parameters and skips the rest).
    "unknown_tensor_dropped": Span("0.5.11"),
    "missing_tensor_uninitialised": Span("0.5.11"),
    "fc_always_built": True,
    # tie_word_embeddings true: lm_head IS embed_tokens (then replaced by the target's embedding), so a
    # trained lm_head.weight in the checkpoint is dropped.
    "tied_lm_head_is_embedding": Span("0.5.11"),
    # --- the MLA EAGLE-3 head (models/kimi_k25_eagle3.py, Eagle3DeepseekV2ForCausalLM), read in the 0.5.12,
    # 0.5.12.post1, 0.5.13, 0.5.16 to 0.5.23 wheels; drafter/mla.py lays these keys over the ones above ---
    "mla": {
        "read": Span("0.5.12"),
        # one decoder layer (mla_max_layers): layers.0.* is renamed to midlayer.*, which loads as it is
        "llama_multi_layer": None,
        "legacy_aux_norm_names": None,
        # Eagle3MLADecoderLayer raises ValueError("Eagle3 MLA layer requires q_lora_rank in the draft config")
        "needs_q_lora_rank": Span("0.5.12"),
        "q_lora_rank_failure": "SGLang: ValueError 'Eagle3 MLA layer requires q_lora_rank'",
        "switches": {
            # the runner captures no aux states when it is false; the head skips fc for hidden-size states
            "use_aux_hidden_state": {"eagle_config": (Span("0.5.12"), None)},
            "fc_norm": {"top": (Span("0.5.13"), Span("0.5.12", "0.5.13"))},
            "use_aux_norm": {"top": (Span("0.5.13"), Span("0.5.12", "0.5.13"))},
            "norm_output": {"top": (Span("0.5.13"), Span("0.5.12", "0.5.13"))},
            "norm_before_fc": {"top": (None, Span("0.5.12")), "eagle_config": (None, Span("0.5.12"))},
        },
        # fc fuses len(eagle_config ids), else len(top-level ids), else 3 states (_get_eagle_aux_layer_count)
        "aux_count_from_ids": Span("0.5.12"),
        "aux_count_keys": ("nested", "top"),
        "fc_bias_key": Span("0.5.12"),
        "attention_bias": None,
        "layer_extras": {},
        "skips_unbuilt_input_norm": None,
        # load_weights logs "Eagle3 MLA: skipping unexpected weight" and goes on; it returns nothing
        "unknown_tensor_dropped": Span("0.5.12"),
        "unknown_tensor_logged": True,
        "missing_tensor_uninitialised": Span("0.5.12"),
    },
}

# specdeploy_spec_method -> --speculative-algorithm. NEXTN (mtp) is EAGLE over the target's own MTP layers: for the
# architectures in MTP_TARGETS, server_args sets --speculative-draft-model-path to --model-path when it is not given,
# and the draft model config turns DeepseekV3ForCausalLM into DeepseekV3ForCausalLMNextN.
SPEC_METHODS = {
    "eagle3": SpecMethod("EAGLE3", "drafter"),
    "eagle": SpecMethod("EAGLE", "drafter"),
    "mtp": SpecMethod("NEXTN", "target", target_key="num_nextn_predict_layers"),
    "ngram": SpecMethod("NGRAM", "none"),
}
# The target architectures whose MTP draft path server_args defaults to the target's (read in 0.5.10's
# ServerArgs._handle_speculative_decoding and 0.5.23's arg_groups/speculative_hook.py); the Kimi-K2.5 wrapper
# (KimiK25ForConditionalGeneration) is in neither.
MTP_TARGETS_READ = ("0.5.10", "0.5.23")
_MTP_BOTH = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
             "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
             "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")
MTP_TARGETS = {**{a: Span("0.5.10") for a in _MTP_BOTH},
               **{a: Span("0.5.23") for a in ("DeepseekV4ForCausalLM", "HYV3ForCausalLM", "HYV4ForCausalLM",
                                              "Qwen4ExpForConditionalGeneration")}}

# The release deployed when the inventory pins none (specdeploy_engine_versions / specdeploy_engine_version).
PINS = (
    Pin("0.5.23", "the newest release specdeploy reads and the sandbox plays; the Kimi-K2.5 wrapper "
        "(KimiK25ForConditionalGeneration) is an EAGLE-3 target from 0.5.10, MLA EAGLE-3 heads load from 0.5.12, and "
        "DP attention takes --attn-dp-size from 0.5.22. On SM120 specdeploy sets the attention backend explicitly "
        "(the default MLA kernels are SM90/SM100 only) and turns custom all-reduce off on PCIe"),
)


# CUDA of the official image per release (``ARG CUDA_VERSION=`` in docker/Dockerfile at that release).
IMAGE_CUDA = {"0.5.5": "12.9.1"}

# The file systemd hands the engine with LoadCredential= (the API key as --config YAML).
API_KEY_CREDENTIAL = "sglang-api-key.yaml"
