"""vLLM in its own log: the failures triage knows by their text, and the lines that show a start's progress."""
from __future__ import annotations

import re

from specdeploy.engines.base import LoadLog, Signature


def signatures(kimi_since: str) -> tuple[Signature, ...]:
    """``kimi_since``: the first release that serves Kimi-K2.5 / DeepSeek as an EAGLE-3 target unpatched."""
    short = ".".join(kimi_since.split(".")[:2])
    return (
        Signature("kimi-image-token-index", "high",
                  re.compile(r"'KimiK25Config' object has no attribute 'image_token_index'"),
                  f"vLLM < {short} reads image_token_index, which Kimi-K2.5's config lacks: set "
                  f"specdeploy_engine_patches: auto (patched image) or pin vLLM >= {kimi_since}."),
        Signature("eagle3-interface-missing", "high",
                  re.compile(r"does not support EAGLE3 interface but aux_hidden_state_outputs"),
                  f"DeepseekV2/V3 (and KimiK25) do not implement SupportsEagle3 before vLLM {short}: set "
                  f"specdeploy_engine_patches: auto or pin vLLM >= {kimi_since}."),
        Signature("eagle3-target-whitelist", "high",
                  re.compile(r"(?i)eagle3 is only supported for|is only supported for \[.*llama"),
                  f"This vLLM accepts EAGLE-3 only for the target model types its message lists: for "
                  f"Kimi-K2.5/DeepSeek (rejected before {short}) set specdeploy_engine_patches: auto or pin vLLM >= "
                  f"{kimi_since}; for other targets use a vLLM that lists the model type."),
        Signature("speculators-supports-eagle3", "high",
                  re.compile(r"(?i)supports_eagle3|does not support eagle ?3(?! interface)"),
                  f"The speculators hidden-state worker checks supports_eagle3 on the top-level KimiK25 wrapper: use "
                  f"a vLLM with SupportsEagle3 on KimiK25ForConditionalGeneration (>= {kimi_since}, or the patched "
                  f"image)."),
        Signature("scheduler-is-encoder-decoder", "high",
                  re.compile(r"SchedulerConfig.*is_encoder_decoder|is_encoder_decoder.*SchedulerConfig"),
                  "The speculators release predates this vLLM (SchedulerConfig gained is_encoder_decoder): install a "
                  "speculators release built for the pinned vLLM."),
        Signature("vllm-kernels-not-loaded", "medium",
                  re.compile(r"'_OpNamespace' '_\w*C' object has no attribute"),
                  "vLLM's compiled kernels lack this op: its extension (vllm/_C*.so) did not load, or was built for "
                  "another torch, device or CPU: look for 'Failed to import from vllm._C' earlier in the log, run "
                  "`python -c 'import vllm._C'` with the engine's Python to see the loader's error (a missing "
                  "shared library such as libnuma.so.1 for the CPU builds), and install the vLLM build that matches "
                  "this torch and device."),
        Signature("spec-decode-unsupported", "high", re.compile(r"spec decode is not supported"),
                  "This engine build's model runner has no speculative decoding on this platform (vLLM's CPU model "
                  "runner asserts it in 0.16.0 to 0.19.0; the assertion is gone from 0.20.0, and 0.32.0 runs EAGLE-3 "
                  "on CPU): serve without speculation there (specdeploy_spec_enabled: false) or use a release whose "
                  "runner supports it."),
        *WEIGHT_CACHE_SIGNATURES,
    )


# The weight-cache daemon and the ipc_cache loader (model_loader/weight_cache/ of 0.30.0 to 0.33.0), in their words.
_DAEMON = "the weight-cache daemon (specdeploy-vllm-weights.service)"
WEIGHT_CACHE_SIGNATURES = (
    Signature("weight-cache-daemon-missing", "high",
              re.compile(r"WeightCacheUnavailableError: (?:Weight cache daemon did not become ready|Cannot connect to "
                         r"weight cache daemon|Weight cache socket \S+ is unavailable)"),
              f"The engine was started attached to {_DAEMON}, and no daemon serves its socket: `systemctl status "
              "specdeploy-vllm-weights` and `journalctl -u specdeploy-vllm-weights` say why it is down. Starting the "
              "engine starts the daemon first (a full load), as does the next deploy; set specdeploy_weight_cache: "
              "off to load from disk instead."),
    Signature("weight-cache-mismatch", "high",
              re.compile(r"CacheConfigMismatchError|WeightCacheKey mismatch on fields|Weight cache role mismatch"),
              f"{_DAEMON[0].upper()}{_DAEMON[1:]} holds other weights than the engine asks for (the fields the "
              "message names: checkpoint, quantization, dtype, tensor/data-parallel ranks, vllm_version): redeploy, "
              "which restarts the daemon with the engine's model, quantization, layout and release (a full load)."),
    Signature("weight-cache-quantization", "high",
              re.compile(r"UnsupportedQuantForIPCError|does not support loading from pre-processed weights"),
              "This checkpoint's quantization cannot be served from vLLM's weight cache (a layer's quant method does "
              "not support pre-processed weights): set specdeploy_weight_cache: off, or serve a checkpoint whose "
              "quantization it takes (unquantized, FP8, ModelOpt NVFP4, MXFP4)."),
    Signature("weight-cache-platform", "high",
              re.compile(r"UnsupportedPlatformForIPCError|does not support CUDA IPC weight sharing"),
              "The weight cache shares weights over CUDA IPC, which only CUDA and ROCm have: set "
              "specdeploy_weight_cache: off on this platform."),
    Signature("weight-cache-memory", "high",
              re.compile(r"Externally held weights on device \S+ \([^)]*\) exceed the desired GPU memory utilization|"
                         r"is less than the engine's budget after excluding external process's weights"),
              "The weights the daemon holds and the engine's own budget do not fit on the GPU together: "
              "specdeploy_gpu_memory_utilization counts the daemon's weights (raise it, within what `specdeploy "
              "preflight` accounts), or free the GPU of other processes (a second daemon, a leftover engine)."),
    Signature("weight-cache-daemon-running", "high", re.compile(r"Another weight cache daemon already owns"),
              "Another weight-cache daemon holds this GPU's socket: stop it (systemctl stop "
              "specdeploy-vllm-weights, or the process `fuser` names on the socket's .lock file) before starting "
              "this one."),
)


LOAD_LOG = LoadLog(
    shards=re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)"),
    kv_tokens=re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    graphs=re.compile(r"(?:Capturing CUDA graphs?[^:]*):\s+(\d+)%\|[^|]*\| (\d+)/(\d+)"),
    graphs_done=re.compile(r"Graph capturing finished in"),
    ready=re.compile(r"Application startup complete"),
    attached=re.compile(r"Mapped \d+ tensors from the weight cache daemon"),
    disk_fallback=re.compile(r"Weight cache unusable \(.*\); falling back to disk loading|Weight cache IPC loading "
                             r"failed; falling back to disk loading"),
    daemon_ready=re.compile(r"===== Weight cache daemon READY"),
    daemon_memory=re.compile(r"Weight cache \w+ daemon rank \d+ loaded model \(([\d.]+) GiB allocated"),
    starting=(r"Starting to load model|Loading model weights|Memory profiling|Capturing (?:CUDA )?graph|"
              r"Compiling a graph|Initializing a V\d LLM engine|Starting .*vLLM"),
    serving=r"Starting vLLM API server on",
)
