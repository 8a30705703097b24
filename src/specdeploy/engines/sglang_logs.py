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
)

LOAD_LOG = LoadLog(
    shards=re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)"),
    kv_tokens=re.compile(r"KV Cache is allocated\. #tokens: (\d+)"),
    graphs=re.compile(r"(?:Capturing batches \([^)]*\)):\s+(\d+)%\|[^|]*\| (\d+)/(\d+)"),
    graphs_done=re.compile(r"Capture cuda graph end"),
    ready=re.compile(r"The server is fired up and ready to roll"),
    starting=r"Load weight begin|Init torch distributed|Capture cuda graph begin",
    serving=r"The server is fired up and ready",
)
