"""Engine adapters: one module per engine behind one small interface.

An adapter turns validated host variables into the engine's command line and environment, knows the
engine's health/readiness endpoints and metric names, and answers capability questions for a version from a
table (``Span`` per feature), never from scattered version comparisons.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import Finding

if TYPE_CHECKING:
    from ..schema import HostVars


class UnsupportedVersion(ValueError):
    pass


def parse_version(v: str) -> tuple[int, ...]:
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

    def all_names(self) -> set[str]:
        return set(self.spec_counters.values()) | set(self.spec_gauges.values()) | set(self.serving.values())


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str]
    secret_env: dict[str, str] = field(default_factory=dict)  # names only; values come from 0600 files

    def to_dict(self) -> dict:
        return {"argv": self.argv, "env": self.env}


class EngineAdapter:
    name: str = ""
    versions: tuple[str, ...] = ()
    capabilities: dict[str, Span] = {}
    flags: dict[str, Span] = {}  # every flag the adapter may emit or accept in extra args
    load_formats: dict[str, Span] = {}  # --load-format choices for safetensors checkpoints, per version
    health: Health
    metrics: Metrics
    default_port: int = 8000

    def __init__(self, version: str):
        if version not in self.versions:
            raise UnsupportedVersion(
                f"{self.name} {version} is not supported; supported: {', '.join(self.versions)}")
        self.version = version

    def has(self, capability: str) -> bool:
        return self.capabilities[capability].contains(self.version)

    def flag_exists(self, flag: str) -> bool:
        span = self.flags.get(flag)
        return span is not None and span.contains(self.version)

    # --- to implement -------------------------------------------------------------------
    def command(self, hv: "HostVars", drafter_path: str | None = None) -> Command:
        raise NotImplementedError

    def spec_config_problems(self, hv: "HostVars", host: str | None) -> list[Finding]:
        return []

    def allreduce_paths(self, ctx: "CommContext") -> list["AllReducePath"]:
        """The engine's all-reduce paths that are active in ``ctx`` and come before NCCL."""
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------
    def load_format_ok(self, fmt: str) -> bool:
        span = self.load_formats.get(fmt)
        return span is not None and span.contains(self.version)

    def validate_extras(self, hv: "HostVars", host: str | None) -> list[Finding]:
        out = self.spec_config_problems(hv, host)
        fmt = hv.specdeploy_load_format
        if fmt and not self.load_format_ok(fmt):
            valid = sorted(f for f in self.load_formats if self.load_format_ok(f))
            span = self.load_formats.get(fmt)
            why = f"exists only from {self.name} {span.since}" if span and span.since else \
                f"is not a {self.name} {self.version} load format specdeploy knows"
            out.append(Finding("error", "specdeploy_load_format", f"'{fmt}' {why}",
                               f"use one of: {', '.join(valid)}", host))
        for arg in hv.specdeploy_engine_extra_args:
            if not arg.startswith("--"):
                continue
            flag = arg.split("=", 1)[0]
            if not self.flag_exists(flag):
                out.append(Finding(
                    "error", "specdeploy_engine_extra_args",
                    f"{flag} is not a flag specdeploy knows for {self.name} {self.version}",
                    f"remove it, or check `{self.launch_hint}` on the pinned image", host))
        return out

    launch_hint = "--help"

    def resolved(self, hv: "HostVars", key: str):
        """A profile-driven setting unless the inventory sets it explicitly."""
        explicit = {"attention_backend": hv.specdeploy_attention_backend,
                    "disable_custom_all_reduce": (None if hv.specdeploy_custom_all_reduce is None
                                                  else not hv.specdeploy_custom_all_reduce)}[key]
        if explicit is not None:
            return explicit
        return hv.profile().engine_defaults.get(self.name, {}).get(key)


def get_adapter(engine: str, version: str) -> EngineAdapter:
    from .sglang import SGLang
    from .vllm import VLLM
    cls = {"vllm": VLLM, "sglang": SGLang}.get(engine)
    if cls is None:
        raise UnsupportedVersion(f"unknown engine '{engine}'; supported: vllm, sglang")
    return cls(version)


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
