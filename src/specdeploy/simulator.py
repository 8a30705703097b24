"""Engine simulator, for demos and tests: it serves the HTTP and /metrics contract of the pinned vLLM or SGLang
version without a GPU. It takes the same command line specdeploy renders and rejects flags that version does
not have. Behaviour knobs come from the environment (the engine unit's env file):

  SPECDEPLOY_SIM_LOAD_SECONDS   model load time before serving (default 3)
  SPECDEPLOY_SIM_ACCEPTANCE     per-token draft acceptance probability (default 0.7)
  SPECDEPLOY_SIM_STEP_MS        plain decode step time in ms (default 20)
  SPECDEPLOY_SIM_SPEC_STEP_RATIO  speculative step time / plain step time (default 1.3)
  SPECDEPLOY_SIM_CRASH=load     crash during the load with a realistic multi-worker log in the engine's format
  SPECDEPLOY_SIM_DIE_AFTER      the engine dies this many seconds after becoming ready: the process stays, its
                                health check fails and requests get 500, as when an engine core dies

Where specdeploy depends on engine behaviour, the simulator behaves as the engines do: the command line is
checked against the flags and speculative methods read from the real release (``engine_facts``); vLLM and SGLang
open their HTTP port only once the model is loaded; SGLang serves /metrics only with --enable-metrics.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import engine_facts
from .engines import get_adapter
from .engines.vllm import SPEC_KEYS

VLLM_BOOL = {"--enable-expert-parallel", "--trust-remote-code", "--disable-custom-all-reduce",
             "--enable-prefix-caching", "--enable-auto-tool-choice", "--enable-eplb", "--enforce-eager",
             "--language-model-only"}
SGLANG_BOOL = {"--trust-remote-code", "--enable-metrics", "--disable-custom-all-reduce"}
INT_FLAGS = {"--port", "--tensor-parallel-size", "--tp-size", "--ep-size", "--max-model-len", "--context-length",
             "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"}
WORDS = ("the model drafts tokens and the target verifies them in one step so accepted drafts are free "
         "speculation pays only when acceptance beats the cost of the wider verify step").split()


class ArgError(SystemExit):
    pass


def parse_argv(engine: str, version: str, argv: list[str]) -> dict:
    adapter = get_adapter(engine, version)
    facts = engine_facts.recorded(engine, version)

    def known(flag: str) -> bool:  # the real release's flags where recorded, else specdeploy's table
        return flag in facts["flags"] if facts else adapter.flag_exists(flag)
    if engine == "vllm":
        if argv[:2] != ["vllm", "serve"] or len(argv) < 3:
            raise ArgError("usage: vllm serve MODEL [options]")
        opts, rest, prog, booleans = {"model": argv[2]}, argv[3:], "vllm serve", VLLM_BOOL
    else:
        if argv[:3] != ["python", "-m", "sglang.launch_server"]:
            raise ArgError("usage: python -m sglang.launch_server --model-path PATH [options]")
        opts, rest, prog, booleans = {}, argv[3:], "launch_server", SGLANG_BOOL
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
        if flag in booleans:
            opts[key] = True
            i += 1
        elif eq:
            opts[key] = val
            i += 1
        elif flag not in INT_FLAGS and (i + 1 >= len(rest) or rest[i + 1].startswith("--")):
            opts[key] = True  # a real flag specdeploy does not use, without a value: a switch
            i += 1
        else:
            if i + 1 >= len(rest):
                raise ArgError(f"{prog}: error: argument {flag}: expected one argument")
            opts[key] = rest[i + 1]
            i += 2
        if flag in INT_FLAGS and not str(opts[key]).lstrip("-").isdigit():
            raise ArgError(f"{prog}: error: argument {flag}: invalid int value: '{opts[key]}'")
    if unknown:
        raise ArgError(f"{prog}: error: unrecognized arguments: {' '.join(unknown)}")
    if engine == "vllm" and "speculative_config" in opts:
        opts["spec"] = _vllm_spec(version, opts["speculative_config"], facts)
    if engine == "sglang" and "speculative_algorithm" in opts:
        algo = opts["speculative_algorithm"]
        methods = facts["spec_methods"] if facts else {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}
        if algo.upper() not in methods:
            raise ArgError(f"ValueError: Unknown speculative algorithm name: {algo}")
        opts["spec"] = {"k": int(opts.get("speculative_num_steps", 3)), "method": algo,
                        "model": opts.get("speculative_draft_model_path")}
    model_path = opts.get("model") or opts.get("model_path")
    if not model_path or not os.path.isfile(os.path.join(model_path, "config.json")):
        raise ArgError(f"OSError: {model_path} does not appear to have a file named config.json")
    spec = opts.get("spec")
    if spec and spec.get("model") and not os.path.isfile(os.path.join(spec["model"], "config.json")):
        raise ArgError(f"OSError: draft model {spec['model']} does not appear to have a file named config.json")
    return opts


def _vllm_spec(version: str, raw: str, facts: dict | None) -> dict:
    """--speculative-config as vLLM's SpeculativeConfig validates it: known keys, a known method, k > 0."""
    head = "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
    cfg = json.loads(raw)  # bad JSON: a ValueError, reported by the CLI
    if not isinstance(cfg, dict):
        raise ValueError(f"--speculative-config must be a JSON object, got {raw!r}")
    keys = facts["spec_keys"] if facts else {k for k, span in SPEC_KEYS.items() if span.contains(version)}
    bad = [k for k in cfg if k not in keys]
    if bad:
        raise ArgError(f"{head}{bad[0]}\n  Extra inputs are not permitted [type=extra_forbidden]")
    method = cfg.get("method")
    if facts and method is not None and method not in facts["spec_methods"]:
        allowed = ", ".join(repr(m) for m in sorted(facts["spec_methods"]))
        raise ArgError(f"{head}method\n  Input should be {allowed} [type=literal_error, input_value={method!r}]")
    k = cfg.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k <= 0):
        raise ArgError(f"{head}num_speculative_tokens\n  Input should be greater than 0 [type=greater_than, "
                       f"input_value={k!r}]")
    return {"k": int(k or 0), "method": method, "model": cfg.get("model")}


CRASH_LOG = """(EngineCore_DP0 pid={core}) INFO {ts} [core.py:97] Initializing a V1 LLM engine (v{version}) with config: model='{model}', speculative_config=SpeculativeConfig(method='eagle3', num_spec_tokens={k})
{workers}(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866] EngineCore failed to start.
(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866] Traceback (most recent call last):
(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866]   File "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 857, in run_engine_core
(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{'EngineCore_DP0': 1}}
"""


def crash_log(version: str, model: str, k: int, tp: int) -> str:
    ts = time.strftime("%m-%d %H:%M:%S")
    lines = []
    for w in range(tp):
        p = f"(Worker_TP{w} pid={4100 + w}) ERROR {ts} [multiproc_executor.py:863] "
        lines.append([p + "WorkerProc failed to start.", p + "Traceback (most recent call last):",
                      p + '  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py", '
                          'line 783, in worker_main',
                      p + "    worker = WorkerProc(*args, **kwargs)",
                      p + '  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/spec_decode/eagle.py", line 1370,'
                          ' in load_model',
                      p + "    self.model.config.image_token_index = target_model.config.image_token_index",
                      p + "AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'"])
    rng = random.Random(1)
    merged = []
    while any(lines):
        src = rng.choice([l for l in lines if l])
        merged.append(src.pop(0))
    return CRASH_LOG.format(core=4000, ts=ts, version=version, model=model, k=k,
                            workers="\n".join(merged) + "\n")


SGLANG_TB = (
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2566, in run_scheduler_process\n'
    "    scheduler = Scheduler(\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 1801, in init_device_graphs\n'
    "    self.graph_runner = graph_runners[self.device](self)\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", line 381, in __init__\n'
    "    raise Exception(\n"
    "Exception: Capture cuda graph failed: 'CustomAllReduceV2' object has no attribute 'obj'\n"
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n\n")


def sglang_crash_log(version: str, model: str, k: int, tp: int) -> str:
    """SGLang's format: ``[date time TPn] message``; a scheduler's traceback starts mid-line and its continuation
    lines carry no prefix. Each rank writes its block in one piece, so ranks interleave by block, not by line."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    out = [(f"[{ts}] server_args=ServerArgs(model_path='{model}', tp_size={tp}, trust_remote_code=True, "
            f"speculative_algorithm='EAGLE3', speculative_num_steps={k}, sglang_version='{version}')\n")]
    out += [f"[{ts} TP{r}] Load weight end. type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16\n"
            for r in range(tp)]
    out += [f"[{ts} TP{r}] Capture cuda graph begin. This can take up to several minutes.\n" for r in range(tp)]
    ranks = list(range(tp))
    random.Random(1).shuffle(ranks)
    out += [f"[{ts} TP{r}] Scheduler hit an exception: Traceback (most recent call last):\n" + SGLANG_TB
            for r in ranks]
    out.append(f"[{ts}] Received sigquit from a child process. It usually means the child failed.\n")
    return "".join(out)


class Sim:
    def __init__(self, engine: str, version: str, opts: dict, env=os.environ):
        self.engine, self.version, self.opts = engine, version, opts
        self.served = opts.get("served_model_name") or (opts.get("model") or opts.get("model_path"))
        self.spec = opts.get("spec")
        self.k = self.spec["k"] if self.spec else 0
        self.alpha = float(env.get("SPECDEPLOY_SIM_ACCEPTANCE", "0.7"))
        self.step = float(env.get("SPECDEPLOY_SIM_STEP_MS", "20")) / 1000
        self.ratio = float(env.get("SPECDEPLOY_SIM_SPEC_STEP_RATIO", "1.3"))
        self.load_s = float(env.get("SPECDEPLOY_SIM_LOAD_SECONDS", "3"))
        self.die_after = float(env.get("SPECDEPLOY_SIM_DIE_AFTER", "0") or 0)
        self.api_key = self._api_key(env)
        self.ready = False
        self.dead = False
        self.lock = threading.Lock()
        self.running = 0
        self.rng = random.Random(int(env.get("SPECDEPLOY_SIM_SEED", "0")) or None)
        self.registry = CollectorRegistry()
        self._metrics()

    def _api_key(self, env):
        if self.engine == "vllm":
            return env.get("VLLM_API_KEY") or self.opts.get("api_key")
        cfg = self.opts.get("config")
        if cfg and os.path.isfile(cfg):
            import yaml
            data = yaml.safe_load(open(cfg)) or {}
            return data.get("api-key") or data.get("api_key")
        return self.opts.get("api_key")

    def _metrics(self):
        r = self.registry
        if self.engine == "vllm":
            lab = ["model_name", "engine"]
            self.lv = {"model_name": self.served, "engine": "0"}
            self.m_drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", lab, registry=r)
            self.m_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lab,
                                          registry=r)
            self.m_accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", lab,
                                      registry=r)
            self.m_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                 "Accepted tokens per draft position.", lab + ["position"], registry=r)
            self.m_gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", lab, registry=r)
            self.m_prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lab, registry=r)
            self.m_success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                     lab + ["finished_reason"], registry=r)
            self.m_running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                                   lab, registry=r)
            self.m_waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lab,
                                   registry=r)
            self.m_kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lab,
                              registry=r)
            self.m_ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token.", lab,
                                    registry=r, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
            self.m_itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.", lab,
                                   registry=r, buckets=(0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 1))
            for c in (self.m_drafts, self.m_draft_tokens, self.m_accepted, self.m_gen, self.m_prompt):
                c.labels(**self.lv)
            for p in range(self.k):
                self.m_pos.labels(position=str(p), **self.lv)
            for g in (self.m_running, self.m_waiting, self.m_kv):
                g.labels(**self.lv).set(0)
        else:
            lab = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
            self.lv = {"model_name": self.served, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                       "moe_ep_rank": "0"}
            self.m_al = Gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
                              lab, registry=r)
            self.m_ar = Gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
                              "(`accepted tokens / total draft tokens` in batch).", lab, registry=r)
            self.m_running = Gauge("sglang:num_running_reqs", "The number of running requests.", lab, registry=r)
            self.m_waiting = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", lab,
                                   registry=r)
            self.m_kv = Gauge("sglang:token_usage", "The token usage.", lab, registry=r)
            self.m_tput = Gauge("sglang:gen_throughput", "The generation throughput (token/s).", lab, registry=r)
            tl = ["model_name"]
            self.m_gen = Counter("sglang:generation_tokens", "Number of generation tokens processed.", tl, registry=r)
            self.m_prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", tl, registry=r)
            self.m_reqs = Counter("sglang:num_requests", "Number of requests processed.", tl, registry=r)
            self.m_ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token.", tl,
                                    registry=r, buckets=(0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40))
            self.m_itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency.", tl,
                                   registry=r, buckets=(0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025,
                                                        0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4))
            for g in (self.m_al, self.m_ar, self.m_running, self.m_waiting, self.m_kv, self.m_tput):
                g.labels(**self.lv).set(0)
            for c in (self.m_gen, self.m_prompt, self.m_reqs):
                c.labels(model_name=self.served)
            self.sg_window = []  # (accepted, drafts) of recent steps

    # --- generation ------------------------------------------------------------------------------------
    def generate(self, prompt_tokens: int, max_tokens: int) -> tuple[list[str], float]:
        with self.lock:
            self.running += 1
            self.m_running.labels(**self.lv).set(self.running)
        t0 = time.monotonic()
        out: list[str] = []
        ttft = None
        try:
            time.sleep(self.step)  # prefill
            if self.engine == "vllm":
                self.m_prompt.labels(**self.lv).inc(prompt_tokens)
            else:
                self.m_prompt.labels(model_name=self.served).inc(prompt_tokens)
            while len(out) < max_tokens:
                if self.k:
                    time.sleep(self.step * self.ratio)
                    acc = 0
                    while acc < self.k and self.rng.random() < self.alpha:
                        acc += 1
                    n = min(acc + 1, max_tokens - len(out))
                    self._spec_step(acc)
                else:
                    time.sleep(self.step)
                    n = 1
                for _ in range(n):
                    out.append(WORDS[(len(out) + prompt_tokens) % len(WORDS)])
                if ttft is None:
                    ttft = time.monotonic() - t0
                    self.m_ttft.labels(**self._tl()).observe(ttft)
                for _ in range(n):
                    self.m_itl.labels(**self._tl()).observe((self.step * (self.ratio if self.k else 1)) / n)
            if self.engine == "vllm":
                self.m_gen.labels(**self.lv).inc(len(out))
                self.m_success.labels(finished_reason="length", **self.lv).inc()
            else:
                self.m_gen.labels(model_name=self.served).inc(len(out))
                self.m_reqs.labels(model_name=self.served).inc()
        finally:
            with self.lock:
                self.running -= 1
                self.m_running.labels(**self.lv).set(self.running)
        return out, ttft or 0.0

    def _tl(self):
        return self.lv if self.engine == "vllm" else {"model_name": self.served}

    def _spec_step(self, acc: int):
        if self.engine == "vllm":
            self.m_drafts.labels(**self.lv).inc()
            self.m_draft_tokens.labels(**self.lv).inc(self.k)
            self.m_accepted.labels(**self.lv).inc(acc)
            for p in range(acc):
                self.m_pos.labels(position=str(p), **self.lv).inc()
        else:
            with self.lock:
                self.sg_window = (self.sg_window + [acc])[-200:]
                mean = sum(self.sg_window) / len(self.sg_window)
            self.m_al.labels(**self.lv).set(1 + mean)
            self.m_ar.labels(**self.lv).set(mean / self.k)


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
                if sim.engine == "sglang":
                    if not sim.ready:
                        return self._send(503, b"", "text/plain")
                    sim.generate(1, 1)
                return self._send(200, b"", "text/plain")
            if path == "/metrics":
                if sim.engine == "sglang" and not sim.opts.get("enable_metrics"):
                    return self._send(404, {"detail": "Not Found"})
                return self._send(200, generate_latest(sim.registry), CONTENT_TYPE_LATEST)
            if not sim.ready:
                return self._send(503, {"error": "Server is starting"})
            if not self._authorized():
                return
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": sim.served, "object": "model",
                                                                    "owned_by": sim.engine, "root": sim.served}]})
            if path == "/version":
                return self._send(200, {"version": sim.version})
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
            toks, _ = sim.generate(ptoks, int(req.get("max_tokens") or 64))
            text = " ".join(toks)
            usage = {"prompt_tokens": ptoks, "completion_tokens": len(toks), "total_tokens": ptoks + len(toks)}
            rid = f"cmpl-{random.getrandbits(48):x}"
            if path.endswith("chat/completions"):
                body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": sim.served,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                     "finish_reason": "length"}], "usage": usage}
            else:
                body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": sim.served,
                        "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}
            return self._send(200, body)
    return H


def load_progress(engine: str, load_s: float, shards: int = 64, graphs: int = 20):
    """The load-progress lines the engines print (tqdm over weight shards, the KV cache allocation, CUDA graph
    capture), spread over the simulated load time: 70% weights, 30% graphs."""
    t_shard, t_graph = 0.7 * load_s / shards, 0.3 * load_s / graphs
    for i in range(shards + 1):
        print(f"Loading safetensors checkpoint shards: {100 * i // shards:3d}% Completed | {i}/{shards} "
              f"[00:{int(i * t_shard):02d}<00:00, {1 / max(t_shard, 1e-3):.2f}it/s]", flush=True)
        if i < shards:
            time.sleep(t_shard)
    if engine == "vllm":
        print("INFO [gpu_worker.py:298] GPU KV cache size: 1,187,264 tokens", flush=True)
        print("INFO [kv_cache_utils.py:1091] Maximum concurrency for 262,144 tokens per request: 4.53x", flush=True)
    else:
        print("[2026-01-01 00:00:00 TP0] KV Cache is allocated. #tokens: 1187264, KV size: 38.72 GB", flush=True)
        print("[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.", flush=True)
    for i in range(graphs + 1):
        if engine == "vllm":
            print(f"Capturing CUDA graphs (decode, FULL): {100 * i // graphs:3d}%| | {i}/{graphs} "
                  f"[00:{int(i * t_graph):02d}<00:00]", flush=True)
        else:
            print(f"Capturing batches (bs={max(1, 512 >> i)} avail_mem=21.3 GB): {100 * i // graphs:3d}%| | "
                  f"{i}/{graphs} [00:{int(i * t_graph):02d}<00:00]", flush=True)
        if i < graphs:
            time.sleep(t_graph)
    if engine == "vllm":
        print(f"INFO [gpu_model_runner.py:3480] Graph capturing finished in {int(0.3 * load_s)} secs", flush=True)
    else:
        print(f"[2026-01-01 00:00:00 TP0] Capture cuda graph end. Time elapsed: {0.3 * load_s:.2f} s.", flush=True)


def run(engine: str, version: str, argv: list[str]) -> int:
    try:
        opts = parse_argv(engine, version, argv)
    except ArgError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 2
    sim = Sim(engine, version, opts)
    host, port = opts.get("host", "127.0.0.1"), int(opts.get("port", 8000 if engine == "vllm" else 30000))
    tp = int(opts.get("tensor_parallel_size") or opts.get("tp_size") or 1)
    print(f"specdeploy engine simulator: {engine} {version} (no GPU; for demos and tests) model={sim.served} "
          f"tp={tp} speculative={'k=%d' % sim.k if sim.k else 'off'}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as PID 1 in a container, too
    load_progress(engine, sim.load_s)
    if os.environ.get("SPECDEPLOY_SIM_CRASH") == "load":
        sys.stderr.write((sglang_crash_log if engine == "sglang" else crash_log)(version, sim.served, sim.k, tp))
        sys.stderr.flush()
        return 1
    # Both engines open their HTTP port only once the model is loaded.
    server = ThreadingHTTPServer((host, port), make_handler(sim))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sim.ready = True
    print(f"INFO:     Application startup complete. Uvicorn running on http://{host}:{port}", flush=True)
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
