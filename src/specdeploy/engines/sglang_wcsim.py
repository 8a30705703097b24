"""SGLang's weight-cache daemon (``python -m sglang.srt.weight_cache.daemon``) and an engine with
``--weight-cache-mode client`` as the simulator plays them, read from sglang/srt/weight_cache/ of 0.5.23: the
socket and ready-file templates, the CacheConfig fields, the quantization allowlist, the refusals, the client's
disk fallback (only when the socket file is absent) and its watchdog on the daemon's PID."""
from __future__ import annotations

import json
import os
import time

from specdeploy.engines.base import SimReject
from specdeploy.engines.sglang_tables import WEIGHT_CACHE, WEIGHT_CACHE_QUANT
from specdeploy.engines.weightcache import SimWeightCache

SOCKET_TEMPLATE = "/tmp/sglang_weight_cache_{device_uuid}.sock"  # environ.py defaults
READY_TEMPLATE = "/tmp/sglang_weight_cache_{device_uuid}.ready"


def _log(level: str, msg: str) -> str:
    """One record as SGLang's logger prints it (``[%(asctime)s TPn] %(message)s``: no level)."""
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}"


def _template(env, name: str, default: str) -> str:
    t = env.get(name) or default
    if "{device_uuid}" not in t:
        raise SimReject(f"ValueError: {name}={t!r} must contain '{{device_uuid}}': each physical GPU needs its own "
                        "path, and a GPU-independent one would point every caller at a single daemon.", 1)
    return t


class SGLangWeightCacheSim(SimWeightCache):
    head = ("python", "-m", "sglang.srt.weight_cache.daemon")
    model_option = "model_path"

    def local_ranks(self, opts):
        tp = int(opts.get("tp_size") or 1)
        return max(1, tp // int(opts.get("nnodes") or 1))

    def socket_path(self, opts, env, uuid, draft=False):
        return _template(env, "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE", SOCKET_TEMPLATE).format(device_uuid=uuid)

    def ready_path(self, opts, env, uuid):
        return _template(env, "SGLANG_WEIGHT_CACHE_READY_TEMPLATE", READY_TEMPLATE).format(device_uuid=uuid)

    def daemon_refusal(self, version, opts, env):
        for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
            if "expandable_segments:true" in env.get(var, "").replace(" ", "").lower():
                return (f"RuntimeError: [WeightCacheDaemon] {var} sets expandable_segments:True, which is incompatible "
                        "with CUDA IPC weight sharing")
        if int(opts.get("nnodes") or 1) > 1 and not opts.get("dist_init_method"):
            return "ValueError: dist_init_method is required for multi-node weight cache daemons."
        return None

    def quant_refusal(self, version, quant, where):
        served = WEIGHT_CACHE_QUANT.get(quant)
        if served is not None and served[0]:
            return None
        method = "fp8" if quant.startswith("fp8") else quant
        return (f"sglang.srt.weight_cache.protocol.UnsupportedQuantForIPCError: [weight_cache:{where}] quantization "
                f"method {method!r} is not verified for CUDA IPC zero-copy weight sharing.")

    def key(self, version, opts, model_dir, rank, draft=False):
        """CacheConfig (protocol.py): the model path as given, the parallel layout, quantization, dtype, revision and
        the process's compute capability and torch version."""
        try:
            with open(os.path.join(model_dir, "config.json")) as f:
                cfg = json.load(f)
        except (OSError, ValueError):
            cfg = {}
        tp = int(opts.get("tp_size") or 1)
        return {"model_path": opts.get("model_path"), "model_arch": (cfg.get("architectures") or [""])[0],
                "tp_size": tp, "tp_rank": rank % tp, "pp_size": 1, "pp_rank": 0,
                "dp_size": int(opts.get("dp_size") or 1), "ep_size": int(opts.get("ep_size") or 1),
                "attn_dp_size": int(opts.get("attn_dp_size") or 1), "quant_method": opts.get("quantization") or "",
                "dtype": str(opts.get("dtype") or "auto"), "revision": opts.get("revision") or "",
                "device_capability": "9.0", "torch_version": "sim"}

    def attach(self, version, opts, env):
        mode = opts.get("weight_cache_mode") or "off"
        if mode == "off":
            return None
        if opts.get("speculative_algorithm") and WEIGHT_CACHE["refuses_speculation"].contains(version):
            raise SimReject("ValueError: --weight-cache-mode is not supported together with speculative decoding "
                            "(--speculative-algorithm): the weight cache daemon does not export the draft model's "
                            "weights. Disable one of them (--weight-cache-mode off) for this configuration.", 1)
        return {"socket_dir": None, "fallback": mode == "client", "timeout_s": 30.0, "draft": False,
                "waits": False, "fallback_only_when_absent": True}

    def daemon_lines(self, rank, memory_gib, socket):
        return [_log("INFO", f"[WeightCacheDaemon gpu={rank} tp_rank={rank}] Model loaded from disk"),
                _log("INFO", f"[WeightCacheDaemon gpu={rank}] Listening on {socket}")]

    def daemon_ready_lines(self, ranks, sockets):
        return [_log("INFO", f"All {ranks} weight cache daemons on node 0 are ready (pp_ranks=0..0, "
                             f"tp_ranks=0..{ranks - 1})")]

    def attached_lines(self, ranks, tensors, seconds):
        return [_log("INFO", f"[IpcModelLoader] Fetched {tensors} tensors from daemon (transport=torch_ipc) in "
                             f"{seconds:.2f}s"),
                _log("INFO", f"[IpcModelLoader] Loaded model via IPC (mode=client), total={seconds:.2f}s")]

    def fallback_lines(self, why):
        return [_log("INFO", f"[IpcModelLoader] Daemon socket not found at {why}."),
                _log("WARNING", "[IpcModelLoader] Weight cache not available or config mismatch, falling back to "
                                "disk load")]

    def failure(self, why):
        return "\n".join([_log("ERROR", "Scheduler hit an exception: Traceback (most recent call last):"),
                          '  File "/sgl-workspace/sglang/python/sglang/srt/weight_cache/ipc_loader.py", line 120, '
                          "in load_model", why]) + "\n"

    def watches_daemon(self, version):
        if not WEIGHT_CACHE["engine_watches_daemon"].contains(version):
            return None
        return ("[IpcModelLoader] Weight cache daemon (pid={pid}) died while this engine holds its weights via CUDA "
                "IPC. The mapped weight pointers are now dangling; continuing would read freed GPU memory. "
                "Terminating this process.")

    def refusal_line(self, kind, path, detail, cfg):
        if kind == "mismatch":
            return f"RuntimeError: [IpcModelLoader] Daemon config mismatch!  Engine and daemon differ on: {detail}"
        if kind == "refused":
            return (f"RuntimeError: [IpcModelLoader] Daemon socket exists at {path} but refused the connection. The "
                    "daemon may have crashed after creating the socket. Check daemon logs.")
        return (f"RuntimeError: [IpcModelLoader] Weight cache daemon not available at {path}. In daemon mode, "
                "fallback to disk loading is disabled")

    def falls_back(self, kind, cfg):
        return kind == "absent" and bool(cfg.get("fallback"))

