"""vLLM's weight-cache daemon (``vllm preload``) and an engine with ``--load-format ipc_cache`` as the simulator
plays them, read from weight_cache/{daemon,ipc_loader,protocol}.py and entrypoints/cli/preload.py of 0.32.0: the
socket names, the WeightCacheKey fields, the loader's extra-config keys, its startup wait and fallback, the
quantization check, and the log lines."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time

from specdeploy.engines.base import SimReject
from specdeploy.engines.vllm_tables import (WEIGHT_CACHE, WEIGHT_CACHE_LOADER_KEYS, WEIGHT_CACHE_QUANT,
                                           WEIGHT_CACHE_QUANT_EXAMPLE)
from specdeploy.engines.weightcache import SimWeightCache

PROTOCOL = "vllm.model_executor.model_loader.weight_cache.protocol"
DRAFT_METHODS = ("mtp", "eagle", "eagle3")  # utils.WEIGHT_CACHE_DRAFT_METHODS


def _record(proc: str, pid: int, level: str, where: str, msg: str) -> str:
    return f"({proc} pid={pid}) {level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}"


def checkpoint_hash(model: str) -> str | None:
    """protocol.hash_checkpoint: the safetensors headers (length prefix and JSON) of every shard, by file name."""
    if not os.path.isdir(model):
        return None
    files = sorted((f for f in os.listdir(model) if f.endswith(".safetensors")))
    if not files:
        return None
    h = hashlib.md5(usedforsecurity=False)
    for name in files:
        h.update(name.encode())
        with open(os.path.join(model, name), "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            h.update(head + f.read(min(n, 100 << 20)))
    return h.hexdigest()


class VLLMWeightCacheSim(SimWeightCache):
    head = ("vllm", "preload")
    model_option = "model"

    def local_ranks(self, opts):
        tp = int(opts.get("tensor_parallel_size") or 1)
        nnodes = int(opts.get("nnodes") or 1)
        if opts.get("data_parallel_size_local"):
            return int(opts["data_parallel_size_local"]) * tp
        return max(1, tp // nnodes)

    def socket_path(self, opts, env, uuid, draft=False):
        d = opts.get("weight_cache_socket_dir") or opts.get("socket_dir") or os.path.join(
            tempfile.gettempdir(), f"vllm_weight_cache_{os.getuid()}")
        gpu = hashlib.md5(uuid.encode(), usedforsecurity=False).hexdigest()
        return os.path.join(d, f"vllm_weight_cache_{gpu}{'_draft' if draft else ''}.sock")

    def health(self, opts):
        port = opts.get("weight_cache_health_port")
        return (str(opts.get("weight_cache_health_host") or "0.0.0.0"), int(port)) if port else None

    def daemon_refusal(self, version, opts, env):
        if opts.get("load_format") == "ipc_cache":
            return ("ValueError: The weight cache daemon itself must load from disk; use the default --load-format")
        if int(opts.get("nnodes") or 1) > 1 and not opts.get("weight_cache_master_port"):
            return "ValueError: --weight-cache-master-port is required when the daemons span nodes"
        return None

    def quant_refusal(self, version, quant, where):
        served = WEIGHT_CACHE_QUANT.get(quant)
        if served is None or served[0]:
            return None
        method = WEIGHT_CACHE_QUANT_EXAMPLE.get(quant, served[1][-1])
        return (f"{PROTOCOL}.UnsupportedQuantForIPCError: layer model.layers.1.mlp.experts: {method} does not "
                "support loading from pre-processed weights.")

    def key(self, version, opts, model_dir, rank, draft=False):
        """WeightCacheKey.from_model_config (0.32.0): a daemon and an engine with the same key share weights."""
        try:
            with open(os.path.join(model_dir, "config.json")) as f:
                cfg = json.load(f)
        except (OSError, ValueError):
            cfg = {}
        q = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
        tp = int(opts.get("tensor_parallel_size") or 1)
        dp = int(opts.get("data_parallel_size") or 1)
        return {"checkpoint": checkpoint_hash(model_dir) or model_dir,
                "model_arch": ",".join(cfg.get("architectures") or []), "tp_size": tp, "tp_rank": rank % tp,
                "dtype": str(opts.get("dtype") or cfg.get("torch_dtype") or "auto"),
                "quantization": opts.get("quantization"),
                "quant_config_hash": hashlib.md5(json.dumps(q, sort_keys=True).encode(),
                                                 usedforsecurity=False).hexdigest(),
                "revision": opts.get("revision"), "vllm_version": version, "pp_size": 1, "pp_rank": 0,
                "is_draft": draft, "dp_size": dp, "dp_rank": rank // tp}

    def attach(self, version, opts, env):
        if opts.get("load_format") != "ipc_cache":
            return None
        raw = opts.get("model_loader_extra_config") or "{}"
        try:
            extra = json.loads(raw) if isinstance(raw, str) else {}
        except ValueError:
            raise SimReject(f"ValueError: --model-loader-extra-config is not JSON: {raw!r}", 1) from None
        unknown = sorted(k for k in extra if k not in WEIGHT_CACHE_LOADER_KEYS or not
                         WEIGHT_CACHE_LOADER_KEYS[k].contains(version))
        if unknown:
            raise SimReject(f"ValueError: Unexpected extra config keys for load format ipc_cache: {unknown}", 1)
        spec = {}
        try:
            spec = json.loads(opts.get("speculative_config") or "{}")
        except ValueError:
            pass
        draft = (isinstance(spec, dict) and spec.get("method") in DRAFT_METHODS and not spec.get("draft_load_config")
                 and WEIGHT_CACHE["draft_group"].contains(version))
        return {"socket_dir": extra.get("socket_dir"), "fallback": bool(extra.get("fallback", True)),
                "timeout_s": float(extra.get("state_timeout_s", 300.0)), "draft": draft,
                "waits": WEIGHT_CACHE["startup_wait"].contains(version)}

    def daemon_lines(self, rank, memory_gib, socket):
        where = "daemon.py:300"
        return [_record(f"vllm-weight-cache-target-{rank}", 5000 + rank, "INFO", where,
                        f"Weight cache target daemon rank {rank} loaded model ({memory_gib:.2f} GiB allocated, "
                        f"{memory_gib + 0.5:.2f} GiB reserved)"),
                _record(f"vllm-weight-cache-target-{rank}", 5000 + rank, "INFO", where,
                        f"Weight cache target daemon rank {rank} serving on {socket}")]

    def daemon_ready_lines(self, ranks, sockets):
        return [f"INFO {time.strftime('%m-%d %H:%M:%S')} [preload.py:313] ===== Weight cache daemon READY: node 0/1 "
                f"serving {ranks} local rank(s) x 1 role(s) in {sockets} ====="]

    def attached_lines(self, ranks, tensors, seconds):
        return [_record(f"Worker_TP{r}", 4100 + r, "INFO", "ipc_loader.py:285",
                        f"Mapped {tensors} tensors from the weight cache daemon (zero_copy mode)")
                for r in range(ranks)]

    def fallback_lines(self, why):
        return [_record("Worker_TP0", 4100, "WARNING", "ipc_loader.py:226",
                        f"Weight cache unusable ({why}); falling back to disk loading")]

    def failure(self, why):
        head = "(EngineCore_DP0 pid=4000) ERROR {ts} [core.py:866] ".format(ts=time.strftime("%m-%d %H:%M:%S"))
        return "".join(head + line + "\n" for line in (
            "EngineCore failed to start.", "Traceback (most recent call last):",
            '  File "/opt/venv/lib/python3.12/site-packages/vllm/model_executor/model_loader/weight_cache/'
            'ipc_loader.py", line 213, in load_model', "    state = self._fetch_entries(model_config)", why))

    def refusal_line(self, kind, path, detail, cfg):
        if kind == "mismatch":
            return f"{PROTOCOL}.CacheConfigMismatchError: WeightCacheKey mismatch on fields: {detail}"
        if kind == "refused":
            why = f"Cannot connect to weight cache daemon at {path}: [Errno 111] Connection refused"
        else:
            why = (f"Weight cache socket {path} is unavailable: [Errno 2] No such file or directory: '{path}'")
        if cfg.get("waits") and not cfg.get("fallback"):
            why = f"Weight cache daemon did not become ready within {cfg['timeout_s']:.1f}s: {why}"
        return f"{PROTOCOL}.WeightCacheUnavailableError: {why}"

