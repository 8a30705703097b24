"""The weight-cache daemon as specdeploy drives it, engine-independent: the value types an adapter answers with and
the answers every adapter shares (a release without a daemon, the checkpoint's quantization, the memory the daemon
costs). Each adapter overrides ``weight_cache_daemon`` and ``weight_cache_engine`` from its release tables
(``WEIGHT_CACHE`` and the rest in ``engines/<name>_tables.py``).

A daemon holds the post-quantization, tensor-parallel-sharded weights of each local rank in GPU memory and hands
CUDA IPC handles to the engine over a Unix socket, so an engine restart maps the weights instead of reading them.
It must have been started with what the engine fingerprints (the checkpoint, its quantization and dtype, the
TP/DP/EP layout and ranks, the release); the engine refuses anything else."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from specdeploy.values.errors import Finding

# Memory the daemon takes on each GPU beyond its weights, which the engine's budget does not count: its CUDA
# context, the world group it holds open (NCCL communicator buffers) and allocator slack. An estimate, not a
# measurement: on a host, `nvidia-smi --query-compute-apps=pid,used_memory` shows the daemon's real figure.
DAEMON_OVERHEAD_GIB = 2.0
# The engine's own CUDA context, outside any fraction it is given (an estimate, as above).
ENGINE_CONTEXT_GIB = 1.0


def quant_kind(config: dict | None) -> str:
    """The checkpoint's quantization as the weight-cache tables key it: ``none``, ``fp8-block`` (FP8 with
    ``weight_block_size``), ``fp8``, ``compressed-tensors``, ``modelopt-nvfp4``, ``modelopt-fp8``, ``mxfp4``, or the
    ``quant_method`` as written. ``config``: config.json (its ``text_config`` is looked into too)."""
    config = config or {}
    q = config.get("quantization_config")
    text = config.get("text_config")
    if not isinstance(q, dict) and isinstance(text, dict):
        q = text.get("quantization_config")
    if not isinstance(q, dict) or not q:
        return "none"
    method = str(q.get("quant_method") or "").strip().lower().replace("_", "-")
    if method == "fp8":
        return "fp8-block" if q.get("weight_block_size") else "fp8"
    if method in ("modelopt", "modelopt-fp4"):
        algo = str(q.get("quant_algo") or ("NVFP4" if method == "modelopt-fp4" else "")).upper()
        return "modelopt-nvfp4" if "FP4" in algo else "modelopt-fp8" if "FP8" in algo else f"modelopt-{algo.lower()}"
    return method or "none"


@dataclass
class Daemon:
    """One host's weight-cache daemon as its unit runs it: the launcher's command line and environment, how
    specdeploy knows it is ready (``health``: an HTTP URL, or ``files:GLOB:N``: N ready files each naming a live
    process), where its sockets are, and what an engine attached to it does."""

    argv: list[str]
    env: dict[str, str]
    health: str
    socket_dir: str
    local_ranks: int
    drafter: str            # how the drafter loads
    host_pid: bool = False  # the engine checks the daemon's PID: a container needs the host's PID namespace
    engine_outlives: bool = False  # the release's engine keeps serving when its daemon exits
    without_daemon: str = ""  # what the engine does when it starts and no daemon serves
    notes: list[str] = field(default_factory=list)


@dataclass
class Support:
    """Whether a release attaches engines to a weight-cache daemon for a host: True, False, or None where it
    cannot be known here (the checkpoint's quantization unread); ``why`` says which and why."""

    ok: bool | None
    why: str
    first: str | None = None           # the first release with a daemon
    first_rendered: str | None = None  # the first release specdeploy attaches engines to it


class WeightCacheAdapter:
    """The weight-cache part of the adapter interface (``EngineAdapter`` inherits it). The defaults answer for an
    engine without a daemon."""

    weight_cache_table: dict = {}     # capability -> Span (``daemon`` is the one every engine has)
    weight_cache_rendered = None      # the releases whose daemon specdeploy renders (a Span)
    weight_cache_rendered_why = ""    # why not the releases before it
    weight_cache_quant: dict = {}     # quant_kind -> (served, the classes that decide)
    weight_cache_quant_read: tuple[str, ...] = ()
    compile_cache_table: dict = {}    # environment variable -> (sub-directory, Span)
    weight_cache_host_pid = False     # the engine checks its daemon's PID: one PID namespace for both containers

    @staticmethod
    def _attached(hv) -> bool:
        """The plan resolved this host's engine onto its weight-cache daemon (``specdeploy_weight_cache`` is
        ``on``; the plan turns ``auto`` into ``on`` or ``off`` before it asks for the command line)."""
        return getattr(hv, "specdeploy_weight_cache", "off") == "on"

    def _wc_has(self, key: str) -> bool:
        span = self.weight_cache_table.get(key)
        return span is not None and span.contains(self.version)

    def weight_cache_first(self) -> tuple[str | None, str | None]:
        """(the first release with a daemon, the first whose daemon specdeploy renders) among the adapter's."""
        daemon = self.weight_cache_table.get("daemon")
        first = next((v for v in self.versions if daemon is not None and daemon.contains(v)), None)
        rendered = next((v for v in self.versions if self.weight_cache_rendered is not None
                         and self.weight_cache_rendered.contains(v)), None)
        return first, rendered

    def weight_cache_support(self, hv, quant: str | None) -> Support:
        """Whether this release attaches ``hv``'s engine to a weight-cache daemon, for a checkpoint of quantization
        ``quant`` (``quant_kind``; None: not known here). The inventory's ``specdeploy_weight_cache`` is not read."""
        first, rendered = self.weight_cache_first()
        label = f"{self.label} {self.version}"
        if not self._wc_has("daemon"):
            where = (f"the first {self.label} release with one is {first}; specdeploy attaches engines to it from "
                     f"{rendered}") if first else f"no {self.label} release specdeploy knows has one"
            return Support(False, f"{label} has no weight-cache daemon ({where})", first, rendered)
        if self.weight_cache_rendered is None or not self.weight_cache_rendered.contains(self.version):
            return Support(False, f"{label} has a weight-cache daemon, but specdeploy attaches engines to it from "
                           f"{self.label} {rendered} ({self.weight_cache_rendered_why})", first, rendered)
        refusal = self.weight_cache_refusal(hv)
        if refusal:
            return Support(False, refusal, first, rendered)
        if quant is None:
            return Support(None, "the checkpoint's quantization is not known on this machine (no config.json to "
                           "read)", first, rendered)
        known = self.weight_cache_quant.get(quant)
        if known is None:
            return Support(None, f"whether {label}'s weight cache serves a '{quant}' checkpoint was not read "
                           f"(read: {', '.join(sorted(self.weight_cache_quant))})", first, rendered)
        if not known[0]:
            return Support(False, self.weight_cache_quant_refusal(quant), first, rendered)
        return Support(True, f"{label} serves this checkpoint ({quant}) from its weight-cache daemon", first,
                       rendered)

    def weight_cache_refusal(self, hv) -> str:
        """Why this release refuses a weight cache for ``hv``'s configuration (speculation, layout); '' if not."""
        return ""

    def weight_cache_quant_refusal(self, quant: str) -> str:
        return f"{self.label} {self.version}'s weight cache refuses '{quant}' checkpoints"

    def weight_cache_daemon(self, hv, rank, socket_dir: str) -> Daemon:
        """The daemon of ``hv`` (``rank``: its place in a serving group, None alone) with its sockets in
        ``socket_dir``."""
        raise NotImplementedError(f"{self.label} has no weight-cache daemon specdeploy renders")

    def weight_cache_engine(self, hv, argv: list[str], socket_dir: str) -> tuple[list[str], dict[str, str]]:
        """The engine's command line attached to its daemon, and the environment it needs for that."""
        raise NotImplementedError(f"{self.label} has no weight-cache daemon specdeploy renders")

    def weight_cache_problems(self, hv, host: str | None) -> list[Finding]:
        """``specdeploy_weight_cache: on`` where this release cannot attach the engine (release, configuration)."""
        if getattr(hv, "specdeploy_weight_cache", "off") != "on":
            return []
        s = self.weight_cache_support(hv, None)
        if s.ok is False:
            fix = (f"pin {self.label} >= {s.first_rendered}, or set specdeploy_weight_cache: auto (off where it "
                   "cannot be used)") if s.first_rendered and not self._wc_rendered() else \
                "set specdeploy_weight_cache: auto (off where it cannot be used), or change what it names"
            return [Finding("error", "specdeploy_weight_cache", f"is on, but {s.why}", fix, host)]
        return []

    def _wc_rendered(self) -> bool:
        return self.weight_cache_rendered is not None and self.weight_cache_rendered.contains(self.version)

    def compile_cache_env(self, root: str) -> dict[str, str]:
        """The environment that puts every compile cache this release keeps under ``root``."""
        return {var: f"{root}/{sub}" for var, (sub, span) in self.compile_cache_table.items()
                if span.contains(self.version)}

    def memory_fraction(self, hv, attached: bool) -> float:
        """The GPU-memory fraction the engine is rendered with: the inventory's, lowered where an attached engine
        would not fit beside its daemon's overhead (which no engine budget counts)."""
        f = hv.specdeploy_gpu_memory_utilization
        if not attached:
            return f
        total = hv.profile().gpu_memory_gib
        cap = math.floor((1 - (DAEMON_OVERHEAD_GIB + ENGINE_CONTEXT_GIB) / total) * 100) / 100
        return min(f, cap)


MAX_READY_FILES = 256  # a host has at most 64 GPUs; more ready files than this is not a daemon's directory
MAX_READY_BYTES = 64 << 10


def health(spec: str, timeout: float = 2.0) -> tuple[bool, str]:
    """Whether a daemon serves, by its ``Daemon.health``: an http(s) URL answering 200 (vLLM's launcher: every
    local rank ready and none exited), or ``files:GLOB:N`` (SGLang: a ready file per GPU, ``pid=`` naming a live
    process; at least N of them). (ok, what was seen). Bounded: the URL by ``timeout`` as a total deadline, the
    files by count and size."""
    import glob
    import os
    if spec.startswith(("http://", "https://")):
        from specdeploy.values.peerhttp import ok
        return ok(spec, timeout)
    if not spec.startswith("files:") or spec.count(":") < 2:
        return False, f"not a health check: {spec!r}"
    pattern, _, n = spec[len("files:"):].rpartition(":")
    try:
        want = int(n)
    except ValueError:
        return False, f"not a health check: {spec!r}"
    files = sorted(glob.glob(pattern))[:MAX_READY_FILES]
    alive = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                text = fh.read(MAX_READY_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        pid = next((line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith("pid=")), "")
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass  # alive, another user's
        alive += 1
    return alive >= want, f"{alive} of {want} ranks ready ({len(files)} ready files)"


class SimWeightCache:
    """How the engine simulator plays an engine's weight-cache daemon and an engine attached to it (the generic part
    is testing/simcache.py); an adapter's ``SimBehaviour.weight_cache`` answers from the release's tables and says
    it in the release's words. None of it runs a GPU: sockets carry JSON between the simulated processes."""

    head: tuple[str, ...] = ()  # the daemon's launcher on a command line
    model_option = "model"      # the parsed option that names the checkpoint

    def local_ranks(self, opts: dict) -> int:
        raise NotImplementedError

    def socket_path(self, opts: dict, env, uuid: str, draft: bool = False) -> str:
        raise NotImplementedError

    def ready_path(self, opts: dict, env, uuid: str) -> str | None:
        return None

    def health(self, opts: dict) -> tuple[str, int] | None:
        """(host, port) of the daemon's /health, where the release serves one."""
        return None

    def daemon_refusal(self, version: str, opts: dict, env) -> str | None:
        """What the release's launcher refuses before it loads anything (its exception line), or None."""
        return None

    def quant_refusal(self, version: str, quant: str, where: str) -> str | None:
        """The exception line with which the daemon (``where`` "daemon") or an attached engine ("client") refuses a
        checkpoint of this quantization, or None where it takes it."""
        return None

    def key(self, version: str, opts: dict, model_dir: str, rank: int, draft: bool = False) -> dict:
        """What the release fingerprints of the weights one rank serves (its WeightCacheKey / CacheConfig)."""
        raise NotImplementedError

    def attach(self, version: str, opts: dict, env) -> dict | None:
        """How an engine command line attaches: {"socket_dir", "fallback", "timeout_s", "draft": bool} or None
        when it loads from disk. Raises SimReject for what the release refuses on its command line."""
        return None

    def daemon_lines(self, rank: int, memory_gib: float, socket: str) -> list[str]:
        return []

    def daemon_ready_lines(self, ranks: int, sockets: str) -> list[str]:
        return []

    def attached_lines(self, ranks: int, tensors: int, seconds: float) -> list[str]:
        return []

    def fallback_lines(self, why: str) -> list[str]:
        return []

    def failure(self, why: str) -> str:
        """The engine's log when it cannot attach and does not fall back (the release's exception, its wrapper)."""
        return why + "\n"

    def refusal_line(self, kind: str, path: str, detail, cfg: dict) -> str:
        """The exception an attached engine raises when its daemon is ``absent`` (no socket), ``refused`` (a socket
        nothing answers) or reports a ``mismatch`` (``detail``: the fields)."""
        return f"RuntimeError: weight cache {kind} at {path}: {detail}"

    def falls_back(self, kind: str, cfg: dict) -> bool:
        """Whether the release loads from disk instead, for this kind of failure and this configuration."""
        return bool(cfg.get("fallback"))

    def watches_daemon(self, version: str) -> str | None:
        """The line an attached engine prints when its daemon dies, where the release kills the engine then."""
        return None


def engine_flags(args: list[str], keep, switches) -> list[str]:
    """The flags of an engine command line (``args``, after the command and the model) that are in ``keep``, each
    with its value; ``switches`` are the flags that take none (a ``--flag=value`` carries its own)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i].split("=", 1)[0]
        takes = flag not in switches and "=" not in args[i] and i + 1 < len(args) and not args[i + 1].startswith("--")
        if flag in keep:
            out += args[i:i + 2] if takes else [args[i]]
        i += 2 if takes else 1
    return out
