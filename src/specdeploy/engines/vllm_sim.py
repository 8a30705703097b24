"""vLLM as the engine simulator plays it (testing/simulator.py asks this for everything engine-specific): its
command line, log records, metrics, crash log and serving-group ranks."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

from specdeploy.engines import eagle3_targets as e3
from specdeploy.engines.base import SimBehaviour, SimRank, SimReject
from specdeploy.engines.vllm_tables import SPEC_KEYS
from specdeploy.engines.vllm_wcsim import VLLMWeightCacheSim


class VLLMSim(SimBehaviour):
    """vLLM as the simulator plays it: ``vllm serve MODEL``, a pydantic-validated --speculative-config, the key in
    VLLM_API_KEY, spec-decode counters, and a multi-worker crash log."""

    argv_head = ("vllm", "serve")
    weight_cache = VLLMWeightCacheSim()
    positional_model = True
    # As vLLM 0.32.0 reports a bad command line (read on the real CPU build): argparse's usage, then the error;
    # unknown flags are reported by the top-level `vllm` parser.
    usage = "usage: vllm serve [model_tag] [options]"
    prog = "vllm serve"
    unknown_prog = "vllm"
    usage_on_error = True
    int_type_names = {"--max-model-len": "human_readable_int_or_auto"}
    booleans = frozenset({"--enable-expert-parallel", "--headless", "--trust-remote-code",
                          "--disable-custom-all-reduce", "--enable-prefix-caching", "--enable-auto-tool-choice",
                          "--enable-eplb", "--enforce-eager", "--language-model-only"})
    int_flags = frozenset({"--port", "--tensor-parallel-size", "--max-model-len", "--nnodes", "--node-rank",
                           "--master-port", "--data-parallel-size", "--data-parallel-size-local",
                           "--data-parallel-start-rank", "--data-parallel-rpc-port"})
    tp_option = "tensor_parallel_size"
    @property
    def kv_lines(self):
        return (_record("EngineCore_DP0", 4000, "INFO", "kv_cache_utils.py:1307",
                        "GPU KV cache size: 1,187,264 tokens"),
                _record("EngineCore_DP0", 4000, "INFO", "kv_cache_utils.py:1313",
                        "Maximum concurrency for 262,144 tokens per request: 4.53x"))

    def ready_lines(self, host, port, pid):
        # uvicorn's own lines, unprefixed (vLLM's line before them names the address differently per release)
        return [f"INFO:     Started server process [{pid}]", "INFO:     Waiting for application startup.",
                "INFO:     Application startup complete."]

    def shutdown_lines(self, pid):
        # vLLM 0.32.0 on SIGTERM: the engine core is told first, then uvicorn shuts down (exit status 0)
        return [_record("APIServer", pid, "INFO", "launcher.py:254", "[shutdown] API server: shutdown triggered"),
                _record("EngineCore", 4000, "INFO", "core.py:1454",
                        "[shutdown] EngineCore: trigger received signal=SIGTERM"),
                _record("APIServer", pid, "INFO", "launcher.py:304",
                        "[shutdown] API server: shutting down FastAPI HTTP server"),
                "INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
                "INFO:     Application shutdown complete."]

    def id_prefix(self, path):
        return "chatcmpl-" if path.endswith("chat/completions") else "cmpl-"

    def model_card(self, served, opts, engine):
        return {"id": served, "object": "model", "created": int(time.time()), "owned_by": engine,
                "root": opts.get("model"), "parent": None, "max_model_len": int(opts.get("max_model_len") or 262144)}

    def rank(self, opts):
        if opts.get("nnodes"):  # multi-node TP/PP: one node rank per host, the others --headless
            return SimRank(int(opts.get("node_rank") or 0), int(opts["nnodes"]), str(opts.get("master_addr")),
                           int(opts.get("master_port") or 29501), not opts.get("headless"))
        if opts.get("data_parallel_size_local"):  # DP across hosts: this host's first DP rank gives its index
            local = int(opts["data_parallel_size_local"])
            return SimRank(int(opts.get("data_parallel_start_rank") or 0) // local,
                           int(opts.get("data_parallel_size") or local) // local,
                           str(opts.get("data_parallel_address")), int(opts.get("data_parallel_rpc_port") or 29550),
                           not opts.get("headless"))
        return None

    # Read on the real 0.32.0 CPU build (tests/realengine/test_real_vllm_group.py): the leader's executor watches only
    # its local workers, so a follower that dies while the group serves goes unnoticed until the next step's
    # collective fails; that request gets 500, the engine core dies (EngineDeadError) and the API server shuts down
    # with exit status 0.
    lost_rank_noticed = "next-step"
    lost_exit_code = 0

    def group_lost_lines(self, rank, peer):
        gloo = (f"RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
                f"peer [{peer}]:{rank.port}. This is typically caused by a remote worker crashing.")
        return [_record("Worker_TP0", 4100, "ERROR", "multiproc_executor.py:1063", "WorkerProc hit an exception."),
                _record("Worker_TP0", 4100, "ERROR", "multiproc_executor.py:1063", gloo),
                _record("EngineCore", 4000, "ERROR", "core.py:1512", "EngineCore encountered a fatal error."),
                _record("EngineCore", 4000, "ERROR", "core.py:1512", f"RuntimeError: Worker failed with error "
                        f"'{gloo.removeprefix('RuntimeError: ')}', please check the stack trace above for the root "
                        "cause"),
                _record("APIServer", 3900, "ERROR", "async_llm.py:906", "AsyncLLM output_handler failed."),
                _record("APIServer", 3900, "ERROR", "async_llm.py:906", "vllm.v1.engine.exceptions.EngineDeadError: "
                        "EngineCore encountered an issue. See stack trace (above) for the root cause.")]

    def spec(self, version, opts, facts):
        """--speculative-config as vLLM's SpeculativeConfig validates it: known keys, a known method, k > 0."""
        if "speculative_config" not in opts:
            return None
        raw = opts["speculative_config"]
        head = "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
        cfg = json.loads(raw)  # bad JSON: a ValueError, reported by the CLI
        if not isinstance(cfg, dict):
            raise ValueError(f"--speculative-config must be a JSON object, got {raw!r}")
        keys = facts["spec_keys"] if facts else {k for k, span in SPEC_KEYS.items() if span.contains(version)}
        bad = [k for k in cfg if k not in keys]
        if bad:
            v = cfg[bad[0]]
            raise SimReject(f"{head}{bad[0]}\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
                            f"input_value={v!r}, input_type={type(v).__name__}]", 1)
        method = cfg.get("method")
        if facts and method is not None and method not in facts["spec_methods"]:
            allowed = ", ".join(repr(m) for m in sorted(facts["spec_methods"]))
            raise SimReject(f"{head}method\n  Input should be {allowed} [type=literal_error, input_value={method!r}]",
                            1)
        k = cfg.get("num_speculative_tokens")
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k <= 0):
            raise SimReject(f"{head}num_speculative_tokens\n  Input should be greater than 0 [type=greater_than, "
                            f"input_value={k!r}]", 1)
        if method == "eagle3":
            _whitelist_check(opts.get("model"), head)
        return {"k": int(k or 0), "method": method, "model": cfg.get("model")}

    def api_key(self, opts, env):
        return env.get("VLLM_API_KEY") or opts.get("api_key")

    def metrics(self, registry, served, k):
        return _VLLMSimMetrics(registry, served, k)

    def graph_line(self, i, graphs, t_graph):
        return (f"Capturing CUDA graphs (decode, FULL): {100 * i // graphs:3d}%| | {i}/{graphs} "
                f"[00:{int(i * t_graph):02d}<00:00]")

    def graphs_done(self, load_s):
        return _record("Worker_TP0", 4100, "INFO", "gpu_model_runner.py:3480",
                       f"Graph capturing finished in {int(0.3 * load_s)} secs")

    def crash_log(self, version, model, k, tp):
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
            src = rng.choice([x for x in lines if x])
            merged.append(src.pop(0))
        return CRASH_LOG.format(core=4000, ts=ts, version=version, model=model, k=k,
                                workers="\n".join(merged) + "\n")


def _installed_whitelist() -> list[str] | None:
    """The EAGLE-3 target list of the vLLM sources installed beside the simulator (the sandbox's stand-in image:
    patched or not, as its patch set says), found without importing them; None when there are none, or the
    release has no list."""
    import importlib.util
    try:
        found = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    root = Path(next(iter(found.submodule_search_locations))).parent
    try:
        return e3.whitelist_from_source(root / "vllm" / "config" / "speculative.py")
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _whitelist_check(model: str | None, head: str) -> None:
    """What the engine's SpeculativeConfig does with an EAGLE-3 target whose text model_type its list lacks."""
    types = _installed_whitelist()
    if types is None or not model:
        return
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return  # parse_argv reports the missing config
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    mt = text.get("model_type") if isinstance(text, dict) else None
    if isinstance(mt, str) and not any(t in mt for t in types):
        raise SimReject(f"{head}  Value error, Eagle3 is only supported for {types} models. Got "
                        f"self.target_model_config.hf_text_config.model_type={mt!r} [type=value_error, "
                        "input_value=ArgsKwargs((), {'method':..., _api_process_rank=0)}), input_type=ArgsKwargs]", 1)


def _record(proc: str, pid: int, level: str, where: str, msg: str) -> str:
    """One vLLM log record as V1 prints it: ``(Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``."""
    return f"({proc} pid={pid}) {level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}"


CRASH_LOG = (
    "(EngineCore_DP0 pid={core}) INFO {ts} [core.py:97] Initializing a V1 LLM engine (v{version}) with config: "
    "model='{model}', speculative_config=SpeculativeConfig(method='eagle3', num_spec_tokens={k})\n"
    "{workers}(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866] EngineCore failed to start.\n"
    "(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866] Traceback (most recent call last):\n"
    "(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866]   File "
    "\"/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py\", line 857, in run_engine_core\n"
    "(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866]     engine_core = EngineCoreProc(*args, **kwargs)\n"
    "(EngineCore_DP0 pid={core}) ERROR {ts} [core.py:866] Exception: WorkerProc initialization failed due to an "
    "exception in a background process. See stack trace for root cause.\n"
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
    "{{'EngineCore_DP0': 1}}\n")


TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
FINISH_REASONS = ("stop", "length", "abort", "error")  # 0.32.0 adds "repetition" (0.16.0 lacks it)


class _VLLMSimMetrics:
    def __init__(self, r, served, k):
        from prometheus_client import Counter, Gauge, Histogram
        lab = ["model_name", "engine"]
        self.lv = {"model_name": served, "engine": "0"}
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
        # help and buckets as vLLM 0.16.0 and 0.32.0 define them (v1/metrics/loggers.py)
        self.m_ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                lab, registry=r, buckets=TTFT_BUCKETS)
        self.m_itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                               lab, registry=r, buckets=ITL_BUCKETS)
        for c in (self.m_drafts, self.m_draft_tokens, self.m_accepted, self.m_gen, self.m_prompt):
            c.labels(**self.lv)
        for reason in FINISH_REASONS:  # every reason is exported from the start, at 0
            self.m_success.labels(finished_reason=reason, **self.lv)
        for p in range(k):
            self.m_pos.labels(position=str(p), **self.lv)
        for g in (self.m_running, self.m_waiting, self.m_kv):
            g.labels(**self.lv).set(0)

    def running(self, n):
        self.m_running.labels(**self.lv).set(n)

    def prompt(self, n):
        self.m_prompt.labels(**self.lv).inc(n)

    def generated(self, n):
        self.m_gen.labels(**self.lv).inc(n)
        self.m_success.labels(finished_reason="length", **self.lv).inc()

    def ttft(self, s):
        self.m_ttft.labels(**self.lv).observe(s)

    def itl(self, s):
        self.m_itl.labels(**self.lv).observe(s)

    def spec_step(self, acc, k):
        self.m_drafts.labels(**self.lv).inc()
        self.m_draft_tokens.labels(**self.lv).inc(k)
        self.m_accepted.labels(**self.lv).inc(acc)
        for p in range(acc):
            self.m_pos.labels(position=str(p), **self.lv).inc()
