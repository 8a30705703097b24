"""SGLang adapter (0.5.x up to 0.5.23); its release tables are in ``engines/sglang_tables.py``, how the simulator
plays it in ``engines/sglang_sim.py``."""
from __future__ import annotations

from pathlib import Path

from specdeploy.values.errors import Finding
from specdeploy.values.hostpaths import host_path
from specdeploy.values.peerhttp import url_host
from specdeploy.engines import eagle3_targets as e3
from specdeploy.engines import sglang_logs
from specdeploy.engines.base import (
    AllReducePath,
    Command,
    CommContext,
    EngineAdapter,
    Health,
    Metrics,
    SimBehaviour,
    Span,
    parse_version,
)
from specdeploy.engines.sglang_tables import (  # noqa: F401 (re-exported: the adapter's tables)
    SYNTHETIC,
    VERSIONS,
    CAPABILITIES,
    LAYOUTS,
    LAYOUT_FLAGS,
    FLAGS,
    CUSTOM_AR_WORLD_SIZES,
    CUSTOM_AR_MAX,
    CUSTOM_AR_INCLUSIVE,
    FI_FUSION_AUTO,
    FI_FUSION_ABSENT,
    FI_FUSION_CC,
    LOAD_FORMATS,
    DRAFTER,
    SPEC_METHODS,
    MTP_TARGETS_READ,
    MTP_TARGETS,
    PINS,
    IMAGE_CUDA,
    API_KEY_CREDENTIAL,
    WEIGHT_CACHE,
    WEIGHT_CACHE_RENDERED,
    WEIGHT_CACHE_ENGINE_FLAGS,
    WEIGHT_CACHE_ENV,
    WEIGHT_CACHE_QUANT,
    WEIGHT_CACHE_QUANT_READ,
    COMPILE_CACHE_ENV,
)
from specdeploy.engines.weightcache import Daemon, engine_flags

# the flags among WEIGHT_CACHE_ENGINE_FLAGS that take no value
_SWITCHES = frozenset({"--trust-remote-code", "--enable-dp-attention"})


class SGLang(EngineAdapter):
    name = "sglang"
    label = "SGLang"
    triage_signatures = sglang_logs.SIGNATURES
    load_log = sglang_logs.LOAD_LOG
    upstream_image = "lmsysorg/sglang"
    version_arg = "SGLANG_VERSION"
    # No SGLang patches exist; the package's own __init__ and version are enough to locate and name it.
    standin_files = ("__init__.py", "version.py")
    sandbox_version = "0.5.23"
    image_cuda = IMAGE_CUDA
    source_release = "wheel"
    default_port = 30000
    DRAFTER = DRAFTER
    drafter_fallback = "vLLM"
    synthetic_facts = SYNTHETIC  # the synthetic rejection method (engines/synthetic.py)
    eagle3_targets = e3.SGLANG_TARGETS
    eagle3_targets_read = e3.SGLANG_READ
    eagle3_interface = "set_eagle3_layers_to_capture"
    versions = VERSIONS
    pins = PINS
    spec_methods = SPEC_METHODS
    capabilities = CAPABILITIES
    flags = FLAGS
    layouts = LAYOUTS
    layout_flags = frozenset(LAYOUT_FLAGS)
    load_formats = LOAD_FORMATS
    launch_hint = "python -m sglang.launch_server --help"
    weight_cache_table = WEIGHT_CACHE
    weight_cache_host_pid = True  # the client polls the daemon's PID (its weights dangle once it is gone)
    weight_cache_rendered = WEIGHT_CACHE_RENDERED
    weight_cache_rendered_why = ("0.5.17 and 0.5.18 start the daemon with a parser of their own, and their engines do "
                                 "not add the daemon's weights to their memory baseline")
    weight_cache_quant = WEIGHT_CACHE_QUANT
    weight_cache_quant_read = WEIGHT_CACHE_QUANT_READ
    compile_cache_table = COMPILE_CACHE_ENV
    health = Health(
        liveness="/health",
        readiness="/health_generate",
        meaning="/health and /health_generate return 503 while the server is starting; once started they "
                "run a one-token generation and return 200 only if it completes within "
                "SGLANG_HEALTH_CHECK_TIMEOUT, so a wedged GPU loop reads as unhealthy.",
    )
    metrics = Metrics(
        spec_gauges={
            "acceptance_length": "sglang:spec_accept_length",
            "acceptance_rate": "sglang:spec_accept_rate",
            # a scheduler's generated tokens per second over the same logging interval as its acceptance gauges:
            # the weight of its figures when DP groups are aggregated
            "throughput": "sglang:gen_throughput",
        },
        serving={
            "ttft": "sglang:time_to_first_token_seconds",
            "itl": "sglang:inter_token_latency_seconds",
            "generation_tokens": "sglang:generation_tokens_total",
            "prompt_tokens": "sglang:prompt_tokens_total",
            "running": "sglang:num_running_reqs",
            "waiting": "sglang:num_queue_reqs",
            "kv_cache": "sglang:token_usage",
        },
        spans={"sglang:spec_accept_rate": Span("0.5.4")},  # absent in 0.5.3 (the exporter then reports no rate)
    )

    def spec_config_problems(self, hv, host):
        out = []
        if hv.specdeploy_api_key_file and not self.has("config_file"):
            since = CAPABILITIES["config_file"].since
            out.append(Finding("error", "specdeploy_api_key_file",
                               f"SGLang {self.version} has no --config file, so the API key could reach it only on "
                               "the command line, readable by every local user",
                               f"pin SGLang >= {since}, or unset specdeploy_api_key_file", host))
        for key in hv.specdeploy_spec_config_extra:
            flag = "--speculative-" + key.replace("_", "-").removeprefix("speculative-")
            if not self.flag_exists(flag):
                out.append(Finding("error", f"specdeploy_spec_config_extra.{key}",
                                   f"SGLang {self.version} has no {flag} flag specdeploy knows",
                                   "use num_steps, eagle_topk, num_draft_tokens, draft_model_quantization "
                                   "or pass the flag in specdeploy_engine_extra_args", host))
        return out

    def k_by_batch_problems(self, hv, host):
        out = super().k_by_batch_problems(hv, host)
        if out and self.has("adaptive_spec_per_batch"):
            # SGLang's per-batch-size steps are its adaptive speculation (a JSON file of candidate steps per
            # batch-size slot, routed by the CUDA-graph-padded batch size); specdeploy does not render it yet
            out[0].message = (f"SGLang {self.version} varies the steps per batch size only as adaptive speculation "
                              "(--speculative-adaptive-config), which specdeploy does not render")
        return out

    def spec_flags(self, hv, drafter_path):
        k = hv.specdeploy_spec_num_tokens
        extra = {key.removeprefix("speculative_"): v for key, v in hv.specdeploy_spec_config_extra.items()}
        topk = int(extra.pop("eagle_topk", 1))
        steps = int(extra.pop("num_steps", k))
        draft_tokens = int(extra.pop("num_draft_tokens", steps + 1 if topk == 1 else k + 1))
        argv = ["--speculative-algorithm", SPEC_METHODS[hv.specdeploy_spec_method].engine_name]
        if drafter_path and self.uses_drafter(hv):  # NEXTN: the engine takes the target's own path
            argv += ["--speculative-draft-model-path", drafter_path]
        if hv.specdeploy_spec_method != "ngram":
            argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                     "--speculative-num-draft-tokens", str(draft_tokens)]
        for key, v in extra.items():
            argv += ["--speculative-" + key.replace("_", "-"), str(v)]
        return argv

    def target_method_arch_problems(self, hv, target, host):
        arch = (target.architectures or [""])[0]
        v = parse_version(self.version)
        read = sorted(MTP_TARGETS_READ, key=parse_version)
        lo = [r for r in read if parse_version(r) <= v]
        hi = [r for r in read if parse_version(r) >= v]
        span = MTP_TARGETS.get(arch)
        if lo and hi:  # a read release, or one between two read releases that agree
            at = {r: span is not None and span.contains(r) for r in (lo[-1], hi[0])}
            if all(at.values()):
                return []
            if not any(at.values()):
                return [Finding("error", "specdeploy_spec_method", f"SGLang {self.version} finds the MTP (NEXTN) "
                                f"draft layers in the target only for {', '.join(sorted(MTP_TARGETS))}, not {arch}: "
                                "without --speculative-draft-model-path it has no draft model",
                                "serve this target with a separate drafter (eagle3), or without speculation", host)]
        return [Finding("warning", "specdeploy_spec_method", f"whether SGLang {self.version} finds MTP draft layers in "
                        f"{arch} was not read (read: {', '.join(read)})",
                        "check the release's speculative-decoding argument handling", host)]

    def allreduce_paths(self, ctx: CommContext) -> list[AllReducePath]:
        out = []
        ws = ctx.world_size
        if ctx.custom_all_reduce and ws in CUSTOM_AR_WORLD_SIZES and (ws == 2 or ctx.nvlink):
            incl = CUSTOM_AR_INCLUSIVE.contains(self.version)
            out.append(AllReducePath("custom all-reduce", CUSTOM_AR_MAX, incl,
                                     f"SGLang {self.version} CustomAllreduce: size {'<=' if incl else '<'} "
                                     f"{CUSTOM_AR_MAX} bytes"))
        if ws > 1 and ctx.compute_capability in FI_FUSION_CC and not FI_FUSION_ABSENT.contains(self.version):
            known = FI_FUSION_AUTO.contains(self.version)
            out.append(AllReducePath("FlashInfer all-reduce fusion", None, False,
                                     f"SGLang {self.version} "
                                     + ("enables it for Kimi-K2.5 on SM90/SM100" if known else
                                        "may enable it for Kimi-K2.5 (release not read)")
                                     + "; its size bound is not recorded"))
        return out

    def credential_content(self, name, key):
        import json
        return f"api-key: {json.dumps(key)}\n"  # a --config YAML file; a JSON string is a YAML scalar

    def command(self, hv, drafter_path=None, rank=None) -> Command:
        # SGLang's --tp-size spans the whole group under DP attention too (--attn-dp-size divides it).
        tp = rank.world if rank is not None and rank.layout in ("tp", "dp_ep") else hv.tp
        argv = ["python", "-m", "sglang.launch_server",
                "--model-path", hv.specdeploy_model_path,
                "--served-model-name", hv.served_model_name,
                "--host", hv.specdeploy_bind_address,
                "--port", str(hv.specdeploy_port),
                "--tp-size", str(tp),
                "--mem-fraction-static", str(self.memory_fraction(hv, self._attached(hv))),
                "--enable-metrics"]
        if self.flag_exists("--enable-metrics-for-all-schedulers"):
            argv.append("--enable-metrics-for-all-schedulers")
        layout_argv, layout_env = self.layout_args(hv, rank)
        argv += layout_argv
        if hv.specdeploy_expert_parallel and "--ep-size" not in argv:
            argv += ["--ep-size", str(tp)]
        if hv.specdeploy_max_model_len:
            argv += ["--context-length", str(hv.specdeploy_max_model_len)]
        if hv.specdeploy_trust_remote_code:
            argv.append("--trust-remote-code")
        backend = self.resolved(hv, "attention_backend")
        if backend:
            argv += ["--attention-backend", backend]
        if self.resolved(hv, "disable_custom_all_reduce"):
            argv.append("--disable-custom-all-reduce")
        if hv.specdeploy_load_format:
            argv += ["--load-format", hv.specdeploy_load_format]
        if hv.specdeploy_spec_enabled:
            argv += self.spec_flags(hv, drafter_path)
        credential = None
        if hv.specdeploy_api_key_file and self.has("config_file"):
            # The key lives in a 0600 YAML file handed over by systemd's LoadCredential=.
            credential = API_KEY_CREDENTIAL
            argv += ["--config", "${CREDENTIALS_DIRECTORY}/" + credential]
        argv += list(hv.specdeploy_engine_extra_args)
        env = dict(layout_env)
        if self._attached(hv):
            argv, wc_env = self.weight_cache_engine(hv, argv, host_path("weight_cache_sockets", self.name))
            env.update(wc_env)
        return Command(argv=argv, env=env, secret_env={}, credential=credential)

    # --- the weight-cache daemon (engines/weightcache.py; tables in sglang_tables.py) ---------------------------------
    def weight_cache_refusal(self, hv) -> str:
        if hv.specdeploy_spec_enabled and self._wc_has("refuses_speculation"):
            return (f"SGLang {self.version} refuses --weight-cache-mode together with speculative decoding (its "
                    "daemon exports no draft model): with speculation on, the engine loads from disk")
        if hv.specdeploy_topology == "pd":
            return f"SGLang {self.version}'s weight cache was not read for prefill/decode instances"
        return ""

    def weight_cache_quant_refusal(self, quant: str) -> str:
        return (f"SGLang {self.version}'s weight cache serves only unquantized and block-wise FP8 checkpoints "
                f"(IPC_QUANT_ALLOWLIST): a '{quant}' checkpoint makes the daemon and the client raise "
                "UnsupportedQuantForIPCError; restarts load from disk")

    def weight_cache_daemon(self, hv, rank, socket_dir: str) -> Daemon:
        """``python -m sglang.srt.weight_cache.daemon`` with the engine's weight-shaping server flags
        (WEIGHT_CACHE_ENGINE_FLAGS), its own rendezvous (``--dist-init-method``) and its sockets and ready files in
        ``socket_dir`` (the templates, which the engine reads too)."""
        engine = self.command(hv.model_copy(update={"specdeploy_weight_cache": "off"}), None, rank)
        args = engine.argv[3:]
        argv = ["python", "-m", "sglang.srt.weight_cache.daemon"]
        argv += engine_flags(args, WEIGHT_CACHE_ENGINE_FLAGS, _SWITCHES)
        host = url_host(rank.leader_address) if rank is not None and rank.multi_host else "127.0.0.1"
        timeout = str(hv.specdeploy_ready_timeout_s)  # the launcher's wait for every rank's ready file
        argv += ["--dist-init-method", f"tcp://{host}:{hv.specdeploy_weight_cache_port}", "--timeout", timeout,
                 "--weight-cache-timeout", timeout]
        n = rank.gpus if rank is not None and rank.layout in ("tp", "dp_ep") else hv.tp
        return Daemon(
            argv=argv, env={**engine.env, **self._wc_env(socket_dir)}, health=f"files:{socket_dir}/*.ready:{n}",
            socket_dir=socket_dir, local_ranks=n, host_pid=True,
            drafter=f"none: SGLang {self.version} serves the weight cache only without speculation",
            without_daemon="loads from disk when the daemon's socket file is absent (the release's own fallback); "
                           "fails on a refused connection or a config mismatch",
            notes=["the engine polls the daemon's PID every 5 s and kills itself when the daemon is gone"])

    @staticmethod
    def _wc_env(socket_dir: str) -> dict[str, str]:
        return {var: f"{socket_dir}/{{device_uuid}}{suffix}" for var, suffix in WEIGHT_CACHE_ENV.items()}

    def weight_cache_engine(self, hv, argv, socket_dir):
        return list(argv) + ["--weight-cache-mode", "client"], self._wc_env(socket_dir)

    def layout_args(self, hv, rank) -> tuple[list[str], dict[str, str]]:
        if rank is None or rank.layout == "single":
            return [], {}
        env = {"SGLANG_HOST_IP": rank.address}
        if rank.layout == "pd":
            argv = ["--disaggregation-mode", rank.role, "--disaggregation-transfer-backend", rank.transfer]
            if rank.role == "prefill":
                argv += ["--disaggregation-bootstrap-port", str(rank.pd_port)]
            return argv, env
        argv = ["--nnodes", str(rank.size), "--node-rank", str(rank.index),
                "--dist-init-addr", f"{url_host(rank.leader_address)}:{rank.port}"]
        if rank.layout == "dp_ep":
            argv += (["--attn-dp-size", str(rank.dp_size)] if self.has("attn_dp_size")
                     else ["--dp-size", str(rank.dp_size), "--enable-dp-attention"])
            argv += ["--ep-size", str(rank.world)]
        return argv, env

    def profile_defaults(self, profile) -> dict[str, object]:
        return self.pcie_defaults(profile, "flashinfer")

    def probe_unavailable(self) -> str:
        return ("SGLang's kernels are CUDA-only (sgl_kernel loads libcuda at import), so its probe can only run "
                "on a host with the engine image and a GPU; the doctor's rules stand alone here")

    def preflight(self, hv, target, drafter_fmt, rep, host) -> None:
        spec = hv.specdeploy_spec_enabled
        eagle3 = spec and hv.specdeploy_spec_method == "eagle3"
        prof = hv.profile()
        if spec and hv.specdeploy_spec_method == "eagle" and drafter_fmt in ("llama", "speculators", "mla"):
            rep.add("error", "specdeploy_spec_method", "EAGLE with an EAGLE-3 drafter runs silently at acceptance "
                    "length 1.0 on SGLang", "set specdeploy_spec_method: eagle3 (--speculative-algorithm EAGLE3)",
                    host)
        ok, why = self.eagle3_target(target.architectures, target.text_model_type) if eagle3 and target is not None \
            else (True, "")
        if ok is False:
            later = next((v for v in self.versions[self.versions.index(self.version) + 1:]
                          if SGLang(v).eagle3_target(target.architectures, target.text_model_type)[0]), None)
            rep.add("error", "specdeploy_engine_version", f"SGLang {self.version} has no EAGLE-3 support for "
                    f"{', '.join(target.architectures)} ({why}" + (f"; first in {later})" if later else ")"),
                    f"pin SGLang >= {later}" if later else "serve this target with another engine, or without "
                    "EAGLE-3", host)
        elif ok is None:
            rep.add("warning", "eagle3 target", f"{why}: whether it serves {target.architectures} as an EAGLE-3 "
                    "target is not known", "check the target on the engine itself", host)
        if prof.interconnect == "pcie" and prof.sm >= 120:
            if not self.resolved(hv, "disable_custom_all_reduce"):
                rep.add("error", "specdeploy_custom_all_reduce", "SGLang's custom all-reduce on PCIe SM120 hangs "
                        "or breaks CUDA-graph capture", "leave specdeploy_custom_all_reduce unset or false", host)
            if not self.resolved(hv, "attention_backend"):
                rep.add("error", "specdeploy_attention_backend", "no explicit attention backend on SM120: SGLang "
                        "may pick an SM90/SM100-only MLA kernel", "set specdeploy_attention_backend: flashinfer "
                        "(or triton)", host)

    def drafter_taps(self, top, nested, default, deepseek_target):
        # SGLang reads only eagle_config's ids, in its own numbering (output of layer L: vLLM id - 1).
        if nested is not None:
            if DRAFTER["aux_deepseek_heuristic"].contains(self.version) and deepseek_target and nested[0] != 1:
                return list(nested), "nested key taken as-is by the DeepSeek/Kimi target (first id is not 1)"
            return [x + 1 for x in nested], "nested key"
        return default, "default (SGLang reads only the nested key)"

    def drafter_nested_ids(self, taps, deepseek_target):
        nested = [x - 1 for x in taps]
        if DRAFTER["aux_deepseek_heuristic"].contains(self.version) and deepseek_target and nested[0] != 1:
            nested = list(taps)  # this target takes ids whose first is not 1 as they are
        return nested

    @classmethod
    def facts_from_source(cls, root) -> dict:
        import ast

        from specdeploy.engines.sourcescan import class_fields, flag_literals, strings
        srt = Path(root) / cls.name / "srt"
        flags: set[str] = set()
        algos: set[str] = set()
        for f in sorted((srt / "arg_groups").rglob("*.py")) + [srt / "server_args.py"]:
            if not f.exists():
                continue
            flags |= {"--" + n.replace("_", "-") for n in class_fields(f, lambda c: True)} | flag_literals(f)
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                        and node.args[0].value == "--speculative-algorithm"):
                    for kw in node.keywords:
                        if kw.arg == "choices":
                            algos |= set(strings(kw.value))
        spec = srt / "speculative"
        for f in (spec / "spec_info.py", spec / "spec_registry.py"):
            if not f.exists():
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ClassDef) and node.name == "SpeculativeAlgorithm":
                    algos |= {t.id for s in node.body if isinstance(s, ast.Assign) for t in s.targets
                              if isinstance(t, ast.Name) and t.id.isupper() and t.id != "NONE"}
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_RESERVED_ALIASES"
                                                        for t in node.targets):
                    algos |= set(strings(node.value))
        daemon = srt / "weight_cache" / "daemon.py"  # the weight-cache daemon's own flags (beside the server's)
        return {"flags": sorted(flags), "spec_methods": sorted(algos),
                "daemon_flags": sorted(flag_literals(daemon)) if daemon.exists() else []}

    @classmethod
    def eagle3_targets_from_source(cls, root) -> tuple[set[str], None]:
        """(EntryClass architectures with a set_eagle3_layers_to_capture method, own or inherited; no type list)."""
        from specdeploy.engines.sourcescan import entry_classes, implementers, model_classes
        models = Path(root) / cls.name / "srt" / "models"
        classes = model_classes(models)
        return {a for a, m in entry_classes(models).items()
                if implementers(classes, m, a, lambda name, e: "set_eagle3_layers_to_capture" in e[1])}, None

    @classmethod
    def simulation(cls) -> SimBehaviour:
        from specdeploy.engines.sglang_sim import SGLangSim
        return SGLangSim()
