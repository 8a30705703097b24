"""SGLang adapter (0.5.x up to 0.5.23)."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

from specdeploy.values.errors import Finding
from specdeploy.values.peerhttp import url_host
from specdeploy.engines import eagle3_targets as e3
from specdeploy.engines import sglang_logs
from specdeploy.engines.base import (
    SimRank,
    AllReducePath,
    Command,
    CommContext,
    EngineAdapter,
    Health,
    Metrics,
    SimBehaviour,
    Pin,
    SimReject,
    Span,
    SpecMethod,
    parse_version,
)

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


class SGLang(EngineAdapter):
    name = "sglang"
    label = "SGLang"
    triage_signatures = sglang_logs.SIGNATURES
    load_log = sglang_logs.LOAD_LOG
    upstream_image = "lmsysorg/sglang"
    version_arg = "SGLANG_VERSION"
    # No SGLang patches exist; the package's own __init__ and version are enough to locate and name it.
    standin_files = ("__init__.py", "version.py")
    sandbox_version = "0.5.23"
    image_cuda = IMAGE_CUDA
    source_release = "wheel"
    default_port = 30000
    DRAFTER = DRAFTER
    drafter_fallback = "vLLM"
    eagle3_targets = e3.SGLANG_TARGETS
    eagle3_targets_read = e3.SGLANG_READ
    eagle3_interface = "set_eagle3_layers_to_capture"
    versions = VERSIONS
    pins = PINS
    spec_methods = SPEC_METHODS
    capabilities = CAPABILITIES
    flags = FLAGS
    layouts = LAYOUTS
    layout_flags = frozenset(LAYOUT_FLAGS)
    load_formats = LOAD_FORMATS
    launch_hint = "python -m sglang.launch_server --help"
    health = Health(
        liveness="/health",
        readiness="/health_generate",
        meaning="/health and /health_generate return 503 while the server is starting; once started they "
                "run a one-token generation and return 200 only if it completes within "
                "SGLANG_HEALTH_CHECK_TIMEOUT, so a wedged GPU loop reads as unhealthy.",
    )
    metrics = Metrics(
        spec_gauges={
            "acceptance_length": "sglang:spec_accept_length",
            "acceptance_rate": "sglang:spec_accept_rate",
            # a scheduler's generated tokens per second over the same logging interval as its acceptance gauges:
            # the weight of its figures when DP groups are aggregated
            "throughput": "sglang:gen_throughput",
        },
        serving={
            "ttft": "sglang:time_to_first_token_seconds",
            "itl": "sglang:inter_token_latency_seconds",
            "generation_tokens": "sglang:generation_tokens_total",
            "prompt_tokens": "sglang:prompt_tokens_total",
            "running": "sglang:num_running_reqs",
            "waiting": "sglang:num_queue_reqs",
            "kv_cache": "sglang:token_usage",
        },
        spans={"sglang:spec_accept_rate": Span("0.5.4")},  # absent in 0.5.3 (the exporter then reports no rate)
    )

    def spec_config_problems(self, hv, host):
        out = []
        if hv.specdeploy_api_key_file and not self.has("config_file"):
            since = CAPABILITIES["config_file"].since
            out.append(Finding("error", "specdeploy_api_key_file",
                               f"SGLang {self.version} has no --config file, so the API key could reach it only on "
                               "the command line, readable by every local user",
                               f"pin SGLang >= {since}, or unset specdeploy_api_key_file", host))
        for key in hv.specdeploy_spec_config_extra:
            flag = "--speculative-" + key.replace("_", "-").removeprefix("speculative-")
            if not self.flag_exists(flag):
                out.append(Finding("error", f"specdeploy_spec_config_extra.{key}",
                                   f"SGLang {self.version} has no {flag} flag specdeploy knows",
                                   "use num_steps, eagle_topk, num_draft_tokens, draft_model_quantization "
                                   "or pass the flag in specdeploy_engine_extra_args", host))
        return out

    def k_by_batch_problems(self, hv, host):
        out = super().k_by_batch_problems(hv, host)
        if out and self.has("adaptive_spec_per_batch"):
            # SGLang's per-batch-size steps are its adaptive speculation (a JSON file of candidate steps per
            # batch-size slot, routed by the CUDA-graph-padded batch size); specdeploy does not render it yet
            out[0].message = (f"SGLang {self.version} varies the steps per batch size only as adaptive speculation "
                              "(--speculative-adaptive-config), which specdeploy does not render")
        return out

    def spec_flags(self, hv, drafter_path):
        k = hv.specdeploy_spec_num_tokens
        extra = {key.removeprefix("speculative_"): v for key, v in hv.specdeploy_spec_config_extra.items()}
        topk = int(extra.pop("eagle_topk", 1))
        steps = int(extra.pop("num_steps", k))
        draft_tokens = int(extra.pop("num_draft_tokens", steps + 1 if topk == 1 else k + 1))
        argv = ["--speculative-algorithm", SPEC_METHODS[hv.specdeploy_spec_method].engine_name]
        if drafter_path and self.uses_drafter(hv):  # NEXTN: the engine takes the target's own path
            argv += ["--speculative-draft-model-path", drafter_path]
        if hv.specdeploy_spec_method != "ngram":
            argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                     "--speculative-num-draft-tokens", str(draft_tokens)]
        for key, v in extra.items():
            argv += ["--speculative-" + key.replace("_", "-"), str(v)]
        return argv

    def target_method_arch_problems(self, hv, target, host):
        arch = (target.architectures or [""])[0]
        v = parse_version(self.version)
        read = sorted(MTP_TARGETS_READ, key=parse_version)
        lo = [r for r in read if parse_version(r) <= v]
        hi = [r for r in read if parse_version(r) >= v]
        span = MTP_TARGETS.get(arch)
        if lo and hi:  # a read release, or one between two read releases that agree
            at = {r: span is not None and span.contains(r) for r in (lo[-1], hi[0])}
            if all(at.values()):
                return []
            if not any(at.values()):
                return [Finding("error", "specdeploy_spec_method", f"SGLang {self.version} finds the MTP (NEXTN) "
                                f"draft layers in the target only for {', '.join(sorted(MTP_TARGETS))}, not {arch}: "
                                "without --speculative-draft-model-path it has no draft model",
                                "serve this target with a separate drafter (eagle3), or without speculation", host)]
        return [Finding("warning", "specdeploy_spec_method", f"whether SGLang {self.version} finds MTP draft layers in "
                        f"{arch} was not read (read: {', '.join(read)})",
                        "check the release's speculative-decoding argument handling", host)]

    def allreduce_paths(self, ctx: CommContext) -> list[AllReducePath]:
        out = []
        ws = ctx.world_size
        if ctx.custom_all_reduce and ws in CUSTOM_AR_WORLD_SIZES and (ws == 2 or ctx.nvlink):
            incl = CUSTOM_AR_INCLUSIVE.contains(self.version)
            out.append(AllReducePath("custom all-reduce", CUSTOM_AR_MAX, incl,
                                     f"SGLang {self.version} CustomAllreduce: size {'<=' if incl else '<'} "
                                     f"{CUSTOM_AR_MAX} bytes"))
        if ws > 1 and ctx.compute_capability in FI_FUSION_CC and not FI_FUSION_ABSENT.contains(self.version):
            known = FI_FUSION_AUTO.contains(self.version)
            out.append(AllReducePath("FlashInfer all-reduce fusion", None, False,
                                     f"SGLang {self.version} "
                                     + ("enables it for Kimi-K2.5 on SM90/SM100" if known else
                                        "may enable it for Kimi-K2.5 (release not read)")
                                     + "; its size bound is not recorded"))
        return out

    def credential_content(self, name, key):
        import json
        return f"api-key: {json.dumps(key)}\n"  # a --config YAML file; a JSON string is a YAML scalar

    def command(self, hv, drafter_path=None, rank=None) -> Command:
        # SGLang's --tp-size spans the whole group under DP attention too (--attn-dp-size divides it).
        tp = rank.world if rank is not None and rank.layout in ("tp", "dp_ep") else hv.tp
        argv = ["python", "-m", "sglang.launch_server",
                "--model-path", hv.specdeploy_model_path,
                "--served-model-name", hv.served_model_name,
                "--host", hv.specdeploy_bind_address,
                "--port", str(hv.specdeploy_port),
                "--tp-size", str(tp),
                "--mem-fraction-static", str(hv.specdeploy_gpu_memory_utilization),
                "--enable-metrics"]
        if self.flag_exists("--enable-metrics-for-all-schedulers"):
            argv.append("--enable-metrics-for-all-schedulers")
        layout_argv, layout_env = self.layout_args(hv, rank)
        argv += layout_argv
        if hv.specdeploy_expert_parallel and "--ep-size" not in argv:
            argv += ["--ep-size", str(tp)]
        if hv.specdeploy_max_model_len:
            argv += ["--context-length", str(hv.specdeploy_max_model_len)]
        if hv.specdeploy_trust_remote_code:
            argv.append("--trust-remote-code")
        backend = self.resolved(hv, "attention_backend")
        if backend:
            argv += ["--attention-backend", backend]
        if self.resolved(hv, "disable_custom_all_reduce"):
            argv.append("--disable-custom-all-reduce")
        if hv.specdeploy_load_format:
            argv += ["--load-format", hv.specdeploy_load_format]
        if hv.specdeploy_spec_enabled:
            argv += self.spec_flags(hv, drafter_path)
        credential = None
        if hv.specdeploy_api_key_file and self.has("config_file"):
            # The key lives in a 0600 YAML file handed over by systemd's LoadCredential=.
            credential = API_KEY_CREDENTIAL
            argv += ["--config", "${CREDENTIALS_DIRECTORY}/" + credential]
        argv += list(hv.specdeploy_engine_extra_args)
        return Command(argv=argv, env=layout_env, secret_env={}, credential=credential)

    def layout_args(self, hv, rank) -> tuple[list[str], dict[str, str]]:
        if rank is None or rank.layout == "single":
            return [], {}
        env = {"SGLANG_HOST_IP": rank.address}
        if rank.layout == "pd":
            argv = ["--disaggregation-mode", rank.role, "--disaggregation-transfer-backend", rank.transfer]
            if rank.role == "prefill":
                argv += ["--disaggregation-bootstrap-port", str(rank.pd_port)]
            return argv, env
        argv = ["--nnodes", str(rank.size), "--node-rank", str(rank.index),
                "--dist-init-addr", f"{url_host(rank.leader_address)}:{rank.port}"]
        if rank.layout == "dp_ep":
            argv += (["--attn-dp-size", str(rank.dp_size)] if self.has("attn_dp_size")
                     else ["--dp-size", str(rank.dp_size), "--enable-dp-attention"])
            argv += ["--ep-size", str(rank.world)]
        return argv, env

    def profile_defaults(self, profile) -> dict[str, object]:
        return self.pcie_defaults(profile, "flashinfer")

    def probe_unavailable(self) -> str:
        return ("SGLang's kernels are CUDA-only (sgl_kernel loads libcuda at import), so its probe can only run "
                "on a host with the engine image and a GPU; the doctor's rules stand alone here")

    def preflight(self, hv, target, drafter_fmt, rep, host) -> None:
        spec = hv.specdeploy_spec_enabled
        eagle3 = spec and hv.specdeploy_spec_method == "eagle3"
        prof = hv.profile()
        if spec and hv.specdeploy_spec_method == "eagle" and drafter_fmt in ("llama", "speculators", "mla"):
            rep.add("error", "specdeploy_spec_method", "EAGLE with an EAGLE-3 drafter runs silently at acceptance "
                    "length 1.0 on SGLang", "set specdeploy_spec_method: eagle3 (--speculative-algorithm EAGLE3)",
                    host)
        ok, why = self.eagle3_target(target.architectures, target.text_model_type) if eagle3 and target is not None \
            else (True, "")
        if ok is False:
            later = next((v for v in self.versions[self.versions.index(self.version) + 1:]
                          if SGLang(v).eagle3_target(target.architectures, target.text_model_type)[0]), None)
            rep.add("error", "specdeploy_engine_version", f"SGLang {self.version} has no EAGLE-3 support for "
                    f"{', '.join(target.architectures)} ({why}" + (f"; first in {later})" if later else ")"),
                    f"pin SGLang >= {later}" if later else "serve this target with another engine, or without "
                    "EAGLE-3", host)
        elif ok is None:
            rep.add("warning", "eagle3 target", f"{why}: whether it serves {target.architectures} as an EAGLE-3 "
                    "target is not known", "check the target on the engine itself", host)
        if prof.interconnect == "pcie" and prof.sm >= 120:
            if not self.resolved(hv, "disable_custom_all_reduce"):
                rep.add("error", "specdeploy_custom_all_reduce", "SGLang's custom all-reduce on PCIe SM120 hangs "
                        "or breaks CUDA-graph capture", "leave specdeploy_custom_all_reduce unset or false", host)
            if not self.resolved(hv, "attention_backend"):
                rep.add("error", "specdeploy_attention_backend", "no explicit attention backend on SM120: SGLang "
                        "may pick an SM90/SM100-only MLA kernel", "set specdeploy_attention_backend: flashinfer "
                        "(or triton)", host)

    def drafter_taps(self, top, nested, default, deepseek_target):
        # SGLang reads only eagle_config's ids, in its own numbering (output of layer L: vLLM id - 1).
        if nested is not None:
            if DRAFTER["aux_deepseek_heuristic"].contains(self.version) and deepseek_target and nested[0] != 1:
                return list(nested), "nested key taken as-is by the DeepSeek/Kimi target (first id is not 1)"
            return [x + 1 for x in nested], "nested key"
        return default, "default (SGLang reads only the nested key)"

    def drafter_nested_ids(self, taps, deepseek_target):
        nested = [x - 1 for x in taps]
        if DRAFTER["aux_deepseek_heuristic"].contains(self.version) and deepseek_target and nested[0] != 1:
            nested = list(taps)  # this target takes ids whose first is not 1 as they are
        return nested

    @classmethod
    def facts_from_source(cls, root) -> dict:
        import ast

        from specdeploy.engines.sourcescan import class_fields, flag_literals, strings
        srt = Path(root) / cls.name / "srt"
        flags: set[str] = set()
        algos: set[str] = set()
        for f in sorted((srt / "arg_groups").rglob("*.py")) + [srt / "server_args.py"]:
            if not f.exists():
                continue
            flags |= {"--" + n.replace("_", "-") for n in class_fields(f, lambda c: True)} | flag_literals(f)
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                        and node.args[0].value == "--speculative-algorithm"):
                    for kw in node.keywords:
                        if kw.arg == "choices":
                            algos |= set(strings(kw.value))
        spec = srt / "speculative"
        for f in (spec / "spec_info.py", spec / "spec_registry.py"):
            if not f.exists():
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ClassDef) and node.name == "SpeculativeAlgorithm":
                    algos |= {t.id for s in node.body if isinstance(s, ast.Assign) for t in s.targets
                              if isinstance(t, ast.Name) and t.id.isupper() and t.id != "NONE"}
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_RESERVED_ALIASES"
                                                        for t in node.targets):
                    algos |= set(strings(node.value))
        return {"flags": sorted(flags), "spec_methods": sorted(algos)}

    @classmethod
    def eagle3_targets_from_source(cls, root) -> tuple[set[str], None]:
        """(EntryClass architectures with a set_eagle3_layers_to_capture method, own or inherited; no type list)."""
        from specdeploy.engines.sourcescan import entry_classes, implementers, model_classes
        models = Path(root) / cls.name / "srt" / "models"
        classes = model_classes(models)
        return {a for a, m in entry_classes(models).items()
                if implementers(classes, m, a, lambda name, e: "set_eagle3_layers_to_capture" in e[1])}, None

    @classmethod
    def simulation(cls) -> SimBehaviour:
        return SGLangSim()


class SGLangSim(SimBehaviour):
    """SGLang as the simulator plays it: ``python -m sglang.launch_server``, --speculative-algorithm, the key in a
    --config YAML, acceptance as gauges of recent batches, health checks that generate, /metrics only with
    --enable-metrics, and a scheduler crash log."""

    argv_head = ("python", "-m", "sglang.launch_server")
    usage = "usage: python -m sglang.launch_server --model-path PATH [options]"
    prog = "launch_server"
    booleans = frozenset({"--trust-remote-code", "--enable-metrics", "--enable-dp-attention",
                          "--disable-custom-all-reduce", "--enable-metrics-for-all-schedulers"})
    int_flags = frozenset({"--port", "--tp-size", "--ep-size", "--nnodes", "--node-rank", "--dp-size",
                           "--attn-dp-size", "--disaggregation-bootstrap-port", "--context-length",
                           "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"})
    tp_option = "tp_size"
    health_generates = True
    metrics_option = "enable_metrics"
    kv_lines = ("[2026-01-01 00:00:00 TP0] KV Cache is allocated. #tokens: 1187264, KV size: 38.72 GB",
                "[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.")

    def rank(self, opts):
        if not opts.get("nnodes") or int(opts["nnodes"]) < 2:
            return None
        host, _, port = str(opts.get("dist_init_addr") or "").rpartition(":")
        index = int(opts.get("node_rank") or 0)
        return SimRank(index, int(opts["nnodes"]), host.strip("[]"), int(port or 0), index == 0)

    def pd_role(self, opts):
        mode = opts.get("disaggregation_mode") or "null"
        if mode not in ("prefill", "decode"):
            return None
        return mode, int(opts.get("disaggregation_bootstrap_port") or 8998)

    def info(self, path, sim):
        # what sglang-router (its PD mode) reads from each instance when it registers it
        if path in ("/server_info", "/get_server_info"):
            role = self.pd_role(sim.opts)
            return {"model_path": sim.opts.get("model_path"), "served_model_name": sim.served,
                    "tp_size": int(sim.opts.get("tp_size") or 1), "dp_size": 1,
                    "disaggregation_mode": role[0] if role else "null", "version": sim.version}
        if path in ("/model_info", "/get_model_info"):
            return {"model_path": sim.opts.get("model_path"), "tokenizer_path": sim.opts.get("model_path"),
                    "is_generation": True}
        return None

    def group_lost_lines(self, rank, peer):
        return [f"[2026-01-01 00:00:00 TP0] Scheduler hit an exception: RuntimeError: Connection closed by peer "
                f"[{peer}]", "[2026-01-01 00:00:00] Received sigquit from a child process. It usually means the "
                "child failed."]

    def spec(self, version, opts, facts):
        if "speculative_algorithm" not in opts:
            return None
        algo = opts["speculative_algorithm"]
        methods = facts["spec_methods"] if facts else {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}
        if algo.upper() not in methods:
            raise SimReject(f"ValueError: Unknown speculative algorithm name: {algo}")
        return {"k": int(opts.get("speculative_num_steps", 3)), "method": algo,
                "model": opts.get("speculative_draft_model_path")}

    def api_key(self, opts, env):
        cfg = opts.get("config")
        if cfg and os.path.isfile(cfg):
            import yaml
            with open(cfg) as fh:
                data = yaml.safe_load(fh) or {}
            return data.get("api-key") or data.get("api_key")
        return opts.get("api_key")

    def metrics(self, registry, served, k):
        return _SGLangSimMetrics(registry, served)

    def graph_line(self, i, graphs, t_graph):
        return (f"Capturing batches (bs={max(1, 512 >> i)} avail_mem=21.3 GB): {100 * i // graphs:3d}%| | "
                f"{i}/{graphs} [00:{int(i * t_graph):02d}<00:00]")

    def graphs_done(self, load_s):
        return f"[2026-01-01 00:00:00 TP0] Capture cuda graph end. Time elapsed: {0.3 * load_s:.2f} s."

    def crash_log(self, version, model, k, tp):
        """SGLang's format: ``[date time TPn] message``; a scheduler's traceback starts mid-line and its
        continuation lines carry no prefix. Each rank writes its block in one piece, so ranks interleave by block,
        not by line."""
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        out = [(f"[{ts}] server_args=ServerArgs(model_path='{model}', tp_size={tp}, trust_remote_code=True, "
                f"speculative_algorithm='EAGLE3', speculative_num_steps={k}, sglang_version='{version}')\n")]
        out += [f"[{ts} TP{r}] Load weight end. type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16\n"
                for r in range(tp)]
        out += [f"[{ts} TP{r}] Capture cuda graph begin. This can take up to several minutes.\n" for r in range(tp)]
        ranks = list(range(tp))
        random.Random(1).shuffle(ranks)
        out += [f"[{ts} TP{r}] Scheduler hit an exception: Traceback (most recent call last):\n" + CRASH_TB
                for r in ranks]
        out.append(f"[{ts}] Received sigquit from a child process. It usually means the child failed.\n")
        return "".join(out)


CRASH_TB = (
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2566, in run_scheduler_process\n'
    "    scheduler = Scheduler(\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 1801, '
    'in init_device_graphs\n'
    "    self.graph_runner = graph_runners[self.device](self)\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", line 381, in __init__\n'
    "    raise Exception(\n"
    "Exception: Capture cuda graph failed: 'CustomAllReduceV2' object has no attribute 'obj'\n"
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n\n")


class _SGLangSimMetrics:
    def __init__(self, r, served):
        from prometheus_client import Counter, Gauge, Histogram
        lab = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        self.served = served
        self.lv = {"model_name": served, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                   "moe_ep_rank": "0"}
        self.m_al = Gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
                          lab, registry=r)
        self.m_ar = Gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
                          "(`accepted tokens / total draft tokens` in batch).", lab, registry=r)
        self.m_running = Gauge("sglang:num_running_reqs", "The number of running requests.", lab, registry=r)
        self.m_waiting = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", lab,
                               registry=r)
        self.m_kv = Gauge("sglang:token_usage", "The token usage.", lab, registry=r)
        self.m_tput = Gauge("sglang:gen_throughput", "The generation throughput (token/s).", lab, registry=r)
        tl = ["model_name"]
        self.m_gen = Counter("sglang:generation_tokens", "Number of generation tokens processed.", tl, registry=r)
        self.m_prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", tl, registry=r)
        self.m_reqs = Counter("sglang:num_requests", "Number of requests processed.", tl, registry=r)
        self.m_ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token.", tl,
                                registry=r, buckets=(0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40))
        self.m_itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency.", tl,
                               registry=r, buckets=(0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025,
                                                    0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4))
        for g in (self.m_al, self.m_ar, self.m_running, self.m_waiting, self.m_kv, self.m_tput):
            g.labels(**self.lv).set(0)
        for c in (self.m_gen, self.m_prompt, self.m_reqs):
            c.labels(model_name=served)
        self.window: list[int] = []  # accepted tokens of recent steps
        import threading
        self.lock = threading.Lock()

    def running(self, n):
        self.m_running.labels(**self.lv).set(n)

    def prompt(self, n):
        self.m_prompt.labels(model_name=self.served).inc(n)

    def generated(self, n):
        self.m_gen.labels(model_name=self.served).inc(n)
        self.m_reqs.labels(model_name=self.served).inc()

    def ttft(self, s):
        self.m_ttft.labels(model_name=self.served).observe(s)

    def itl(self, s):
        self.m_itl.labels(model_name=self.served).observe(s)

    def spec_step(self, acc, k):
        with self.lock:
            self.window = (self.window + [acc])[-200:]
            mean = sum(self.window) / len(self.window)
        self.m_al.labels(**self.lv).set(1 + mean)
        self.m_ar.labels(**self.lv).set(mean / k)

