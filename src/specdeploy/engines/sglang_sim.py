"""SGLang as the engine simulator plays it (testing/simulator.py asks this for everything engine-specific): its
command line, the key in a --config YAML, acceptance gauges, health checks that generate, log lines, the crash log
and serving-group ranks."""
from __future__ import annotations

import os
import random
import time

from specdeploy.engines.base import SimBehaviour, SimRank, SimReject
from specdeploy.engines.sglang_wcsim import SGLangWeightCacheSim


class SGLangSim(SimBehaviour):
    """SGLang as the simulator plays it: ``python -m sglang.launch_server``, --speculative-algorithm, the key in a
    --config YAML, acceptance as gauges of recent batches, health checks that generate, /metrics only with
    --enable-metrics, and a scheduler crash log."""

    argv_head = ("python", "-m", "sglang.launch_server")
    weight_cache = SGLangWeightCacheSim()
    usage = "usage: python -m sglang.launch_server --model-path PATH [options]"
    prog = "launch_server"
    booleans = frozenset({"--trust-remote-code", "--enable-metrics", "--enable-dp-attention",
                          "--disable-custom-all-reduce", "--enable-metrics-for-all-schedulers"})
    int_flags = frozenset({"--port", "--tp-size", "--ep-size", "--nnodes", "--node-rank", "--dp-size",
                           "--attn-dp-size", "--disaggregation-bootstrap-port", "--context-length",
                           "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"})
    tp_option = "tp_size"
    health_generates = True
    metrics_option = "enable_metrics"
    kv_lines = ("[2026-01-01 00:00:00 TP0] KV Cache is allocated. #tokens: 1187264, KV size: 38.72 GB",
                "[2026-01-01 00:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.")

    def rank(self, opts):
        if not opts.get("nnodes") or int(opts["nnodes"]) < 2:
            return None
        host, _, port = str(opts.get("dist_init_addr") or "").rpartition(":")
        index = int(opts.get("node_rank") or 0)
        return SimRank(index, int(opts["nnodes"]), host.strip("[]"), int(port or 0), index == 0)

    def pd_role(self, opts):
        mode = opts.get("disaggregation_mode") or "null"
        if mode not in ("prefill", "decode"):
            return None
        return mode, int(opts.get("disaggregation_bootstrap_port") or 8998)

    def info(self, path, sim):
        # what sglang-router (its PD mode) reads from each instance when it registers it
        if path in ("/server_info", "/get_server_info"):
            role = self.pd_role(sim.opts)
            return {"model_path": sim.opts.get("model_path"), "served_model_name": sim.served,
                    "tp_size": int(sim.opts.get("tp_size") or 1), "dp_size": 1,
                    "disaggregation_mode": role[0] if role else "null", "version": sim.version}
        if path in ("/model_info", "/get_model_info"):
            return {"model_path": sim.opts.get("model_path"), "tokenizer_path": sim.opts.get("model_path"),
                    "is_generation": True}
        return None

    def group_lost_lines(self, rank, peer):
        return [f"[2026-01-01 00:00:00 TP0] Scheduler hit an exception: RuntimeError: Connection closed by peer "
                f"[{peer}]", "[2026-01-01 00:00:00] Received sigquit from a child process. It usually means the "
                "child failed."]

    def spec(self, version, opts, facts):
        if "speculative_algorithm" not in opts:
            return None
        algo = opts["speculative_algorithm"]
        methods = facts["spec_methods"] if facts else {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"}
        if algo.upper() not in methods:
            raise SimReject(f"ValueError: Unknown speculative algorithm name: {algo}")
        return {"k": int(opts.get("speculative_num_steps", 3)), "method": algo,
                "model": opts.get("speculative_draft_model_path")}

    def api_key(self, opts, env):
        cfg = opts.get("config")
        if cfg and os.path.isfile(cfg):
            import yaml
            with open(cfg) as fh:
                data = yaml.safe_load(fh) or {}
            return data.get("api-key") or data.get("api_key")
        return opts.get("api_key")

    def metrics(self, registry, served, k):
        return _SGLangSimMetrics(registry, served)

    def graph_line(self, i, graphs, t_graph):
        return (f"Capturing batches (bs={max(1, 512 >> i)} avail_mem=21.3 GB): {100 * i // graphs:3d}%| | "
                f"{i}/{graphs} [00:{int(i * t_graph):02d}<00:00]")

    def graphs_done(self, load_s):
        return f"[2026-01-01 00:00:00 TP0] Capture cuda graph end. Time elapsed: {0.3 * load_s:.2f} s."

    def crash_log(self, version, model, k, tp):
        """SGLang's format: ``[date time TPn] message``; a scheduler's traceback starts mid-line and its
        continuation lines carry no prefix. Each rank writes its block in one piece, so ranks interleave by block,
        not by line."""
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        out = [(f"[{ts}] server_args=ServerArgs(model_path='{model}', tp_size={tp}, trust_remote_code=True, "
                f"speculative_algorithm='EAGLE3', speculative_num_steps={k}, sglang_version='{version}')\n")]
        out += [f"[{ts} TP{r}] Load weight end. type=KimiK25ForConditionalGeneration, dtype=torch.bfloat16\n"
                for r in range(tp)]
        out += [f"[{ts} TP{r}] Capture cuda graph begin. This can take up to several minutes.\n" for r in range(tp)]
        ranks = list(range(tp))
        random.Random(1).shuffle(ranks)
        out += [f"[{ts} TP{r}] Scheduler hit an exception: Traceback (most recent call last):\n" + CRASH_TB
                for r in ranks]
        out.append(f"[{ts}] Received sigquit from a child process. It usually means the child failed.\n")
        return "".join(out)


CRASH_TB = (
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2566, in run_scheduler_process\n'
    "    scheduler = Scheduler(\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 1801, '
    'in init_device_graphs\n'
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


class _SGLangSimMetrics:
    def __init__(self, r, served):
        from prometheus_client import Counter, Gauge, Histogram
        lab = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        self.served = served
        self.lv = {"model_name": served, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
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
            c.labels(model_name=served)
        self.window: list[int] = []  # accepted tokens of recent steps
        import threading
        self.lock = threading.Lock()

    def running(self, n):
        self.m_running.labels(**self.lv).set(n)

    def prompt(self, n):
        self.m_prompt.labels(model_name=self.served).inc(n)

    def generated(self, n):
        self.m_gen.labels(model_name=self.served).inc(n)
        self.m_reqs.labels(model_name=self.served).inc()

    def ttft(self, s):
        self.m_ttft.labels(model_name=self.served).observe(s)

    def itl(self, s):
        self.m_itl.labels(model_name=self.served).observe(s)

    def spec_step(self, acc, k):
        with self.lock:
            self.window = (self.window + [acc])[-200:]
            mean = sum(self.window) / len(self.window)
        self.m_al.labels(**self.lv).set(1 + mean)
        self.m_ar.labels(**self.lv).set(mean / k)
