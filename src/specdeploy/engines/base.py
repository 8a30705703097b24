"""The engine adapter interface and the value types adapters share.

An adapter turns validated host variables into the engine's command line and environment, knows the
engine's image, health/readiness endpoints, metric names, drafter conventions, preflight checks, per-hardware
defaults and how the simulator plays it, and answers capability questions for a version from a table
(``Span`` per feature), never from scattered version comparisons. This module imports nothing of specdeploy
but ``errors``; adapters take host variables (``schema.HostVars``) as arguments without importing the schema.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from specdeploy.values.errors import Finding

HostVars = Any  # schema.HostVars; the schema imports the registry, so adapters do not import the schema


class UnsupportedVersion(ValueError):
    pass


def parse_version(v: str) -> tuple[int, ...]:
    """``0.5.1.post2`` -> (0, 5, 1, 2): sorts after 0.5.1 and before 0.5.2, as PEP 440 orders these releases."""
    out = []
    for part in v.split("."):
        num = part.split("post")[0]
        out.append(int(num) if num.isdigit() else 0)
        if "post" in part:
            out.append(int(part.split("post")[1] or 0))
    return tuple(out)


@dataclass(frozen=True)
class Span:
    """A half-open version interval [since, until); None means unbounded."""

    since: str | None = None
    until: str | None = None

    def contains(self, version: str) -> bool:
        v = parse_version(version)
        if self.since and v < parse_version(self.since):
            return False
        if self.until and v >= parse_version(self.until):
            return False
        return True


@dataclass(frozen=True)
class Health:
    liveness: str
    readiness: str
    meaning: str


@dataclass(frozen=True)
class Metrics:
    """Engine metric names the exporter and dashboards read."""

    spec_counters: dict[str, str] = field(default_factory=dict)  # our name -> engine metric
    spec_gauges: dict[str, str] = field(default_factory=dict)
    serving: dict[str, str] = field(default_factory=dict)
    spans: dict[str, Span] = field(default_factory=dict)  # engine metric -> releases that define it (default: all)

    def all_names(self) -> set[str]:
        return set(self.spec_counters.values()) | set(self.spec_gauges.values()) | set(self.serving.values())


@dataclass(frozen=True)
class Signature:
    """A known failure in the engine's own words: the pattern its root exception matches, how sure a match is
    (``high`` where the text names the cause, ``medium`` for a likely reading of a symptom) and the fix."""

    name: str
    confidence: str
    pattern: Any  # a compiled re.Pattern
    fix: str


@dataclass(frozen=True)
class LoadLog:
    """The engine's log lines that show a start's progress (compiled patterns; None where the engine prints
    none): weight shards (group 2/3: done/total), KV cache size (group 1: tokens), CUDA-graph capture (group 2/3),
    capture done, and ready."""

    shards: Any = None
    kv_tokens: Any = None
    graphs: Any = None
    graphs_done: Any = None
    ready: Any = None
    # for triage: lines that show a start or a load under way, and lines besides ``ready`` that show the engine
    # serves (pattern text, matched without regard to case)
    starting: str = ""
    serving: str = ""


@dataclass(frozen=True)
class Pin:
    """A release specdeploy deploys when the inventory pins none (``specdeploy_engine_version`` and
    ``specdeploy_engine_versions`` unset): for hosts whose GPUs' compute capability starts with
    ``compute_capability`` (None: any), with the reason the project pins it."""

    version: str
    reason: str
    compute_capability: str | None = None


@dataclass(frozen=True)
class SpecMethod:
    """A speculative method as one engine runs it: its name on the engine's command line, where its draft model
    comes from (``drafter``: a separate checkpoint specdeploy stages and converts; ``target``: layers the target
    checkpoint itself ships, read from its config key ``target_key``; ``none``: no model, e.g. n-gram lookup) and
    the releases that take it."""

    engine_name: str
    draft: str  # drafter | target | none
    span: Span = field(default_factory=Span)
    target_key: str | None = None


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str]
    secret_env: dict[str, str] = field(default_factory=dict)  # names only; values come from 0600 files
    credential: str | None = None  # a file systemd hands the engine with LoadCredential= (e.g. the API key)

    def to_dict(self) -> dict:
        return {"argv": self.argv, "env": self.env}


class EngineAdapter:
    """One engine. Class attributes hold the facts that do not depend on the release; an instance is bound to
    one pinned release (``version``) and answers per-version questions from the span tables."""

    name: str = ""  # the inventory's specdeploy_engine value; also the metric prefix (``<name>:``)
    label: str = ""  # how messages name the engine
    versions: tuple[str, ...] = ()
    # the release deployed when the inventory pins none, per hardware (first match wins; the last has no condition)
    pins: tuple[Pin, ...] = ()
    # specdeploy_spec_method -> how this engine runs it (``SpecMethod``)
    spec_methods: dict[str, SpecMethod] = {}
    capabilities: dict[str, Span] = {}
    flags: dict[str, Span] = {}  # every flag the adapter may emit or accept in extra args
    load_formats: dict[str, Span] = {}  # --load-format choices for safetensors checkpoints, per version
    # Serving layouts (values.topology.LAYOUTS) the adapter renders, per release; each rank's flags and
    # environment come from ``layout_args``, and ``layout_flags`` lists every flag it may write.
    layouts: dict[str, Span] = {"single": Span()}
    layout_flags: frozenset[str] = frozenset()
    health: Health
    metrics: Metrics
    default_port: int = 8000
    launch_hint = "--help"
    # --- logs (triage/, the front door's load progress) ------------------------------------
    triage_signatures: tuple[Signature, ...] = ()  # checked before the engine-independent ones
    load_log: LoadLog = LoadLog()
    # --- image ---------------------------------------------------------------------------
    upstream_image: str = ""  # official image repository; the tag is v<version>
    version_arg: str = ""  # the Dockerfile's build argument that pins the engine version
    standin_build_args: dict[str, str] = {}  # extra build args of the sandbox stand-in image
    standin_files: tuple[str, ...] | None = None  # package files the stand-in needs (None: the whole package)
    sandbox_version: str = ""  # the release `specdeploy sandbox up` deploys
    # CUDA of the official image per release, read from the release's Dockerfile (``ARG CUDA_VERSION=``)
    image_cuda: dict[str, str] = {}
    # --- upstream sources ----------------------------------------------------------------
    source_release: str = "wheel"  # "sdist" or "wheel": the package index artifact the contract tests read
    # --- drafter conventions (see drafter/) --------------------------------------------
    DRAFTER: dict = {}
    drafter_fallback: str = ""  # the engine fixes suggest for drafters this engine cannot serve
    # EAGLE-3 targets (engines/eagle3_targets.py): architecture -> releases whose class implements the interface,
    # the releases read, and a model-type whitelist with the releases that have one
    eagle3_targets: dict[str, Span] = {}
    eagle3_targets_read: tuple[str, ...] = ()
    eagle3_whitelist: dict[str, Span] = {}
    eagle3_whitelist_span: Span | None = None
    eagle3_interface: str = "the EAGLE-3 target interface"

    def __init__(self, version: str):
        if version not in self.versions:
            raise UnsupportedVersion(
                f"{self.name} {version} is not supported; supported: {', '.join(self.versions)}")
        self.version = version

    def eagle3_target(self, architectures: list[str], model_type: str) -> tuple[bool | None, str]:
        """Whether this release serves a target with these architectures as an EAGLE-3 target: True / False, or
        None where the release was not read; and why."""
        if not self.eagle3_targets_read:
            return None, f"specdeploy records no EAGLE-3 target table for {self.name}"
        read = sorted(self.eagle3_targets_read, key=parse_version)
        v = parse_version(self.version)

        def at(version: str) -> tuple[bool, str]:
            # in the engine's order: the whitelist is checked at startup, the interface at the load
            wl = self.eagle3_whitelist_span
            if wl is not None and wl.contains(version):
                types = [t for t, sp in self.eagle3_whitelist.items() if sp.contains(version)]
                if not any(t in model_type for t in types):
                    return False, f"model_type '{model_type}' is not in the speculative config's EAGLE-3 target " \
                        f"list ({', '.join(types)}): refused at startup, before the load"
            ok = [x for x in architectures if x in self.eagle3_targets and self.eagle3_targets[x].contains(version)]
            if not ok:
                return False, f"{' / '.join(architectures) or 'no architecture'} does not implement " \
                    f"{self.eagle3_interface}: the load fails once the target asks for aux hidden states"
            return True, f"{ok[0]} implements {self.eagle3_interface}"
        if self.version in read:
            return at(self.version)
        lo = [r for r in read if parse_version(r) < v]
        hi = [r for r in read if parse_version(r) > v]
        if lo and hi:
            a, b = at(lo[-1]), at(hi[0])
            if a[0] == b[0]:
                return a[0], a[1] + f" (in {lo[-1]} and {hi[0]}, the read releases around {self.version})"
        return None, f"{self.label} {self.version} was not read for EAGLE-3 target support"

    @classmethod
    def pinned(cls, profile) -> Pin:
        """The release specdeploy deploys on hosts of ``profile`` when the inventory pins none."""
        for pin in cls.pins:
            if pin.compute_capability is None or profile.compute_capability.startswith(pin.compute_capability):
                return pin
        raise UnsupportedVersion(f"specdeploy pins no {cls.label or cls.name} release for {profile.name}")

    @classmethod
    def draft_source(cls, method: str) -> str:
        """Where ``method``'s draft model comes from: ``drafter`` (a separate checkpoint specdeploy stages and
        converts), ``target`` (the target's own layers) or ``none``; ``none`` for a method the engine lacks."""
        m = cls.spec_methods.get(method)
        return m.draft if m is not None else "none"

    def uses_drafter(self, hv: HostVars) -> bool:
        """Whether ``hv`` serves a separate drafter checkpoint (staged, converted, passed to the engine)."""
        return bool(hv.specdeploy_spec_enabled and hv.specdeploy_drafter_path
                    and self.draft_source(hv.specdeploy_spec_method) == "drafter")

    def spec_method_problems(self, hv: HostVars, host: str | None) -> list[Finding]:
        """The method is one this release runs."""
        method = hv.specdeploy_spec_method
        m = self.spec_methods.get(method)
        if not hv.specdeploy_spec_enabled or (m is not None and m.span.contains(self.version)):
            return []
        valid = [k for k, x in self.spec_methods.items() if x.span.contains(self.version)]
        why = (f"needs {self.label} {m.span.since} or later" if m is not None and m.span.since else
               f"is not a speculative method {self.label} {self.version} runs")
        return [Finding("error", "specdeploy_spec_method", f"'{method}' {why}",
                        f"use one of: {', '.join(valid)}", host)]

    def target_method_problems(self, hv: HostVars, target, host: str | None) -> list[Finding]:
        """A method whose draft layers ship in the target (MTP): the target's config must declare them, under the
        key the engine reads; the engine must also know the target's architecture (``target_method_archs``)."""
        m = self.spec_methods.get(hv.specdeploy_spec_method)
        if not hv.specdeploy_spec_enabled or m is None or m.draft != "target" or target is None:
            return []
        n = target.text.get(m.target_key) if m.target_key else None
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            have = "is 0" if n == 0 else "is missing" if n is None else f"is {n!r}"
            return [Finding("error", "specdeploy_spec_method",
                            f"'{hv.specdeploy_spec_method}' drafts with the target's own MTP layers, but the target "
                            f"ships none: {m.target_key} in its config.json {have} ({', '.join(target.architectures)})",
                            "serve this target with a separate drafter (specdeploy_spec_method: eagle3 and "
                            "specdeploy_drafter_path), or without speculation", host)]
        return self.target_method_arch_problems(hv, target, host)

    def target_method_arch_problems(self, hv: HostVars, target, host: str | None) -> list[Finding]:
        return []

    def has(self, capability: str) -> bool:
        return self.capabilities[capability].contains(self.version)

    def metric_names(self) -> set[str]:
        """The engine metrics this release defines (a missing one reads as "no figure" in the exporter)."""
        return {n for n in self.metrics.all_names() if n not in self.metrics.spans
                or self.metrics.spans[n].contains(self.version)}

    def flag_exists(self, flag: str) -> bool:
        span = self.flags.get(flag)
        return span is not None and span.contains(self.version)

    # --- to implement -------------------------------------------------------------------
    def command(self, hv: HostVars, drafter_path: str | None = None, rank=None) -> Command:
        """The engine's command line for ``hv``; ``rank`` (values.topology.Rank, None: a host of its own) is the
        host's place in a serving group."""
        raise NotImplementedError

    def layout_args(self, hv: HostVars, rank) -> tuple[list[str], dict[str, str]]:
        """The flags and environment that put one rank in its serving group (nothing for ``single``)."""
        return [], {}

    # --- serving layouts -----------------------------------------------------------------
    def layout_problems(self, hv: HostVars, host: str | None) -> list[Finding]:
        """The layout is one this release renders (the group-level checks are in topology/)."""
        layout = hv.specdeploy_topology
        span = self.layouts.get(layout)
        if span is not None and span.contains(self.version):
            return []
        valid = [k for k, s in self.layouts.items() if s.contains(self.version)]
        why = (f"needs {self.label} {span.since} or later" if span is not None and span.since else
               f"is not a layout specdeploy renders for {self.label}")
        return [Finding("error", "specdeploy_topology", f"'{layout}' {why} (pinned: {self.version})",
                        f"use one of: {', '.join(valid)}", host)]

    @staticmethod
    def tp_of(hv: HostVars, rank) -> int:
        """Tensor-parallel size of the engine's command line: the host's, the whole group's (tp), or one
        data-parallel rank's (dp_ep)."""
        if rank is None or rank.layout in ("single", "pd"):
            return hv.tp
        return rank.world if rank.layout == "tp" else rank.tp_per_dp

    def credential_content(self, name: str, key: str) -> str:
        """The content of the credential file ``name`` (Command.credential) that carries the API key ``key``:
        the key alone unless the engine reads another form."""
        return key + "\n"

    def spec_config_problems(self, hv: HostVars, host: str | None) -> list[Finding]:
        return []

    def takes_k_by_batch(self) -> bool:
        """Whether this release takes a speculation length per batch size (``spec_tokens_per_batch_size``)."""
        return "spec_tokens_per_batch_size" in self.capabilities and self.has("spec_tokens_per_batch_size")

    def k_by_batch_problems(self, hv: HostVars, host: str | None) -> list[Finding]:
        if not (hv.specdeploy_spec_enabled and hv.specdeploy_spec_k_by_batch) or self.takes_k_by_batch():
            return []
        span = self.capabilities.get("spec_tokens_per_batch_size")
        pin = f"pin {self.label} >= {span.since}, or " if span is not None and span.since else ""
        return [Finding("error", "specdeploy_spec_k_by_batch",
                        f"{self.label} {self.version} takes one speculation length for every load",
                        f"{pin}remove it and set specdeploy_spec_num_tokens to the single k `specdeploy gate` "
                        "reports for the traffic (single_k in its report)", host)]

    def allreduce_paths(self, ctx: CommContext) -> list[AllReducePath]:
        """The engine's all-reduce paths that are active in ``ctx`` and come before NCCL."""
        raise NotImplementedError

    def profile_defaults(self, profile) -> dict[str, object]:
        """Settings a hardware profile implies for this engine (``attention_backend``,
        ``disable_custom_all_reduce``) unless the inventory sets them."""
        return {}

    @staticmethod
    def pcie_defaults(profile, sm120_attention_backend: str) -> dict[str, object]:
        """What both pinned engines need on PCIe hosts: no custom all-reduce (it needs P2P that PCIe hosts often
        lack or slow down), and on SM120 an explicit attention backend (the default MLA kernels are SM90/SM100
        only)."""
        if profile.interconnect != "pcie":
            return {}
        if profile.compute_capability.startswith("12."):
            return {"attention_backend": sm120_attention_backend, "disable_custom_all_reduce": True}
        return {"disable_custom_all_reduce": True}

    def patch_ids(self) -> tuple[str, ...]:
        """The patches this release needs (applied in the image build; see specdeploy.engines.patches)."""
        return ()

    @classmethod
    def patch_module(cls):
        """The module with ``status(root)``, ``apply(root)`` and ``PatchError`` for this engine, or None."""
        return None

    def preflight(self, hv: HostVars, target, drafter_fmt: str | None, rep, host: str) -> None:
        """Engine-specific preflight findings for a host (``target``: the TargetModel or None)."""

    # --- the engine probe (checks/probe.py) -------------------------------------------------
    # CPU builds on the package index that run without a GPU (version -> recipe; testing/realengine.py)
    cpu_builds: dict[str, dict] = {}
    # per CPU-build release: the environment an MLA target with a drafter needs on an x86 CPU without AMX
    cpu_mla_drafter_env: dict[str, dict[str, str]] = {}
    probe_env: dict[str, str] = {}  # environment the probe script needs in the engine's Python

    def probe_script(self) -> str | None:
        """The source of the script that runs this release's own config validation and drafter loading inside
        the engine's Python (stdlib, torch and the engine only); None where the engine cannot run it here."""
        return None

    def probe_unavailable(self) -> str:
        """Why there is no probe for this engine (shown when ``probe_script`` is None)."""
        return f"specdeploy has no probe for {self.label or self.name}"

    def probe_case(self, argv: list[str]) -> dict | None:
        """The probe case for the engine command line a release runs (``Command.argv``): the target, the drafter
        and the options the engine validates them with, read from the flags as the engine reads them; None when
        the command runs no drafter the probe can check."""
        return None

    def drafter_taps(self, top, nested, default: list[int], deepseek_target: bool) -> tuple[list[int] | None, str]:
        """The aux taps (vLLM numbering: input of layer L) this release captures for a drafter config with
        ``top`` (top-level ``eagle_aux_hidden_state_layer_ids``) and ``nested`` (``eagle_config.``) ids, each a
        valid three-id list or None; None when not pinned down."""
        return default, "default"

    def drafter_nested_ids(self, taps: list[int], deepseek_target: bool) -> list[int]:
        """``eagle_config.eagle_aux_hidden_state_layer_ids`` that make this release capture ``taps``."""
        return [x - 1 for x in taps]

    @classmethod
    def facts_from_source(cls, root) -> dict:
        """Flags, speculative-config keys and methods read from an unpacked release (see engine_facts)."""
        raise NotImplementedError

    @classmethod
    def simulation(cls) -> SimBehaviour:
        """How ``specdeploy simulate`` plays this engine."""
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------
    def load_format_ok(self, fmt: str) -> bool:
        span = self.load_formats.get(fmt)
        return span is not None and span.contains(self.version)

    def validate_extras(self, hv: HostVars, host: str | None) -> list[Finding]:
        out = self.spec_method_problems(hv, host) + self.spec_config_problems(hv, host)
        out += self.k_by_batch_problems(hv, host) + self.layout_problems(hv, host)
        fmt = hv.specdeploy_load_format
        if fmt and not self.load_format_ok(fmt):
            valid = sorted(f for f in self.load_formats if self.load_format_ok(f))
            span = self.load_formats.get(fmt)
            why = f"exists only from {self.name} {span.since}" if span and span.since else \
                f"is not a {self.name} {self.version} load format specdeploy knows"
            out.append(Finding("error", "specdeploy_load_format", f"'{fmt}' {why}",
                               f"use one of: {', '.join(valid)}", host))
        own = self._own_flags(hv) if hv.specdeploy_engine_extra_args else set()
        for arg in hv.specdeploy_engine_extra_args:
            if not arg.startswith("--"):
                continue
            flag = arg.split("=", 1)[0]
            if flag == "--":
                out.append(Finding("error", "specdeploy_engine_extra_args", "a bare -- ends the engine's options: "
                                   "every argument after it would be read as a positional one",
                                   "remove it; give a value that starts with -- as --flag=VALUE", host))
            elif flag in self.layout_flags:
                out.append(Finding(
                    "error", "specdeploy_engine_extra_args", f"{flag} places the engine in a serving group, which "
                    "specdeploy writes per rank from the inventory", "remove it and set specdeploy_topology and "
                    "specdeploy_group (docs/topology.md)", host))
            elif flag in own:  # the engine's parser keeps the last one: a second --port silently wins
                out.append(Finding(
                    "error", "specdeploy_engine_extra_args", f"{flag} is set by specdeploy already (from the "
                    "inventory variables); given twice, the engine would take the later one",
                    "remove it from specdeploy_engine_extra_args and set the specdeploy_* variable for it", host))
            elif not self.flag_exists(flag):
                out.append(Finding(
                    "error", "specdeploy_engine_extra_args",
                    f"{flag} is not a flag specdeploy knows for {self.name} {self.version}",
                    f"remove it, or check `{self.launch_hint}` on the pinned image", host))
        return out

    def _own_flags(self, hv: HostVars) -> set[str]:
        """The flags of the command specdeploy writes for ``hv`` without its extra args."""
        bare = hv.model_copy(update={"specdeploy_engine_extra_args": []})
        argv = self.command(bare, "/drafter" if hv.specdeploy_drafter_path else None).argv
        return {a.split("=", 1)[0] for a in argv if a.startswith("--")}

    def resolved(self, hv: HostVars, key: str):
        """A profile-driven setting unless the inventory sets it explicitly."""
        explicit = {"attention_backend": hv.specdeploy_attention_backend,
                    "disable_custom_all_reduce": (None if hv.specdeploy_custom_all_reduce is None
                                                  else not hv.specdeploy_custom_all_reduce)}[key]
        if explicit is not None:
            return explicit
        return self.profile_defaults(hv.profile()).get(key)


def dumps_compact(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


MiB = 1024 * 1024


@dataclass(frozen=True)
class AllReducePath:
    """An engine all-reduce path in front of NCCL: messages it takes never reach NCCL.

    ``max_bytes`` is the bound the engine checks (``None``: the bound is not known here); ``inclusive`` says
    whether a message of exactly ``max_bytes`` still takes this path."""

    name: str
    max_bytes: int | None
    inclusive: bool
    source: str

    def takes(self, nbytes: int) -> bool | None:
        if self.max_bytes is None:
            return None
        return nbytes <= self.max_bytes if self.inclusive else nbytes < self.max_bytes


@dataclass(frozen=True)
class CommContext:
    """What decides an engine's all-reduce path: hardware, tensor-parallel size, custom all-reduce switch."""

    compute_capability: str
    world_size: int
    nvlink: bool  # every GPU pair on NVLink (NVLink profiles are NVSwitch-connected)
    multicast: bool  # NVSwitch multicast (fabric manager), needed by torch symmetric-memory all-reduce
    custom_all_reduce: bool


class SimReject(SystemExit):
    """The simulated engine refuses its command line (the message is what the real engine prints, the exit code
    what it exits with: 2 for argparse's errors, 1 for an exception raised while the config is built)."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class SimRank:
    """One rank of a serving group as the simulator reads it off the engine's command line."""
    index: int      # 0 is the leader
    size: int       # the group's hosts
    address: str    # the leader's rendezvous address
    port: int       # and port
    serves: bool    # this rank runs the API server


class SimBehaviour:
    """How the engine simulator (``specdeploy simulate``) plays one engine: its command line, the endpoints'
    engine-specific behaviour, its metrics and what it prints while loading or crashing. The simulator
    (testing/simulator.py) owns the HTTP server and the token generation; it asks this object for the rest."""

    argv_head: tuple[str, ...] = ()  # the program, e.g. ("vllm", "serve")
    positional_model: bool = False  # the model path follows the head as a positional argument
    usage: str = ""
    prog: str = ""  # prefix of argparse-style errors
    unknown_prog: str | None = None  # prefix of the unrecognized-arguments error, when another parser reports it
    usage_on_error: bool = False  # argparse's usage line precedes a per-argument error
    int_type_names: dict[str, str] = {}  # flag -> the type name argparse reports for a bad value (else "int")
    booleans: frozenset[str] = frozenset()  # flags without a value
    int_flags: frozenset[str] = frozenset()
    tp_option: str = ""  # the option (parsed key) that holds the tensor-parallel size
    served_option: str = "served_model_name"  # the option that names the served model (else the model path)
    health_generates: bool = False  # health endpoints answer 503 until loaded, then run a one-token generation
    metrics_option: str | None = None  # /metrics is served only when this option is set

    def rank(self, opts: dict) -> SimRank | None:
        """The serving-group rank the parsed options describe, or None for a host that serves alone."""
        return None

    def pd_role(self, opts: dict) -> tuple[str, int] | None:
        """(role, bootstrap port) of a prefill or decode instance, or None when the instance does both."""
        return None

    def info(self, path: str, sim) -> dict | None:
        """The body of an engine-specific GET endpoint (server and model info), or None when it has none."""
        return None

    # When a rank goes away while the group serves: "now" (the leader exits at once, non-zero) or "next-step" (the
    # leader goes on answering its health check; its next generation fails with 500, then it exits with
    # ``lost_exit_code``). Before the group serves, a lost rank ends the leader at once either way.
    lost_rank_noticed = "now"
    lost_exit_code = 1

    def engine_dead_lines(self) -> list[str]:
        """What the API server prints as it shuts down after its engine died (no signal asked it to)."""
        return ["INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
                "INFO:     Application shutdown complete."]

    def group_lost_lines(self, rank: SimRank, peer: str) -> list[str]:
        """What the leader prints when a rank of its group goes away (then it exits)."""
        return [f"ERROR rank of the serving group at {peer} closed its connection; the group cannot run without it"]

    def spec(self, version: str, opts: dict, facts: dict | None) -> dict | None:
        """The speculative setup from the parsed options: {"k", "method", "model"}, or None. Raises ArgError-
        style errors (``SimReject``) for what the real engine rejects."""
        return None

    def api_key(self, opts: dict, env) -> str | None:
        return opts.get("api_key")

    def metrics(self, registry, served: str, k: int):
        """An object with ``prompt(n)``, ``generated(n)``, ``ttft(s)``, ``itl(s)``, ``spec_step(accepted, k)`` and
        ``running(n)``, publishing the engine's own metric names in ``registry``."""
        raise NotImplementedError

    kv_lines: tuple[str, ...] = ()  # printed between the weight shards and the graph capture

    def ready_lines(self, host: str, port: int, pid: int) -> list[str]:
        """What the engine prints once it serves."""
        return [f"INFO:     Application startup complete. Uvicorn running on http://{host}:{port}"]

    def shutdown_lines(self, pid: int) -> list[str]:
        """What the engine prints when SIGTERM stops it."""
        return []

    def id_prefix(self, path: str) -> str:
        """The prefix of a completion's id on ``path``."""
        return "cmpl-"

    def model_card(self, served: str, opts: dict, engine: str) -> dict:
        """One entry of /v1/models."""
        return {"id": served, "object": "model", "owned_by": engine, "root": served}

    def graph_line(self, i: int, graphs: int, t_graph: float) -> str:
        return f"Capturing CUDA graphs: {100 * i // graphs:3d}%| | {i}/{graphs}"

    def graphs_done(self, load_s: float) -> str:
        return f"Graph capturing finished in {int(0.3 * load_s)} secs"

    def crash_log(self, version: str, model: str, k: int, tp: int) -> str:
        return f"{self.prog}: simulated crash during the load\n"
