"""SGLang in its own log: the failures triage knows by their text, and the lines that show a start's progress."""
from __future__ import annotations

import re

from specdeploy.engines.base import LoadLog, Signature

SIGNATURES = (
    Signature("sglang-custom-allreduce-pcie", "high",
              re.compile(r"CustomAllReduceV2' object has no attribute|Custom all-?reduce.*(?:not supported|failed)",
                         re.IGNORECASE),
              "SGLang's custom all-reduce breaks during CUDA-graph capture without NVLink: set "
              "specdeploy_custom_all_reduce: false (--disable-custom-all-reduce)."),
    Signature("request-slots-exhausted", "medium", re.compile(r"alloc_req_slots runs out of memory"),
              "The request pool is smaller than the running batch: lower --max-running-requests or raise "
              "--mem-fraction-static."),
    # the weight-cache daemon and its client (sglang/srt/weight_cache/ of 0.5.17 to 0.5.23), in their words
    Signature("weight-cache-daemon-died", "high",
              re.compile(r"Weight cache daemon \(pid=\d+\) died while this engine holds its weights"),
              "The weight-cache daemon (specdeploy-sglang-weights.service) went away while the engine mapped its "
              "weights, and the engine killed itself as the release does: `journalctl -u specdeploy-sglang-weights` "
              "says why the daemon ended; starting the engine starts the daemon first (a full load).", line=True),
    Signature("weight-cache-refused-connection", "high",
              re.compile(r"\[IpcModelLoader\] Daemon socket exists at \S+ but refused the connection"),
              "The weight-cache daemon's socket is there but nothing answers (the daemon crashed after binding it): "
              "restart the daemon (systemctl restart specdeploy-sglang-weights, a full load) or redeploy."),
    Signature("weight-cache-mismatch", "high", re.compile(r"\[IpcModelLoader\] Daemon config mismatch"),
              "The weight-cache daemon holds other weights than the engine asks for (model path, TP/EP/DP ranks, "
              "quantization, dtype, revision, the GPU's compute capability or torch version differ): redeploy, "
              "which restarts the daemon with the engine's configuration (a full load)."),
    Signature("weight-cache-quantization", "high",
              re.compile(r"is not verified for CUDA IPC zero-copy weight sharing"),
              "SGLang's weight cache serves only unquantized and block-wise FP8 checkpoints: set "
              "specdeploy_weight_cache: off for this checkpoint."),
    Signature("weight-cache-speculation", "high",
              re.compile(r"--weight-cache-mode is not supported together with speculative decoding"),
              "This SGLang refuses its weight cache with speculative decoding: set specdeploy_weight_cache: off (or "
              "auto, which leaves it off with speculation on)."),
    Signature("weight-cache-daemon-running", "high",
              re.compile(r"Weight cache daemon for GPU \S+ is already running"),
              "A weight-cache daemon already runs on this GPU: stop it (systemctl stop specdeploy-sglang-weights) "
              "before starting another."),
    Signature("weight-cache-expandable-segments", "high",
              re.compile(r"sets expandable_segments:True, which is incompatible with CUDA IPC"),
              "The daemon's environment asks for PyTorch's expandable segments, whose memory CUDA IPC cannot "
              "export: remove expandable_segments from PYTORCH_CUDA_ALLOC_CONF for the daemon (specdeploy's daemon "
              "unit leaves it out; the engine may keep it)."),
)

LOAD_LOG = LoadLog(
    shards=re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)"),
    kv_tokens=re.compile(r"KV Cache is allocated\. #tokens: (\d+)"),
    graphs=re.compile(r"(?:Capturing batches \([^)]*\)):\s+(\d+)%\|[^|]*\| (\d+)/(\d+)"),
    graphs_done=re.compile(r"Capture cuda graph end"),
    ready=re.compile(r"The server is fired up and ready to roll"),
    attached=re.compile(r"\[IpcModelLoader\] Loaded model via IPC"),
    disk_fallback=re.compile(r"\[IpcModelLoader\] Weight cache not available or config mismatch, falling back to "
                             r"disk load"),
    daemon_ready=re.compile(r"All \d+ weight cache daemons on node \d+ are ready"),
    starting=r"Load weight begin|Init torch distributed|Capture cuda graph begin",
    serving=r"The server is fired up and ready",
)
