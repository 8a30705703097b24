"""A third engine, defined only here and registered through the registry API: "toyserve", an imaginary server
with its own command line, metric names (counters under ``toyserve:``), per-version capabilities, a preflight
rule, per-hardware defaults and simulator behaviour. tests/unit/engines/test_engine_registry.py deploys it through
the same
code paths as the real engines; nothing outside this file knows it."""
from __future__ import annotations

import json

from specdeploy import engines
from specdeploy.engines import Command, EngineAdapter, Health, Metrics, Pin, SimBehaviour, SimReject, Span, SpecMethod

PREFIX = "toyserve"


class ToySim(SimBehaviour):
    argv_head = ("toyserve", "run")
    usage = "usage: toyserve run --model PATH [options]"
    prog = "toyserve"
    booleans = frozenset({"--trust-remote-code"})
    int_flags = frozenset({"--port", "--tp", "--draft-tokens"})
    tp_option = "tp"
    served_option = "served_name"
    kv_lines = ("toyserve: kv cache ready",)

    def spec(self, version, opts, facts):
        if "draft_config" not in opts:
            return None
        cfg = json.loads(opts["draft_config"])
        if set(cfg) - {"model", "tokens"}:
            raise SimReject(f"toyserve: unknown draft settings {sorted(set(cfg) - {'model', 'tokens'})}")
        return {"k": int(cfg["tokens"]), "method": "eagle3", "model": cfg.get("model")}

    def api_key(self, opts, env):
        return env.get("TOYSERVE_KEY")

    def metrics(self, registry, served, k):
        return ToyMetrics(registry, k)

    def graph_line(self, i, graphs, t_graph):
        return f"toyserve: warming up {i}/{graphs}"

    def graphs_done(self, load_s):
        return "toyserve: ready to serve"

    def crash_log(self, version, model, k, tp):
        return "".join(f"toyserve[rank {r}] FATAL: out of memory while loading {model}\n" for r in range(tp))


class ToyMetrics:
    def __init__(self, r, k):
        from prometheus_client import Counter, Gauge, Histogram
        self.drafts = Counter(f"{PREFIX}:drafts", "Drafts.", registry=r)
        self.draft_tokens = Counter(f"{PREFIX}:draft_tokens", "Draft tokens.", registry=r)
        self.accepted = Counter(f"{PREFIX}:accepted_tokens", "Accepted tokens.", registry=r)
        self.per_pos = Counter(f"{PREFIX}:accepted_at", "Accepted per position.", ["position"], registry=r)
        self.gen = Counter(f"{PREFIX}:output_tokens", "Output tokens.", registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}:input_tokens", "Input tokens.", registry=r)
        self.run = Gauge(f"{PREFIX}:active", "Active requests.", registry=r)
        self.queue = Gauge(f"{PREFIX}:queued", "Queued requests.", registry=r)
        self.kv = Gauge(f"{PREFIX}:cache_fill", "Cache fill.", registry=r)
        self.first = Histogram(f"{PREFIX}:first_token_seconds", "First token.", registry=r)
        self.gap = Histogram(f"{PREFIX}:token_gap_seconds", "Token gap.", registry=r)
        for p in range(k):
            self.per_pos.labels(position=str(p))

    def running(self, n):
        self.run.set(n)

    def prompt(self, n):
        self.prompt_tokens.inc(n)

    def generated(self, n):
        self.gen.inc(n)

    def ttft(self, s):
        self.first.observe(s)

    def itl(self, s):
        self.gap.observe(s)

    def spec_step(self, acc, k):
        self.drafts.inc()
        self.draft_tokens.inc(k)
        self.accepted.inc(acc)
        for p in range(acc):
            self.per_pos.labels(position=str(p)).inc()


class ToyServe(EngineAdapter):
    name = "toyserve"
    label = "ToyServe"
    versions = ("1.0.0", "1.1.0", "2.0.0")
    pins = (Pin("1.1.0", "the first release that runs a draft model"),)
    spec_methods = {"eagle3": SpecMethod("eagle3", "drafter")}  # its preflight refuses it before 1.1.0
    capabilities = {"draft_model": Span("1.1.0")}
    flags = {f: Span() for f in ("--model", "--served-name", "--host", "--port", "--tp", "--trust-remote-code",
                                 "--memory-fraction")} | {"--draft-config": Span("1.1.0"), "--no-p2p": Span()}
    health = Health(liveness="/health", readiness="/health", meaning="200 once loaded")
    metrics = Metrics(
        spec_counters={"drafts": f"{PREFIX}:drafts_total", "draft_tokens": f"{PREFIX}:draft_tokens_total",
                       "accepted_tokens": f"{PREFIX}:accepted_tokens_total",
                       "accepted_tokens_per_pos": f"{PREFIX}:accepted_at_total"},
        serving={"ttft": f"{PREFIX}:first_token_seconds", "itl": f"{PREFIX}:token_gap_seconds",
                 "generation_tokens": f"{PREFIX}:output_tokens_total", "prompt_tokens": f"{PREFIX}:input_tokens_total",
                 "running": f"{PREFIX}:active", "waiting": f"{PREFIX}:queued", "kv_cache": f"{PREFIX}:cache_fill"})
    default_port = 7070
    upstream_image = "example.org/toyserve"
    version_arg = "TOYSERVE_VERSION"
    sandbox_version = "1.1.0"
    # Drafter conventions: flat Llama EAGLE-3 drafters only, aux ids read from the top-level key.
    DRAFTER = {"reads_speculators": False, "aux_key": "eagle_aux_hidden_state_layer_ids", "eagle3_prefix": False,
               "convert_archs": {"llama": "LlamaForCausalLMEagle3", "mla": None},
               "archs": {"LlamaForCausalLMEagle3": Span()}}
    drafter_fallback = "vLLM"

    def drafter_taps(self, top, nested, default, deepseek_target):
        return (list(top), "top-level key") if top is not None else (default, "default")

    def command(self, hv, drafter_path=None, rank=None) -> Command:
        argv = ["toyserve", "run", "--model", hv.specdeploy_model_path, "--served-name", hv.served_model_name,
                "--host", hv.specdeploy_bind_address, "--port", str(hv.specdeploy_port), "--tp", str(hv.tp),
                "--memory-fraction", str(hv.specdeploy_gpu_memory_utilization)]
        if hv.specdeploy_trust_remote_code:
            argv.append("--trust-remote-code")
        if self.resolved(hv, "disable_custom_all_reduce"):
            argv.append("--no-p2p")
        if hv.specdeploy_spec_enabled and self.has("draft_model"):
            argv += ["--draft-config", json.dumps({"model": drafter_path, "tokens": hv.specdeploy_spec_num_tokens})]
        argv += list(hv.specdeploy_engine_extra_args)
        secret = {"TOYSERVE_KEY": "api_key"} if hv.specdeploy_api_key_file else {}
        return Command(argv=argv, env={"TOYSERVE_TELEMETRY": "off"}, secret_env=secret)

    def allreduce_paths(self, ctx):
        return []

    def profile_defaults(self, profile):
        return {"disable_custom_all_reduce": True} if profile.interconnect == "pcie" else {}

    def preflight(self, hv, target, drafter_fmt, rep, host):
        if hv.specdeploy_spec_enabled and not self.has("draft_model"):
            rep.add("error", "specdeploy_engine_version", f"ToyServe {self.version} cannot run a draft model",
                    f"pin ToyServe >= {self.capabilities['draft_model'].since}, or set specdeploy_spec_enabled: "
                    "false", host)

    @classmethod
    def simulation(cls):
        return ToySim()


def install():
    engines.register(ToyServe)


def uninstall():
    engines.unregister(ToyServe.name)
