"""vLLM adapter (0.16.0 through 0.33.0)."""
from __future__ import annotations

from ..errors import Finding
from . import AllReducePath, Command, CommContext, EngineAdapter, Health, Metrics, MiB, Span, dumps_compact

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
    "language_model_only": Span("0.17.0"),
    "api_key_env": Span(),  # VLLM_API_KEY
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
# 0.22.0, 0.27.0 and 0.33.0 sources. The doctor (drafter.py) consults this table.
DRAFTER = {
    # For method eagle3 an architecture X becomes "Eagle3" + X unless its name already starts or ends
    # with Eagle3; the result must be one of these registry entries.
    "archs": {
        "Eagle3LlamaForCausalLM": Span(), "LlamaForCausalLMEagle3": Span(),
        "Eagle3Qwen2_5vlForCausalLM": Span(), "Eagle3Qwen3vlForCausalLM": Span(),
        "Eagle3DeepseekV2ForCausalLM": Span("0.18.0"), "Eagle3DeepseekV3ForCausalLM": Span("0.18.0"),
        "Eagle3MiniMaxM2ForCausalLM": Span("0.22.0"),  # in 0.22.0, absent in 0.18.0
        "Eagle3Qwen3ForCausalLM": Span("0.27.0"),  # in 0.27.0, absent in 0.22.0
    },
    "mla_archs": {"Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"},
    # speculators configs: transformer_layer_config.model_type -> drafter class
    "speculators_model_types": {"llama": Span(), "qwen3": Span("0.27.0")},
    # The speculators loader defaults norm_before_residual to True, the flat loader to False.
    "speculators_norm_before_residual_default": True,
    # Top-level eagle_aux_hidden_state_layer_ids, in vLLM numbering (input of layer L), always read first.
    # Without it, 0.22.0 and later read eagle_config.eagle_aux_hidden_state_layer_ids AS vLLM numbers (no +1);
    # 0.16.0 and 0.18.0 ignore the nested key and use the default (2, n//2, n-3). Releases in between are
    # not pinned down.
    "aux_nested_read_as_is": Span("0.22.0"),
    "aux_nested_ignored": Span(None, "0.18.1"),
    # Llama and MLA drafters build num_hidden_layers decoder layers (layer 0 takes 2*hidden inputs).
    "max_layers": None,
    # A checkpoint without lm_head gets the target's lm_head (EagleProposer._maybe_share_lm_head).
    "shares_missing_lm_head": Span(),
    # The loader renames midlayer.* to layers.0.*; both layouts load.
    "layer_prefixes": ("layers.", "midlayer."),
}

SPEC_METHODS = {"eagle3": "eagle3", "eagle": "eagle", "mtp": "mtp", "ngram": "ngram"}


class VLLM(EngineAdapter):
    name = "vllm"
    versions = VERSIONS
    capabilities = CAPABILITIES
    flags = FLAGS
    load_formats = LOAD_FORMATS
    launch_hint = "vllm serve --help=all"
    health = Health(
        liveness="/health",
        readiness="/health",
        meaning="The API server listens only after the model is loaded; /health returns 200 while the "
                "engine core is alive and 503 once it has died (the process may still exit 0).",
    )
    metrics = Metrics(
        spec_counters={
            "drafts": "vllm:spec_decode_num_drafts_total",
            "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
            "accepted_tokens_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        },
        serving={
            "ttft": "vllm:time_to_first_token_seconds",
            "itl": "vllm:inter_token_latency_seconds",
            "generation_tokens": "vllm:generation_tokens_total",
            "prompt_tokens": "vllm:prompt_tokens_total",
            "running": "vllm:num_requests_running",
            "waiting": "vllm:num_requests_waiting",
            "kv_cache": "vllm:kv_cache_usage_perc",
        },
    )

    def spec_config(self, hv, drafter_path: str | None) -> dict:
        cfg = {"method": SPEC_METHODS[hv.specdeploy_spec_method],
               "num_speculative_tokens": hv.specdeploy_spec_num_tokens}
        if drafter_path and hv.specdeploy_spec_method in ("eagle3", "eagle", "mtp"):
            cfg["model"] = drafter_path
        cfg.update(hv.specdeploy_spec_config_extra)
        return cfg

    def spec_config_problems(self, hv, host):
        out = []
        for key in hv.specdeploy_spec_config_extra:
            span = SPEC_KEYS.get(key)
            if span is None or not span.contains(self.version):
                if span is not None and span.until:
                    why = f"was removed in vLLM {span.until}"
                elif span is not None:
                    why = f"exists only from vLLM {span.since}"
                else:
                    why = "is not a SpeculativeConfig key"
                valid = sorted(k for k, s in SPEC_KEYS.items() if s.contains(self.version))
                out.append(Finding("error", f"specdeploy_spec_config_extra.{key}",
                                   f"'{key}' {why}; vLLM {self.version} rejects unknown keys at startup",
                                   f"remove it; keys valid on {self.version}: {', '.join(valid)}", host))
        return out

    def allreduce_paths(self, ctx: CommContext) -> list[AllReducePath]:
        out = []
        cc, ws = ctx.compute_capability, ctx.world_size
        symm = ctx.multicast and ws in SYMM_MEM_MAX.get(cc, {})
        sizes = next(s for span, s in CUSTOM_AR_WORLD_SIZES if span.contains(self.version))
        if ctx.custom_all_reduce and ws in sizes and (ws == 2 or ctx.nvlink):
            cap = min(CUSTOM_AR_MAX_WITH_SYMM_MEM.get(cc, {}).get(ws, CUSTOM_AR_MAX), CUSTOM_AR_MAX) if symm \
                else CUSTOM_AR_MAX
            out.append(AllReducePath("custom all-reduce", cap, False,
                                     f"vLLM {self.version} CustomAllreduce: size < {cap} bytes"
                                     + (" (capped while symmetric memory is active)" if symm else "")))
        if symm:
            cap = SYMM_MEM_MAX[cc][ws]
            incl = SYMM_MEM_INCLUSIVE.contains(self.version)
            out.append(AllReducePath("torch symmetric-memory all-reduce", cap, incl,
                                     f"vLLM {self.version} SymmMemCommunicator (VLLM_ALLREDUCE_USE_SYMM_MEM=1, "
                                     f"NVSwitch multicast): size {'<=' if incl else '<'} {cap} bytes"))
        if FI_FUSION.contains(self.version) and ws > 1 and ws in FI_FUSION_MAX.get(cc, {}):
            cap = FI_FUSION_MAX[cc][ws]
            out.append(AllReducePath("FlashInfer all-reduce+RMSNorm fusion", cap, False,
                                     f"vLLM {self.version} fuse_allreduce_rms (default at -O2 on "
                                     f"SM{cc.replace('.', '')}, compiled model): size < {cap} bytes"))
        return out

    def command(self, hv, drafter_path=None) -> Command:
        argv = ["vllm", "serve", hv.specdeploy_model_path,
                "--served-model-name", hv.served_model_name,
                "--host", hv.specdeploy_bind_address,
                "--port", str(hv.specdeploy_port),
                "--tensor-parallel-size", str(hv.tp),
                "--gpu-memory-utilization", str(hv.specdeploy_gpu_memory_utilization)]
        if hv.specdeploy_expert_parallel:
            argv.append("--enable-expert-parallel")
        if hv.specdeploy_max_model_len:
            argv += ["--max-model-len", str(hv.specdeploy_max_model_len)]
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
            argv += ["--speculative-config", dumps_compact(self.spec_config(hv, drafter_path))]
        argv += list(hv.specdeploy_engine_extra_args)
        env = {"VLLM_NO_USAGE_STATS": "1"}
        secret = {"VLLM_API_KEY": "api_key"} if hv.specdeploy_api_key_file else {}
        return Command(argv=argv, env=env, secret_env=secret)
