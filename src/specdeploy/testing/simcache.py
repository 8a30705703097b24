"""The engine simulator's weight-cache daemon and the attach of a simulated engine to it (no GPU: the daemon's
sockets carry JSON between the simulated processes). What each release does is its adapter's
(``SimBehaviour.weight_cache``: engines/vllm_wcsim.py, engines/sglang_wcsim.py, read from the release's sources);
this module plays the common part:

- the daemon (``specdeploy simulate -- vllm preload ...`` / ``-- python -m sglang.srt.weight_cache.daemon ...``)
  refuses what the release refuses before loading (its launcher's checks, the checkpoint's quantization), "loads"
  the weights (the load progress lines of SPECDEPLOY_SIM_LOAD_SECONDS' weight part), then binds one socket per local
  rank (named as the release names them, for a GPU uuid derived from the host name and the rank), writes the
  release's ready files and serves its /health; each request ``{"cmd": "get_state", "key": ...}`` is answered with
  the tensors or the mismatching fields of the key (WeightCacheKey, CacheConfig);
- an engine attached to it asks every local rank's socket (and the draft group's, where the release routes its
  drafter there) and maps the weights (its log says so; only the CUDA-graph part of its load remains), or does what
  the release does without them: wait, fail with the release's exception, or fall back to a disk load;
- an attached engine of a release that watches its daemon kills itself when the daemon is gone, with its log line.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import uuid

from specdeploy.engines import SimReject, get
from specdeploy.engines.weightcache import quant_kind

TENSORS = 1283  # what a simulated rank hands over: the count the log lines name
_LOCKS: list[int] = []  # the daemon's socket locks, held while it lives
MAX_MESSAGE = 1 << 20


def gpu_uuid(rank: int) -> str:
    """The simulated GPU ``rank`` of this host: stable per host name, different across hosts."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{socket.gethostname()}/{rank}')}"


def _config(model: str) -> dict:
    try:
        with open(os.path.join(model, "config.json")) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _weights_bytes(model: str) -> int:
    try:
        with open(os.path.join(model, "model.safetensors.index.json")) as f:
            return int(json.load(f)["metadata"]["total_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _send(conn, obj) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def _recv(conn) -> dict:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_MESSAGE:
            raise ValueError("message too large")
    return json.loads(buf or b"{}")


# --- the daemon ---------------------------------------------------------------------------------------------------
def is_daemon(engine: str, argv: list[str]) -> bool:
    wc = get(engine).simulation().weight_cache
    return wc is not None and bool(wc.head) and argv[:len(wc.head)] == list(wc.head)


def run_daemon(engine: str, version: str, argv: list[str], parse_argv, load_progress, env=os.environ) -> int:
    """The daemon of ``argv``; ``parse_argv`` and ``load_progress``: the simulator's (its command-line checks against
    the release's facts, its load-progress lines)."""
    wc = get(engine).simulation().weight_cache
    try:
        opts = parse_argv(engine, version, argv)
        why = wc.daemon_refusal(version, opts, env)
        if why:
            raise SimReject(why, 1)
    except SimReject as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    model = opts.get(wc.model_option)
    ranks = wc.local_ranks(opts)
    load_s = float(env.get("SPECDEPLOY_SIM_LOAD_SECONDS", "3"))
    print(f"specdeploy engine simulator: {engine} {version} weight-cache daemon (no GPU) model={model} "
          f"local ranks={ranks}", flush=True)
    refusal = wc.quant_refusal(version, quant_kind(_config(model)), "daemon")
    if refusal:  # checked once the model is built, before its weights are read
        print(refusal, file=sys.stderr, flush=True)
        return 1
    sockets, servers = [], []
    health = wc.health(opts)
    state = {"ready": False}
    if health:
        _health_server(health, state)
    signal.signal(signal.SIGTERM, lambda *_: _shutdown(sockets))
    load_progress(engine, load_s, capture=False)  # the daemon loads the weights only
    memory = _weights_bytes(model) / max(1, ranks) / (1 << 30)
    for r in range(ranks):
        path = wc.socket_path(opts, env, gpu_uuid(r))
        try:
            srv = _bind(path)
        except (OSError, RuntimeError) as exc:
            print(f"RuntimeError: {exc}", file=sys.stderr, flush=True)
            return 1
        sockets.append(path)
        servers.append(srv)
        ready = wc.ready_path(opts, env, gpu_uuid(r))
        if ready:
            with open(ready, "w") as f:
                f.write(f"pid={os.getpid()}\nconfig={json.dumps(wc.key(version, opts, model, r))}\n")
            sockets.append(ready)
        key = wc.key(version, opts, model, r)
        threading.Thread(target=_serve, args=(srv, key, memory), daemon=True).start()
        for line in wc.daemon_lines(r, memory, path):
            print(line, flush=True)
    state["ready"] = True
    for line in wc.daemon_ready_lines(ranks, os.path.dirname(sockets[0]) if sockets else ""):
        print(line, flush=True)
    while True:
        time.sleep(3600)


def _bind(path: str) -> socket.socket:
    """The release's socket at ``path``, under the exclusive lock beside it (a second daemon fails fast)."""
    import fcntl
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    lock = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        raise RuntimeError(f"Another weight cache daemon already owns {path}") from None
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o600)
    srv.listen(16)
    _LOCKS.append(lock)  # held for the daemon's life
    return srv


def _serve(srv: socket.socket, key: dict, memory_gib: float) -> None:
    while True:
        conn, _ = srv.accept()
        with conn:
            try:
                conn.settimeout(30)
                req = _recv(conn)
                if req.get("cmd") == "get_memory":
                    _send(conn, {"status": "ok", "memory_bytes": int(memory_gib * (1 << 30))})
                    continue
                theirs = req.get("key") or {}
                bad = [k for k in key if key.get(k) != theirs.get(k)]
                _send(conn, {"status": "mismatch", "fields": bad} if bad else
                      {"status": "ok", "tensors": TENSORS, "pid": os.getpid()})
            except (OSError, ValueError):
                continue


def _health_server(where: tuple[str, int], state: dict) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            code = 200 if self.path.split("?")[0] == "/health" and state["ready"] else 503
            self.send_response(code if self.path.split("?")[0] == "/health" else 404)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(where, H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()


def _shutdown(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
    sys.exit(0)


# --- an engine attached to it -------------------------------------------------------------------------------------
def attach(engine: str, version: str, opts: dict, env=os.environ) -> str:
    """``disk`` (no weight cache on this command line, or the release's fall back), ``attached``; a failure the
    release does not fall back from raises SimReject with the engine's log."""
    wc = get(engine).simulation().weight_cache
    cfg = wc.attach(version, opts, env) if wc is not None else None
    if cfg is None:
        return "disk"
    model = opts.get(wc.model_option)
    refusal = wc.quant_refusal(version, quant_kind(_config(model)), "client")
    if refusal:  # raised before the daemon is asked, whatever the fallback
        raise SimReject(wc.failure(refusal), 1)
    o = dict(opts, socket_dir=cfg.get("socket_dir"))
    t0 = time.monotonic()
    pid = None
    for draft in ([False, True] if cfg.get("draft") else [False]):
        for r in range(wc.local_ranks(opts)):
            path = wc.socket_path(o, env, gpu_uuid(r), draft=draft)
            kind, detail = _ask(path, wc.key(version, opts, model, r, draft), cfg)
            if kind == "ok":
                pid = detail
                continue
            if wc.falls_back(kind, cfg):
                for line in wc.fallback_lines(path if kind == "absent" else f"{kind}: {detail}"):
                    print(line, flush=True)
                return "disk"
            raise SimReject(wc.failure(wc.refusal_line(kind, path, detail, cfg)), 1)
    for line in wc.attached_lines(wc.local_ranks(opts), TENSORS, time.monotonic() - t0):
        print(line, flush=True)
    watch = wc.watches_daemon(version)
    if watch and pid:
        threading.Thread(target=_watchdog, args=(int(pid), watch), daemon=True).start()
    return "attached"


def _ask(path: str, key: dict, cfg: dict) -> tuple[str, object]:
    """("ok", the daemon's pid) / ("absent" | "refused", reason) / ("mismatch", fields), after the release's wait for
    a daemon that is not there yet (``waits`` without fallback: until ``timeout_s``)."""
    deadline = time.monotonic() + (cfg["timeout_s"] if cfg.get("waits") and not cfg.get("fallback") else 0)
    while True:
        if not os.path.exists(path):
            kind, detail = "absent", "no such file"
        else:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    s.connect(path)
                    _send(s, {"cmd": "get_state", "key": key})
                    ans = _recv(s)
                if ans.get("status") == "mismatch":
                    return "mismatch", ans.get("fields")
                if ans.get("status") == "ok":
                    return "ok", ans.get("pid")
                kind, detail = "refused", str(ans)
            except (ConnectionRefusedError, FileNotFoundError):
                kind, detail = "refused", "connection refused"
            except (OSError, ValueError) as exc:
                kind, detail = "refused", str(exc)
        if time.monotonic() >= deadline:
            return kind, detail
        time.sleep(0.5)


def _watchdog(pid: int, line: str, poll_s: float = 5.0) -> None:
    """The release's watchdog: poll the daemon's PID; when it is gone, say so and SIGKILL this engine."""
    while True:
        time.sleep(poll_s)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(time.strftime("[%Y-%m-%d %H:%M:%S] ") + line.format(pid=pid), file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        except PermissionError:
            pass
