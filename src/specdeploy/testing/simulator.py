"""Engine simulator, for demos and tests: it serves the HTTP and /metrics contract of the pinned vLLM or SGLang
version without a GPU. It takes the same command line specdeploy renders and rejects flags that version does
not have. Behaviour knobs come from the environment (the engine unit's env file):

  SPECDEPLOY_SIM_LOAD_SECONDS   model load time before serving (default 3)
  SPECDEPLOY_SIM_ACCEPTANCE     per-token draft acceptance probability (default 0.7)
  SPECDEPLOY_SIM_ACCEPTANCE_FILE  a file whose number, while it exists, replaces that probability (read at most
                                once a second): the traffic drifting off the drafter's distribution while the
                                engine serves, across restarts
  SPECDEPLOY_SIM_STEP_MS        plain decode step time in ms (default 20)
  SPECDEPLOY_SIM_SPEC_STEP_RATIO  speculative step time / plain step time (default 1.3)
  SPECDEPLOY_SIM_CRASH=load     crash during the load with a realistic multi-worker log in the engine's format
  SPECDEPLOY_SIM_DIE_AFTER      the engine dies this many seconds after becoming ready: the process stays, its
                                health check fails and requests get 500, as when an engine core dies
  SPECDEPLOY_SIM_GROUP_TIMEOUT  seconds a rank of a serving group waits for the others (default 600)

A prefill or decode instance (SGLang's --disaggregation-mode) plays the KV hand-over sglang-router's PD mode
drives: the router sends each request to a prefill and a decode instance with the same bootstrap_room; the prefill
instance computes the prompt and offers its KV on its bootstrap port; the decode instance takes it from there
(bootstrap_host:bootstrap_port), then decodes. A decode instance without the room, or whose prefill never offers
it, fails the request as the engine does.

A rank of a serving group (the rank flags of the command line: vLLM --nnodes/--headless or the data-parallel
flags, SGLang --nnodes/--node-rank/--dist-init-addr) plays its part of the group's rendezvous over TCP: the leader
listens on the rendezvous port and finishes loading only once every other rank has joined; the others join it
with retries and serve no HTTP. When a rank goes away while the group loads, the leader prints the engine's
error and exits non-zero; while it serves, the engine's adapter says when the leader notices (vLLM, as its real
CPU build does: at the next step, whose request fails with 500, then the leader exits 0). The others exit when
the leader goes.

Where specdeploy depends on engine behaviour, the simulator behaves as the engines do: the command line is
checked against the flags and speculative methods read from the real release (``engine_facts``); vLLM and SGLang
open their HTTP port only once the model is loaded; SGLang serves /metrics only with --enable-metrics.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from specdeploy.testing import engine_facts
from specdeploy.engines import SimReject, get, get_adapter

WORDS = ("the model drafts tokens and the target verifies them in one step so accepted drafts are free "
         "speculation pays only when acceptance beats the cost of the wider verify step").split()


ArgError = SimReject  # the engine refuses its command line


def parse_argv(engine: str, version: str, argv: list[str]) -> dict:
    adapter = get_adapter(engine, version)
    facts = engine_facts.recorded(engine, version)
    sb = adapter.simulation()

    wc = sb.weight_cache  # the weight-cache daemon's launcher takes the engine's flags and its own
    daemon = wc is not None and bool(wc.head) and argv[:len(wc.head)] == list(wc.head)

    def known(flag: str) -> bool:  # the real release's flags where recorded, else specdeploy's table
        if daemon and facts and flag in facts.get("daemon_flags", ()):
            return True
        return flag in facts["flags"] if facts else adapter.flag_exists(flag)
    head = list(wc.head) if daemon else list(sb.argv_head)
    positional = sb.positional_model and not daemon
    if argv[:len(head)] != head or (positional and len(argv) <= len(head)):
        raise ArgError(sb.usage)
    opts: dict = {"model": argv[len(head)]} if positional else {}
    rest, prog = argv[len(head) + int(positional):], sb.prog
    usage = sb.usage + "\n" if sb.usage_on_error else ""
    i = 0
    unknown = []
    while i < len(rest):
        a = rest[i]
        flag, eq, val = a.partition("=")
        if not known(flag):
            unknown.append(a)
            i += 1
            continue
        key = flag[2:].replace("-", "_")
        if flag in sb.booleans:
            opts[key] = True
            i += 1
        elif eq:
            opts[key] = val
            i += 1
        elif flag not in sb.int_flags and (i + 1 >= len(rest) or rest[i + 1].startswith("--")):
            opts[key] = True  # a real flag specdeploy does not use, without a value: a switch
            i += 1
        else:
            if i + 1 >= len(rest):
                raise ArgError(f"{usage}{prog}: error: argument {flag}: expected one argument")
            opts[key] = rest[i + 1]
            i += 2
        if flag in sb.int_flags and not str(opts[key]).lstrip("-").isdigit():
            kind = sb.int_type_names.get(flag, "int")
            raise ArgError(f"{usage}{prog}: error: argument {flag}: invalid {kind} value: '{opts[key]}'")
    if unknown:
        raise ArgError(f"{sb.unknown_prog or prog}: error: unrecognized arguments: {' '.join(unknown)}")
    spec = sb.spec(version, opts, facts)
    if spec is not None:
        opts["spec"] = spec
    model_path = opts.get("model") or opts.get("model_path")
    if not model_path or not os.path.isfile(os.path.join(model_path, "config.json")):
        raise ArgError(f"OSError: {model_path} does not appear to have a file named config.json")
    if spec and spec.get("model") and not os.path.isfile(os.path.join(spec["model"], "config.json")):
        raise ArgError(f"OSError: draft model {spec['model']} does not appear to have a file named config.json")
    return opts


def crash_log(engine: str, version: str, model: str, k: int, tp: int) -> str:
    """The multi-rank log the engine writes when it crashes during the load, in its own format."""
    return get(engine).simulation().crash_log(version, model, k, tp)


class Sim:
    def __init__(self, engine: str, version: str, opts: dict, env=os.environ):
        self.engine, self.version, self.opts = engine, version, opts
        self.behaviour = get(engine).simulation()
        self.served = opts.get(self.behaviour.served_option) or (opts.get("model") or opts.get("model_path"))
        self.spec = opts.get("spec")
        self.k = self.spec["k"] if self.spec else 0
        self.alpha0 = self.alpha = float(env.get("SPECDEPLOY_SIM_ACCEPTANCE", "0.7"))
        self.alpha_file = env.get("SPECDEPLOY_SIM_ACCEPTANCE_FILE") or None
        self.alpha_read = 0.0
        self.step = float(env.get("SPECDEPLOY_SIM_STEP_MS", "20")) / 1000
        self.ratio = float(env.get("SPECDEPLOY_SIM_SPEC_STEP_RATIO", "1.3"))
        self.load_s = float(env.get("SPECDEPLOY_SIM_LOAD_SECONDS", "3"))
        self.die_after = float(env.get("SPECDEPLOY_SIM_DIE_AFTER", "0") or 0)
        self.api_key = self.behaviour.api_key(opts, env)
        self.ready = False
        self.dead = False
        self.group = None  # this rank's Group, when it is one of a serving group
        self.lock = threading.Lock()
        self.running = 0
        self.rng = random.Random(int(env.get("SPECDEPLOY_SIM_SEED", "0")) or None)
        self.registry = CollectorRegistry()
        self.m = self.behaviour.metrics(self.registry, self.served, self.k)
        self.pd = self.behaviour.pd_role(opts)  # (role, bootstrap port) or None
        self.rooms: dict[str, tuple[float, int]] = {}  # prefill: room -> (when, prompt tokens) offered
        self.rooms_cv = threading.Condition()
        self.pd_timeout = float(env.get("SPECDEPLOY_SIM_PD_TIMEOUT", "30"))

    # --- prefill/decode hand-over -------------------------------------------------------------------------
    def offer(self, room: str, tokens: int) -> None:
        with self.rooms_cv:
            now = time.monotonic()
            for r in [r for r, (t, _) in self.rooms.items() if now - t > 120]:  # never taken: dropped
                del self.rooms[r]
            self.rooms[room] = (now, tokens)
            self.rooms_cv.notify_all()

    def take(self, room: str, timeout: float) -> int | None:
        with self.rooms_cv:
            if not self.rooms_cv.wait_for(lambda: room in self.rooms, timeout=timeout):
                return None
            return self.rooms.pop(room)[1]

    def fetch_kv(self, host: str, port: int, room: str) -> int | None:
        """Decode: the prompt's KV from the prefill instance's bootstrap port (its token count), None on failure."""
        import urllib.request
        from specdeploy.values.peerhttp import url_host
        h = url_host(host)
        try:
            with urllib.request.urlopen(f"http://{h}:{port}/kv/{room}", timeout=self.pd_timeout + 5) as r:
                return int(json.loads(r.read(4096))["tokens"])
        except (OSError, ValueError, KeyError):
            return None

    def _acceptance(self) -> None:
        """The acceptance probability of SPECDEPLOY_SIM_ACCEPTANCE_FILE while it holds a number in [0, 1]."""
        if not self.alpha_file or time.monotonic() - self.alpha_read < 1.0:
            return
        self.alpha_read = time.monotonic()
        try:
            v = float(Path(self.alpha_file).read_text()[:32])
            self.alpha = v if 0.0 <= v <= 1.0 else self.alpha0
        except (OSError, ValueError):
            self.alpha = self.alpha0

    # --- generation ------------------------------------------------------------------------------------
    def generate(self, prompt_tokens: int, max_tokens: int, prefill: bool = True) -> tuple[list[str], float]:
        with self.lock:
            self.running += 1
            self.m.running(self.running)
        t0 = time.monotonic()
        out: list[str] = []
        ttft = None
        try:
            if prefill:  # a decode instance got the prompt's KV from its prefill instance
                time.sleep(self.step)
                self.m.prompt(prompt_tokens)
            while len(out) < max_tokens:
                if self.k:
                    self._acceptance()
                    time.sleep(self.step * self.ratio)
                    acc = 0
                    while acc < self.k and self.rng.random() < self.alpha:
                        acc += 1
                    n = min(acc + 1, max_tokens - len(out))
                    self.m.spec_step(acc, self.k)
                else:
                    time.sleep(self.step)
                    n = 1
                for _ in range(n):
                    out.append(WORDS[(len(out) + prompt_tokens) % len(WORDS)])
                if ttft is None:
                    ttft = time.monotonic() - t0
                    self.m.ttft(ttft)
                for _ in range(n):
                    self.m.itl((self.step * (self.ratio if self.k else 1)) / n)
            self.m.generated(len(out))
        finally:
            with self.lock:
                self.running -= 1
                self.m.running(self.running)
        return out, ttft or 0.0


def make_handler(sim: Sim):
    class H(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, code, body, ctype="application/json"):
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _authorized(self):
            if not sim.api_key or not self.path.startswith("/v1"):
                return True
            if self.headers.get("Authorization") == f"Bearer {sim.api_key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                if sim.dead:  # the engine core died; the API server answers, unhealthy
                    return self._send(503, b"", "text/plain")
                if sim.behaviour.health_generates:
                    if not sim.ready:
                        return self._send(503, b"", "text/plain")
                    # a decode instance computes no prompt, its own health check's neither (SGLang runs it with a fake
                    # bootstrap in PD mode)
                    sim.generate(1, 1, prefill=sim.pd is None or sim.pd[0] != "decode")
                return self._send(200, b"", "text/plain")
            if path == "/metrics":
                if sim.behaviour.metrics_option and not sim.opts.get(sim.behaviour.metrics_option):
                    return self._send(404, {"detail": "Not Found"})
                return self._send(200, generate_latest(sim.registry), CONTENT_TYPE_LATEST)
            if not sim.ready:
                return self._send(503, {"error": "Server is starting"})
            if not self._authorized():
                return
            if path == "/v1/models":
                card = sim.behaviour.model_card(sim.served, sim.opts, sim.engine)
                return self._send(200, {"object": "list", "data": [card]})
            if path == "/version":
                return self._send(200, {"version": sim.version})
            info = sim.behaviour.info(path, sim)
            if info is not None:
                return self._send(200, info)
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            n = int(self.headers.get("content-length") or 0)
            try:
                req = json.loads(self.rfile.read(n) or b"{}")
            except json.JSONDecodeError:
                return self._send(400, {"error": "invalid JSON"})
            if not sim.ready:
                return self._send(503, {"error": "Server is starting"})
            if not self._authorized():
                return
            if sim.group is not None and sim.group.broken:  # this step's collective finds the lost rank
                sim.dead = True
                sim.group.fail_step(sim.behaviour.engine_dead_lines())
            if sim.dead:
                return self._send(500, {"error": {"message": "EngineCore encountered an issue. See stack trace "
                                                             "(above) for the root cause.", "code": 500}})
            path = self.path.split("?")[0]
            if path not in ("/v1/chat/completions", "/v1/completions"):
                return self._send(404, {"detail": "Not Found"})
            if req.get("model") not in (None, sim.served):
                return self._send(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                                  "type": "NotFoundError", "code": 404}})
            if path.endswith("chat/completions"):
                msgs = req.get("messages") or []
                if not msgs:
                    return self._send(400, {"error": {"message": "messages must not be empty", "code": 400}})
                prompt = " ".join(str(m.get("content", "")) for m in msgs)
            else:
                prompt = str(req.get("prompt", ""))
            ptoks = max(1, len(prompt.split()))
            max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 64)
            if sim.pd is not None:
                room = req.get("bootstrap_room")
                if room is None:
                    return self._send(400, {"error": {"message": f"a {sim.pd[0]} instance serves requests that carry "
                                                                 "bootstrap_room (sent by the router in PD mode)",
                                                      "code": 400}})
                if sim.pd[0] == "prefill":  # compute the prompt, offer its KV; the router discards this answer
                    time.sleep(sim.step)
                    sim.m.prompt(ptoks)
                    sim.offer(str(room), ptoks)
                    max_tokens = 1
                else:
                    got = sim.fetch_kv(str(req.get("bootstrap_host")), int(req.get("bootstrap_port") or 0), str(room))
                    if got is None:
                        return self._send(500, {"error": {"message": f"KV transfer for room {room} from "
                                                                     f"{req.get('bootstrap_host')}:"
                                                                     f"{req.get('bootstrap_port')} failed",
                                                          "code": 500}})
            toks, _ = sim.generate(ptoks, max_tokens, prefill=sim.pd is None)
            text = " ".join(toks)
            usage = {"prompt_tokens": ptoks, "completion_tokens": len(toks), "total_tokens": ptoks + len(toks)}
            rid = f"{sim.behaviour.id_prefix(path)}{random.getrandbits(64):016x}"
            if path.endswith("chat/completions"):
                body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": sim.served,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                     "finish_reason": "length"}], "usage": usage}
            else:
                body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": sim.served,
                        "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}
            return self._send(200, body)
    return H


def bootstrap_handler(sim: Sim):
    """A prefill instance's bootstrap port: ``GET /kv/ROOM`` answers once that room's prompt is computed."""
    class B(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            parts = self.path.split("?")[0].strip("/").split("/")
            got = sim.take(parts[1], sim.pd_timeout) if len(parts) == 2 and parts[0] == "kv" else None
            raw = json.dumps({"tokens": got} if got is not None else {"error": "no such room"}).encode()
            self.send_response(200 if got is not None else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
    return B


def load_progress(engine: str, load_s: float, shards: int = 64, graphs: int = 20, weights: bool = True,
                  capture: bool = True):
    """The load-progress lines the engines print (tqdm over weight shards, the KV cache allocation, CUDA graph
    capture), spread over the simulated load time: 70% weights, 30% graphs. A weight-cache daemon loads the weights
    only (``capture`` False); an engine attached to one skips them (``weights`` False)."""
    sb = get(engine).simulation()
    t_shard, t_graph = 0.7 * load_s / shards, 0.3 * load_s / graphs
    for i in range(shards + 1) if weights else ():
        print(f"Loading safetensors checkpoint shards: {100 * i // shards:3d}% Completed | {i}/{shards} "
              f"[00:{int(i * t_shard):02d}<00:00, {1 / max(t_shard, 1e-3):.2f}it/s]", flush=True)
        if i < shards:
            time.sleep(t_shard)
    if not capture:
        return
    for line in sb.kv_lines:
        print(line, flush=True)
    for i in range(graphs + 1):
        print(sb.graph_line(i, graphs, t_graph), flush=True)
        if i < graphs:
            time.sleep(t_graph)
    print(sb.graphs_done(load_s), flush=True)


class Group:
    """This rank's side of the serving group's rendezvous (see the module's docstring)."""

    def __init__(self, rank, behaviour, env=os.environ):
        self.rank, self.behaviour = rank, behaviour
        self.timeout = float(env.get("SPECDEPLOY_SIM_GROUP_TIMEOUT", "600"))
        self.joined: dict[int, str] = {}
        self.cond = threading.Condition()
        self.sock = None
        self.serving = False          # the leader's API server is up
        self.broken: list[str] = []   # a rank went away while serving; the next step finds out

    def _lost(self, who: str, lines: list[str], serving_matters: bool = False) -> None:
        if serving_matters and self.serving and self.behaviour.lost_rank_noticed == "next-step":
            self.broken = lines  # nothing notices until the next step's collective
            return
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        os._exit(1)

    def fail_step(self, shutdown_lines: list[str]) -> None:
        """The step that finds a rank gone: the engine's error, then the API server shuts down (shortly after the
        failed request is answered)."""
        for line in self.broken:
            print(line, file=sys.stderr, flush=True)

        def down():
            time.sleep(0.5)
            for line in shutdown_lines:
                print(line, flush=True)
            os._exit(self.behaviour.lost_exit_code)
        threading.Thread(target=down, daemon=True).start()

    def _watch(self, conn, who: str, lines, serving_matters: bool = False) -> None:
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        self._lost(who, lines, serving_matters)

    def start(self) -> None:
        """The leader opens the rendezvous port; another rank joins the leader (retrying until the timeout)."""
        r = self.rank
        if r.index == 0:
            self.sock = socket.create_server(("", r.port), reuse_port=False, backlog=r.size)
            threading.Thread(target=self._accept, daemon=True).start()
            print(f"serving group: rank 0 of {r.size}, waiting for the other ranks on port {r.port}", flush=True)
            return
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = socket.create_connection((r.address, r.port), timeout=5)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    self._lost(r.address, [f"RuntimeError: rank {r.index} could not reach the group's leader at "
                                           f"{r.address}:{r.port} within {self.timeout:.0f} s: {exc}"])
                time.sleep(0.5)
        conn.settimeout(None)
        conn.sendall(f"{r.index}\n".encode())
        print(f"serving group: rank {r.index} of {r.size} joined the leader at {r.address}:{r.port}", flush=True)
        threading.Thread(target=self._watch, args=(conn, r.address, [
            f"RuntimeError: the group's leader at {r.address}:{r.port} went away; rank {r.index} stops"]),
            daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, peer = self.sock.accept()
            try:
                conn.settimeout(10)
                index = int(conn.recv(16).decode().strip() or -1)
                conn.settimeout(None)
            except (OSError, ValueError):
                conn.close()
                continue
            if not 0 < index < self.rank.size:  # not a rank of this group (a port check, a stray client)
                conn.close()
                continue
            with self.cond:
                self.joined[index] = peer[0]
                self.cond.notify_all()
            threading.Thread(target=self._watch, args=(conn, peer[0], self.behaviour.group_lost_lines(
                self.rank, peer[0]), True), daemon=True).start()

    def wait_all(self) -> None:
        """The leader, before it serves: every other rank has joined."""
        if self.rank.index != 0:
            return
        want = set(range(1, self.rank.size))
        with self.cond:
            if not self.cond.wait_for(lambda: want <= set(self.joined), timeout=self.timeout):
                missing = ", ".join(str(i) for i in sorted(want - set(self.joined)))
                self._lost("", [f"RuntimeError: ranks {missing} of the serving group did not join within "
                                f"{self.timeout:.0f} s"])
        print(f"serving group: all {self.rank.size} ranks joined", flush=True)


def run(engine: str, version: str, argv: list[str]) -> int:
    from specdeploy.testing import simcache
    if simcache.is_daemon(engine, argv):  # the engine's weight-cache daemon (testing/simcache.py)
        return simcache.run_daemon(engine, version, argv, parse_argv, load_progress)
    try:
        opts = parse_argv(engine, version, argv)
    except ArgError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    sim = Sim(engine, version, opts)
    host, port = opts.get("host", "127.0.0.1"), int(opts.get("port", get(engine).default_port))
    tp = int(opts.get(sim.behaviour.tp_option) or 1)
    print(f"specdeploy engine simulator: {engine} {version} (no GPU; for demos and tests) model={sim.served} "
          f"tp={tp} speculative={'k=%d' % sim.k if sim.k else 'off'}", flush=True)
    def on_term(*_):  # as PID 1 in a container, too
        for line in sim.behaviour.shutdown_lines(os.getpid()):
            print(line, flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    rank = sim.behaviour.rank(opts)
    group = sim.group = Group(rank, sim.behaviour) if rank is not None and rank.size > 1 else None
    if group:
        group.start()
    try:  # an engine attached to its weight-cache daemon maps the weights instead of loading them
        got = simcache.attach(engine, version, opts)
    except ArgError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    load_progress(engine, sim.load_s, weights=got != "attached")
    if os.environ.get("SPECDEPLOY_SIM_CRASH") == "load":
        sys.stderr.write(sim.behaviour.crash_log(version, sim.served, sim.k, tp))
        sys.stderr.flush()
        return 1
    if group:
        group.wait_all()
    if group and not rank.serves:  # a headless rank: no API server; it lives as long as the group does
        print(f"serving group: rank {rank.index} serves the group's leader (no API server here)", flush=True)
        while True:
            time.sleep(3600)
    if sim.pd is not None and sim.pd[0] == "prefill":  # the bootstrap port the decode instances take KV from
        boot = ThreadingHTTPServer(("", sim.pd[1]), bootstrap_handler(sim))
        threading.Thread(target=boot.serve_forever, daemon=True).start()
    # Both engines open their HTTP port only once the model is loaded.
    server = ThreadingHTTPServer((host, port), make_handler(sim))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sim.ready = True
    if group:
        group.serving = True
    for line in sim.behaviour.ready_lines(host, port, os.getpid()):
        print(line, flush=True)
    t_ready = time.monotonic()
    try:
        while True:
            time.sleep(0.5)
            if sim.die_after and not sim.dead and time.monotonic() - t_ready > sim.die_after:
                print("ERROR EngineCore died unexpectedly (simulated); the API server keeps answering, unhealthy",
                      file=sys.stderr, flush=True)
                sim.dead = True
    except (KeyboardInterrupt, SystemExit):
        return 0
