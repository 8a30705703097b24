"""SGLang adapter (0.5.x up to 0.5.23)."""
from __future__ import annotations

from ..errors import Finding
from . import AllReducePath, Command, CommContext, EngineAdapter, Health, Metrics, Span

VERSIONS = (
    "0.5.1", "0.5.1.post1", "0.5.1.post2", "0.5.1.post3", "0.5.2", "0.5.3", "0.5.3.post1", "0.5.3.post2",
    "0.5.3.post3", "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3", "0.5.5", "0.5.5.post1",
    "0.5.5.post2", "0.5.5.post3", "0.5.6", "0.5.6.post1", "0.5.6.post2", "0.5.7", "0.5.8", "0.5.8.post1",
    "0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1",
    "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
    "0.5.22", "0.5.23",
)

CAPABILITIES = {
    # KimiK25ForConditionalGeneration delegates set_eagle3_layers_to_capture to its language model
    # (first seen in the 0.5.10 wheel; absent in 0.5.9).
    "kimi_eagle3": Span("0.5.10"),
    # --config YAML file: lets the API key stay off the command line.
    "config_file": Span("0.5.10"),
}

FLAGS = {f: Span() for f in (
    "--model-path", "--served-model-name", "--host", "--port", "--tp-size", "--ep-size", "--context-length",
    "--mem-fraction-static", "--trust-remote-code", "--enable-metrics", "--disable-custom-all-reduce",
    "--attention-backend", "--speculative-algorithm", "--speculative-draft-model-path",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
    "--config", "--kv-cache-dtype", "--max-running-requests", "--chunked-prefill-size",
    "--tool-call-parser", "--reasoning-parser", "--watchdog-timeout",
    "--dist-timeout", "--page-size", "--moe-runner-backend", "--speculative-draft-model-quantization")}

# All-reduce paths in front of NCCL, read from sglang/srt/distributed/ (custom_all_reduce.py,
# parallel_state.py) in the 0.5.1, 0.5.10, 0.5.16 and 0.5.23 wheels. The custom all-reduce (world sizes 2, 4, 6,
# 8; on more than two GPUs only with full NVLink) takes size <= 8 MiB on CUDA. MSCCL++, torch symmetric memory
# and the PCIe-IPC all-reduce (0.5.23) are off unless enabled, so they are not listed.
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_AR_MAX = 8192 * 1024
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
# The doctor (drafter.py) consults this table.
DRAFTER = {
    # EntryClass names a drafter config may use (no aliasing: the name must match).
    "archs": {"LlamaForCausalLMEagle3": Span(), "Eagle3DeepseekV2ForCausalLM": Span("0.5.12")},
    "mla_archs": {"Eagle3DeepseekV2ForCausalLM"},
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
    "lm_head_from_target_without_draft_vocab_size": Span(),
    # The Llama EAGLE-3 decoder layer implements only norm_before_residual = False.
    "norm_before_residual": False,
}

ALGORITHMS = {"eagle3": "EAGLE3", "eagle": "EAGLE", "mtp": "NEXTN", "ngram": "NGRAM"}


class SGLang(EngineAdapter):
    name = "sglang"
    versions = VERSIONS
    capabilities = CAPABILITIES
    flags = FLAGS
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
    )

    def spec_config_problems(self, hv, host):
        out = []
        for key in hv.specdeploy_spec_config_extra:
            flag = "--speculative-" + key.replace("_", "-").removeprefix("speculative-")
            if not self.flag_exists(flag):
                out.append(Finding("error", f"specdeploy_spec_config_extra.{key}",
                                   f"SGLang {self.version} has no {flag} flag specdeploy knows",
                                   "use num_steps, eagle_topk, num_draft_tokens, draft_model_quantization "
                                   "or pass the flag in specdeploy_engine_extra_args", host))
        return out

    def spec_flags(self, hv, drafter_path):
        k = hv.specdeploy_spec_num_tokens
        extra = {key.removeprefix("speculative_"): v for key, v in hv.specdeploy_spec_config_extra.items()}
        topk = int(extra.pop("eagle_topk", 1))
        steps = int(extra.pop("num_steps", k))
        draft_tokens = int(extra.pop("num_draft_tokens", steps + 1 if topk == 1 else k + 1))
        argv = ["--speculative-algorithm", ALGORITHMS[hv.specdeploy_spec_method]]
        if drafter_path and hv.specdeploy_spec_method in ("eagle3", "eagle"):
            argv += ["--speculative-draft-model-path", drafter_path]
        if hv.specdeploy_spec_method != "ngram":
            argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                     "--speculative-num-draft-tokens", str(draft_tokens)]
        for key, v in extra.items():
            argv += ["--speculative-" + key.replace("_", "-"), str(v)]
        return argv

    def allreduce_paths(self, ctx: CommContext) -> list[AllReducePath]:
        out = []
        ws = ctx.world_size
        if ctx.custom_all_reduce and ws in CUSTOM_AR_WORLD_SIZES and (ws == 2 or ctx.nvlink):
            out.append(AllReducePath("custom all-reduce", CUSTOM_AR_MAX, True,
                                     f"SGLang {self.version} CustomAllreduce: size <= {CUSTOM_AR_MAX} bytes"))
        if ws > 1 and ctx.compute_capability in FI_FUSION_CC and not FI_FUSION_ABSENT.contains(self.version):
            known = FI_FUSION_AUTO.contains(self.version)
            out.append(AllReducePath("FlashInfer all-reduce fusion", None, False,
                                     f"SGLang {self.version} "
                                     + ("enables it for Kimi-K2.5 on SM90/SM100" if known else
                                        "may enable it for Kimi-K2.5 (release not read)")
                                     + "; its size bound is not recorded"))
        return out

    def command(self, hv, drafter_path=None) -> Command:
        argv = ["python", "-m", "sglang.launch_server",
                "--model-path", hv.specdeploy_model_path,
                "--served-model-name", hv.served_model_name,
                "--host", hv.specdeploy_bind_address,
                "--port", str(hv.specdeploy_port),
                "--tp-size", str(hv.tp),
                "--mem-fraction-static", str(hv.specdeploy_gpu_memory_utilization),
                "--enable-metrics"]
        if hv.specdeploy_expert_parallel:
            argv += ["--ep-size", str(hv.tp)]
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
        if hv.specdeploy_api_key_file:
            # The key lives in a 0600 YAML file handed over by systemd's LoadCredential=.
            argv += ["--config", "${CREDENTIALS_DIRECTORY}/sglang-api-key.yaml"]
        argv += list(hv.specdeploy_engine_extra_args)
        return Command(argv=argv, env={}, secret_env={})
