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
    )


LOAD_LOG = LoadLog(
    shards=re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)"),
    kv_tokens=re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    graphs=re.compile(r"(?:Capturing CUDA graphs?[^:]*):\s+(\d+)%\|[^|]*\| (\d+)/(\d+)"),
    graphs_done=re.compile(r"Graph capturing finished in"),
    ready=re.compile(r"Application startup complete"),
    starting=(r"Starting to load model|Loading model weights|Memory profiling|Capturing (?:CUDA )?graph|"
              r"Compiling a graph|Initializing a V\d LLM engine|Starting .*vLLM"),
    serving=r"Starting vLLM API server on",
)
