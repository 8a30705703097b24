"""vLLM adapter (0.16.0 through 0.33.0)."""
from __future__ import annotations

import json
from pathlib import Path

from specdeploy.values.errors import Finding
from specdeploy.values.hostpaths import host_path
from specdeploy.engines import eagle3_targets as e3
from specdeploy.engines import vllm_logs
from specdeploy.engines.base import (
    AllReducePath,
    Command,
    CommContext,
    EngineAdapter,
    Health,
    Metrics,
    SimBehaviour,
    dumps_compact,
)
from specdeploy.engines.vllm_tables import (  # noqa: F401 (re-exported: the adapter's tables)
    SYNTHETIC,
    VERSIONS,
    CAPABILITIES,
    SPEC_KEYS,
    FLAGS,
    LAYOUTS,
    LAYOUT_FLAGS,
    CUSTOM_AR_WORLD_SIZES,
    CUSTOM_AR_MAX,
    CUSTOM_AR_MAX_WITH_SYMM_MEM,
    SYMM_MEM_MAX,
    SYMM_MEM_INCLUSIVE,
    FI_FUSION,
    FI_FUSION_MAX,
    LOAD_FORMATS,
    DRAFTER,
    SPEC_METHODS,
    MTP_MODEL_TYPES,
    MTP_MODEL_TYPES_READ,
    PINS,
    KIMI_EAGLE3_PATCHES,
    IMAGE_CUDA,
    CPU_BUILDS,
    CPU_MLA_DRAFTER_ENV,
    WEIGHT_CACHE,
    WEIGHT_CACHE_RENDERED,
    WEIGHT_CACHE_ENGINE_FLAGS,
    WEIGHT_CACHE_QUANT,
    WEIGHT_CACHE_QUANT_READ,
    COMPILE_CACHE_ENV,
)
from specdeploy.engines.weightcache import Daemon, engine_flags

# the ipc_cache loader's wait for its daemon and the handle transfer (state_timeout_s): the deploy starts the engine
# only once its daemon is ready, so this bounds how long an engine that finds none waits before it fails
WEIGHT_CACHE_STATE_TIMEOUT_S = 120
# the flags among WEIGHT_CACHE_ENGINE_FLAGS that take no value
_SWITCHES = frozenset({"--enable-expert-parallel", "--trust-remote-code", "--language-model-only"})


class VLLM(EngineAdapter):
    name = "vllm"
    label = "vLLM"
    cpu_builds = CPU_BUILDS
    cpu_mla_drafter_env = CPU_MLA_DRAFTER_ENV
    triage_signatures = vllm_logs.signatures(CAPABILITIES["kimi_eagle3_upstream"].since)
    load_log = vllm_logs.LOAD_LOG
    upstream_image = "vllm/vllm-openai"
    version_arg = "VLLM_VERSION"
    standin_build_args = {"IMPORT_CHECK": "0"}  # the stand-in has vLLM's Python sources but no torch
    sandbox_version = "0.16.0"
    image_cuda = IMAGE_CUDA
    source_release = "sdist"
    DRAFTER = DRAFTER
    synthetic_facts = SYNTHETIC  # the synthetic rejection method (engines/synthetic.py)
    eagle3_targets = e3.VLLM_TARGETS
    eagle3_targets_read = e3.VLLM_READ
    eagle3_whitelist = e3.VLLM_WHITELIST
    eagle3_whitelist_span = e3.VLLM_WHITELIST_SPAN
    eagle3_interface = "SupportsEagle3"
    versions = VERSIONS
    pins = PINS
    spec_methods = SPEC_METHODS
    capabilities = CAPABILITIES
    flags = FLAGS
    layouts = LAYOUTS
    layout_flags = frozenset(LAYOUT_FLAGS)
    load_formats = LOAD_FORMATS
    launch_hint = "vllm serve --help=all"
    weight_cache_table = WEIGHT_CACHE
    weight_cache_rendered = WEIGHT_CACHE_RENDERED
    weight_cache_rendered_why = ("0.30.0 starts the daemon as a module without a health endpoint and serves TP and "
                                 "EP only; the engines of 0.30.0 and 0.31.0 do not count the daemon's weights in "
                                 "their memory budget")
    weight_cache_quant = WEIGHT_CACHE_QUANT
    weight_cache_quant_read = WEIGHT_CACHE_QUANT_READ
    compile_cache_table = COMPILE_CACHE_ENV
    health = Health(
        liveness="/health",
        readiness="/health",
        meaning="The API server listens only after the model is loaded; /health returns 200 while the "
                "engine core is alive and 503 once it has died (the process may still exit 0).",
    )
    metrics = Metrics(
        spec_counters={
            "drafts": "vllm:spec_decode_num_drafts_total",
            "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
            "accepted_tokens_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        },
        serving={
            "ttft": "vllm:time_to_first_token_seconds",
            "itl": "vllm:inter_token_latency_seconds",
            "generation_tokens": "vllm:generation_tokens_total",
            "prompt_tokens": "vllm:prompt_tokens_total",
            "running": "vllm:num_requests_running",
            "waiting": "vllm:num_requests_waiting",
            "kv_cache": "vllm:kv_cache_usage_perc",
        },
    )

    def spec_config(self, hv, drafter_path: str | None) -> dict:
        cfg = {"method": SPEC_METHODS[hv.specdeploy_spec_method].engine_name,
               "num_speculative_tokens": hv.specdeploy_spec_num_tokens}
        if drafter_path and self.uses_drafter(hv):
            cfg["model"] = drafter_path  # mtp: none, the engine takes the target's own MTP layers
        if hv.specdeploy_spec_k_by_batch and self.takes_k_by_batch():
            cfg["num_speculative_tokens_per_batch_size"] = k_schedule(hv.specdeploy_spec_k_by_batch)
        if self._attached(hv) and self._wc_has("draft_group") and cfg["method"] in ("eagle", "eagle3", "mtp"):
            # the drafter loads from disk with the engine: without draft_load_config the release sends it to the
            # daemon's draft group, which specdeploy does not start (a new drafter never restarts the daemon)
            cfg["draft_load_config"] = {"load_format": hv.specdeploy_load_format or "auto"}
        cfg.update(hv.specdeploy_spec_config_extra)
        return cfg


    def spec_config_problems(self, hv, host):
        out = []
        for key in hv.specdeploy_spec_config_extra:
            span = SPEC_KEYS.get(key)
            if span is None or not span.contains(self.version):
                if span is not None and span.until:
                    why = f"was removed in vLLM {span.until}"
                elif span is not None:
                    why = f"exists only from vLLM {span.since}"
                else:
                    why = "is not a SpeculativeConfig key"
                valid = sorted(k for k, s in SPEC_KEYS.items() if s.contains(self.version))
                out.append(Finding("error", f"specdeploy_spec_config_extra.{key}",
                                   f"'{key}' {why}; vLLM {self.version} rejects unknown keys at startup",
                                   f"remove it; keys valid on {self.version}: {', '.join(valid)}", host))
        return out

    def target_method_arch_problems(self, hv, target, host):
        mt = target.model_type
        span = MTP_MODEL_TYPES.get(mt)
        if span is not None and span.contains(self.version):
            return []
        read = MTP_MODEL_TYPES_READ
        if span is None and self.version in read:
            return [Finding("error", "specdeploy_spec_method", f"vLLM {self.version} builds an MTP drafter only for "
                            f"the model types its speculative config maps ({', '.join(MTP_MODEL_TYPES)}), not "
                            f"'{mt}'", "serve this target with a separate drafter (eagle3), or without speculation",
                            host)]
        return [Finding("warning", "specdeploy_spec_method", f"whether vLLM {self.version} builds an MTP drafter for "
                        f"model_type '{mt}' was not read (read: {', '.join(read)})",
                        "check the release's SpeculativeConfig.hf_config_override", host)]

    def allreduce_paths(self, ctx: CommContext) -> list[AllReducePath]:
        out = []
        cc, ws = ctx.compute_capability, ctx.world_size
        symm = ctx.multicast and ws in SYMM_MEM_MAX.get(cc, {})
        sizes = next(s for span, s in CUSTOM_AR_WORLD_SIZES if span.contains(self.version))
        if ctx.custom_all_reduce and ws in sizes and (ws == 2 or ctx.nvlink):
            cap = min(CUSTOM_AR_MAX_WITH_SYMM_MEM.get(cc, {}).get(ws, CUSTOM_AR_MAX), CUSTOM_AR_MAX) if symm \
                else CUSTOM_AR_MAX
            out.append(AllReducePath("custom all-reduce", cap, False,
                                     f"vLLM {self.version} CustomAllreduce: size < {cap} bytes"
                                     + (" (capped while symmetric memory is active)" if symm else "")))
        if symm:
            cap = SYMM_MEM_MAX[cc][ws]
            incl = SYMM_MEM_INCLUSIVE.contains(self.version)
            out.append(AllReducePath("torch symmetric-memory all-reduce", cap, incl,
                                     f"vLLM {self.version} SymmMemCommunicator (VLLM_ALLREDUCE_USE_SYMM_MEM=1, "
                                     f"NVSwitch multicast): size {'<=' if incl else '<'} {cap} bytes"))
        if FI_FUSION.contains(self.version) and ws > 1 and ws in FI_FUSION_MAX.get(cc, {}):
            cap = FI_FUSION_MAX[cc][ws]
            out.append(AllReducePath("FlashInfer all-reduce+RMSNorm fusion", cap, False,
                                     f"vLLM {self.version} fuse_allreduce_rms (default at -O2 on "
                                     f"SM{cc.replace('.', '')}, compiled model): size < {cap} bytes"))
        return out

    def command(self, hv, drafter_path=None, rank=None) -> Command:
        argv = ["vllm", "serve", hv.specdeploy_model_path,
                "--served-model-name", hv.served_model_name,
                "--host", hv.specdeploy_bind_address,
                "--port", str(hv.specdeploy_port),
                "--tensor-parallel-size", str(self.tp_of(hv, rank)),
                "--gpu-memory-utilization", str(self.memory_fraction(hv, self._attached(hv)))]
        layout_argv, layout_env = self.layout_args(hv, rank)
        argv += layout_argv
        if hv.specdeploy_expert_parallel and "--enable-expert-parallel" not in argv:
            argv.append("--enable-expert-parallel")
        if hv.specdeploy_max_model_len:
            argv += ["--max-model-len", str(hv.specdeploy_max_model_len)]
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
            argv += ["--speculative-config", dumps_compact(self.spec_config(hv, drafter_path))]
        argv += list(hv.specdeploy_engine_extra_args)
        if self._attached(hv):
            argv, _ = self.weight_cache_engine(hv, argv, host_path("weight_cache_sockets", self.name))
        env = {"VLLM_NO_USAGE_STATS": "1", **layout_env}
        secret = {"VLLM_API_KEY": "api_key"} if hv.specdeploy_api_key_file and self.has("api_key_env") else {}
        return Command(argv=argv, env=env, secret_env=secret)

    # --- the weight-cache daemon (engines/weightcache.py; tables in vllm_tables.py) ---------------------------------
    def weight_cache_refusal(self, hv) -> str:
        if self._wc_has("engine_outlives_daemon") and "--enable-eplb" in hv.specdeploy_engine_extra_args:
            return f"vLLM {self.version}'s ipc_cache loader refuses EPLB (--enable-eplb)"
        return ""

    def weight_cache_quant_refusal(self, quant: str) -> str:
        classes = WEIGHT_CACHE_QUANT[quant][1]
        return (f"vLLM {self.version}'s weight cache cannot hold a '{quant}' checkpoint: {' and '.join(classes)} "
                "do not declare supports_pre_processed_weights, so the daemon exits with UnsupportedQuantForIPCError "
                "before it loads (and an engine with --load-format ipc_cache raises it even with fallback on); "
                "restarts load from disk")

    def weight_cache_daemon(self, hv, rank, socket_dir: str) -> Daemon:
        """``vllm preload --model M`` with the engine's weight-shaping flags (WEIGHT_CACHE_ENGINE_FLAGS), its sockets
        in ``socket_dir``, its own rendezvous port and /health on 127.0.0.1."""
        engine = self.command(hv.model_copy(update={"specdeploy_weight_cache": "off"}), None, rank)
        argv = ["vllm", "preload", "--model", hv.specdeploy_model_path]
        args = engine.argv[3:]
        argv += engine_flags(args, WEIGHT_CACHE_ENGINE_FLAGS, _SWITCHES)
        if hv.specdeploy_load_format:
            argv += ["--load-format", hv.specdeploy_load_format]
        hp = hv.specdeploy_weight_cache_health_port
        argv += ["--weight-cache-socket-dir", socket_dir, "--weight-cache-master-port",
                 str(hv.specdeploy_weight_cache_port), "--weight-cache-health-port", str(hp),
                 "--weight-cache-health-host", "127.0.0.1"]
        outlives = self._wc_has("engine_outlives_daemon")
        return Daemon(
            argv=argv, env=dict(engine.env), health=f"http://127.0.0.1:{hp}/health", socket_dir=socket_dir,
            local_ranks=self._local_ranks(hv, rank),
            drafter=(f"loads from disk with the engine (draft_load_config): vLLM {self.version} can keep EAGLE, "
                     "EAGLE-3 and MTP drafts in a draft group of the daemon, which specdeploy does not start, so a "
                     "new drafter restarts only the engine"),
            engine_outlives=outlives,
            without_daemon=(f"waits up to {WEIGHT_CACHE_STATE_TIMEOUT_S} s for the daemon's socket, then fails with "
                            "WeightCacheUnavailableError; it never loads from disk (fallback: false)"))

    def weight_cache_engine(self, hv, argv, socket_dir):
        out = list(argv)
        if "--load-format" in out:
            out[out.index("--load-format") + 1] = "ipc_cache"
        else:
            out += ["--load-format", "ipc_cache"]
        extra = {"socket_dir": socket_dir, "fallback": False, "state_timeout_s": WEIGHT_CACHE_STATE_TIMEOUT_S}
        out += ["--model-loader-extra-config", dumps_compact(extra)]
        return out, {}

    @staticmethod
    def _local_ranks(hv, rank) -> int:
        """The GPUs this host's daemon serves (one daemon process each): the host's share of its group."""
        return rank.gpus if rank is not None and rank.layout in ("tp", "dp_ep") else hv.tp

    def layout_args(self, hv, rank) -> tuple[list[str], dict[str, str]]:
        if rank is None or rank.layout == "single":
            return [], {}
        env = {"VLLM_HOST_IP": rank.address}
        if rank.layout == "tp":
            argv = ["--distributed-executor-backend", "mp", "--nnodes", str(rank.size),
                    "--node-rank", str(rank.index), "--master-addr", rank.leader_address,
                    "--master-port", str(rank.port)]
        else:  # dp_ep: every GPU of the group one data-parallel rank (or tp_per_dp GPUs each), experts sharded
            argv = ["--data-parallel-size", str(rank.dp_size), "--data-parallel-size-local", str(rank.dp_local),
                    "--data-parallel-address", rank.leader_address, "--data-parallel-rpc-port", str(rank.port),
                    "--enable-expert-parallel"]
            if not rank.leader:
                argv += ["--data-parallel-start-rank", str(rank.index * rank.dp_local)]
        if not rank.leader:
            argv.append("--headless")  # no API server: the leader's serves the whole group
        return argv, env

    def layout_problems(self, hv, host):
        if hv.specdeploy_topology == "pd":
            return [Finding("error", "specdeploy_topology", "pd on vLLM is not rendered: vLLM's KV transfer "
                            "(--kv-transfer-config, NixlConnector) needs a proxy that hands each prefill's "
                            "kv_transfer_params to its decode request, and sglang-router's PD mode pairs instances "
                            "through SGLang's bootstrap server instead", "serve pd with specdeploy_engine: sglang, "
                            "or use specdeploy_topology tp or dp_ep on vLLM", host)]
        return super().layout_problems(hv, host)

    def profile_defaults(self, profile) -> dict[str, object]:
        return self.pcie_defaults(profile, "TRITON_MLA")

    def patch_ids(self) -> tuple[str, ...]:
        return () if self.has("kimi_eagle3_upstream") else KIMI_EAGLE3_PATCHES

    @classmethod
    def patch_module(cls):
        from specdeploy.engines.patches import vllm as module
        return module

    def preflight(self, hv, target, drafter_fmt, rep, host) -> None:
        eagle3 = hv.specdeploy_spec_enabled and hv.specdeploy_spec_method == "eagle3"
        if not eagle3 or target is None:
            return
        ok, why = self.eagle3_target(target.architectures, target.text_model_type)
        if ok:
            return
        if target.is_kimi_or_deepseek and not self.has("kimi_eagle3_upstream"):
            self._kimi_preflight(hv, target, rep, host)  # the patch set makes these targets EAGLE-3 targets
        elif ok is None:
            rep.add("warning", "eagle3 target", f"{why}: whether it serves {target.architectures} as an EAGLE-3 "
                    "target is not known", "check the target on the engine itself", host)
        else:
            later = next((v for v in self.versions[self.versions.index(self.version) + 1:]
                          if VLLM(v).eagle3_target(target.architectures, target.text_model_type)[0]), None)
            rep.add("error", "eagle3 target", f"vLLM {self.version}: {why}", f"pin vLLM >= {later}" if later
                    else "serve this target with another engine, or without EAGLE-3", host)

    def _kimi_preflight(self, hv, target, rep, host) -> None:
        if hv.specdeploy_engine_patches != "none":
            rep.add("info", "patch set", f"the image applies {', '.join(self.patch_ids())}", host=host)
            return
        fix = f"set specdeploy_engine_patches: auto, or pin vLLM >= {CAPABILITIES['kimi_eagle3_upstream'].since}"
        if self.has("eagle3_target_whitelist"):
            # the engine's own check: a substring match on the text config's model_type, raised while the API
            # server builds the speculative config, before the engine core starts or any weight is read
            types = [t for t, span in self.eagle3_whitelist.items() if span.contains(self.version)]
            rep.add("error", "eagle3 target whitelist", f"vLLM {self.version} rejects model_type "
                    f"'{target.text_model_type}' as an EAGLE-3 target: its speculative config accepts only "
                    f"{types} (a ValueError at startup, seconds after launch, before any weight is loaded)", fix,
                    host)
        if "KimiK25ForConditionalGeneration" in target.architectures:
            rep.add("error", "image_token_index", f"vLLM {self.version}'s EAGLE proposer reads "
                    "config.image_token_index, which KimiK25Config lacks (AttributeError after the load)", fix, host)
        rep.add("error", "SupportsEagle3", f"vLLM {self.version}'s DeepseekV2/V3 (and KimiK25) models do not "
                "implement SupportsEagle3 ('Model does not support EAGLE3 interface' after the load)", fix, host)

    # VLLM_CPU_KVCACHE_SPACE: the CPU builds refuse to configure without it; a GPU build ignores it
    probe_env = {"VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": "1"}

    def probe_script(self) -> str:
        return (Path(__file__).with_name("vllm_probe.py")).read_text()

    def probe_case(self, argv):
        """``vllm serve TARGET ... --speculative-config JSON``: the target is the positional model, the drafter and
        method come from the speculative config, and the flags the engine's ModelConfig validates go along."""
        if "--speculative-config" not in argv or len(argv) < 3:
            return None
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        drafted = {m.engine_name for m in SPEC_METHODS.values() if m.draft == "drafter"}
        if not isinstance(spec, dict) or not spec.get("model") or spec.get("method") not in drafted:
            return None

        def value(flag):
            return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None
        case = {"target": argv[2], "drafter": spec["model"], "method": spec["method"],
                "num_speculative_tokens": int(spec.get("num_speculative_tokens") or 1),
                "trust_remote_code": "--trust-remote-code" in argv}
        if value("--max-model-len"):
            case["max_model_len"] = int(value("--max-model-len"))
        if value("--dtype"):
            case["dtype"] = value("--dtype")
        return case

    model_runners = ("v1", "v2")

    def model_runner(self, archs: list[str], moe: bool, quantized: bool, hybrid: bool,
                     runner: str | None = None) -> tuple[str | None, str]:
        """The model runner that serves EAGLE-3 for this target (``runner``: asked for, as
        VLLM_USE_V2_MODEL_RUNNER would), and why; None where the release was not read."""
        if runner in self.model_runners:
            return runner, "asked for"
        for span, rule, listed in DRAFTER["v2_default"]:
            if not span.contains(self.version):
                continue
            hit = any(a in listed for a in archs)
            if rule == "v1":
                v2 = False
            elif rule == "listed-dense":
                v2 = hit and not moe and not quantized
            elif rule == "listed":
                v2 = hit
            elif rule == "listed-or-dense":
                v2 = None if hybrid and not hit else hit or not moe
            else:
                v2 = True
            if v2 is None:
                return None, f"vLLM {self.version}'s default runner for a hybrid target was not read"
            how = {"v1": "V1 unless VLLM_USE_V2_MODEL_RUNNER=1", "v2": "V2 unless VLLM_USE_V2_MODEL_RUNNER=0 or "
                   "Triton is missing"}.get(rule, f"V2 for {', '.join(listed)}" + (
                       "" if rule == "listed" else " (not MoE" + (", not quantized)" if rule == "listed-dense"
                                                                    else "; any dense model)")))
            return ("v2" if v2 else "v1"), f"the default of vLLM {self.version} on a GPU: {how}"
        return None, f"vLLM {self.version}'s default model runner was not read"

    def drafter_taps_v2(self, top, nested_layer_ids, default):
        """V2's selection (eagle3_utils.get_eagle3_aux_layers_from_config)."""
        if top is not None:
            return list(top), "top-level key (V2)"
        if nested_layer_ids is not None and DRAFTER["v2_nested_layer_ids"].contains(self.version):
            return list(nested_layer_ids), "eagle_config.layer_ids (V2)"
        return default, "default (V2 does not read eagle_config.eagle_aux_hidden_state_layer_ids)"

    def drafter_taps(self, top, nested, default, deepseek_target):
        # vLLM reads the top-level key (its own numbering) first.
        if top is not None:
            return list(top), "top-level key"
        if nested is not None:
            if DRAFTER["aux_nested_read_as_is"].contains(self.version):
                return list(nested), "nested key read as vLLM numbers"
            if DRAFTER["aux_nested_ignored"].contains(self.version):
                return default, "default (the nested key is ignored)"
            return None, f"vLLM {self.version} either ignores the nested key or reads it without +1"
        return default, "default"

    @classmethod
    def facts_from_source(cls, root) -> dict:
        import ast

        from specdeploy.engines.sourcescan import class_fields, flag_literals, strings
        vl = Path(root) / cls.name
        flags: set[str] = set()
        for f in [vl / "engine" / "arg_utils.py"] + sorted((vl / "entrypoints").rglob("cli_args.py")):
            flags |= {"--" + n.replace("_", "-") for n in class_fields(f, lambda c: c.endswith("Args"))} \
                | flag_literals(f)
        spec = vl / "config" / "speculative.py"
        methods: set[str] = set()
        for node in ast.walk(ast.parse(spec.read_text())):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith(("ModelTypes", "Method"))
                                                    for t in node.targets):
                methods |= set(strings(node.value))
        # the weight-cache daemon's launcher flags (`vllm preload`, or the 0.30.0 module's own parser)
        daemon: set[str] = set()
        for f in (vl / "entrypoints" / "cli" / "preload.py", vl / "model_executor" / "model_loader" / "weight_cache"
                  / "daemon.py"):
            if f.exists():
                daemon |= {x for x in flag_literals(f) if x.startswith("--weight-cache-") or f.name == "preload.py"}
        return {"flags": sorted(flags), "spec_keys": sorted(class_fields(spec, lambda c: c == "SpeculativeConfig")),
                "spec_methods": sorted(methods), "daemon_flags": sorted(daemon)}

    @classmethod
    def eagle3_targets_from_source(cls, root) -> tuple[set[str], list[str] | None]:
        """(architectures whose registered class implements SupportsEagle3, the speculative config's EAGLE-3
        target model types or None when the release has no such list)."""
        from specdeploy.engines.sourcescan import implementers, model_classes, registry_archs
        vl = Path(root) / cls.name
        classes = model_classes(vl / "model_executor" / "models")
        reg = registry_archs(vl / "model_executor" / "models" / "registry.py")

        def has(name, entry):
            return name == "SupportsEagle3" or ("set_aux_hidden_state_layers" in entry[1]
                                                and "supports_eagle3" in entry[2])
        archs = {a for a, (m, c) in reg.items() if c != "SupportsEagle3" and implementers(classes, m, c, has)}
        return archs, cls.eagle3_whitelist_from_source(root)

    @classmethod
    def eagle3_whitelist_from_source(cls, root) -> list[str] | None:
        """The speculative config's EAGLE-3 target model types in the vLLM sources under ``root``, None when the
        release has no such list."""
        return e3.whitelist_from_source(Path(root) / cls.name / "config" / "speculative.py")

    @classmethod
    def simulation(cls) -> SimBehaviour:
        from specdeploy.engines.vllm_sim import VLLMSim
        return VLLMSim()


def k_schedule(bands) -> list[list[int]]:
    """specdeploy_spec_k_by_batch as vLLM's ``num_speculative_tokens_per_batch_size``: inclusive
    ``[start, end, k]`` ranges, the first from 1. Each band ends where the next starts; the last is written as
    its first batch size alone, since the engine carries the last range's k on up to max_num_seqs (and caps every
    k at num_speculative_tokens)."""
    out = []
    for i, b in enumerate(bands):
        end = bands[i + 1].from_batch - 1 if i + 1 < len(bands) else b.from_batch
        out.append([int(b.from_batch), int(end), int(b.k)])
    return out
