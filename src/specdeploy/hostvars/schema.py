"""The inventory variables: one pydantic model, the single documented public interface.

Every ``specdeploy_*`` variable a host may carry is a field here. ``docs/variables.md`` and each role's
``meta/argument_specs.yml`` are generated from this model (``specdeploy schema docs|argspec``); a test fails
when they drift.
"""
from __future__ import annotations

import difflib
import json
import re
import unicodedata
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.values.hardware import PROFILE_NAMES
from specdeploy.values.hostpaths import HOST_PATHS
from specdeploy.values.topology import LAYOUT_TEXT, LAYOUTS, PD_ROLES

PREFIX = "specdeploy_"



def _wants_number(annotation: Any) -> bool:
    """The annotation takes an int or a float and no bool (Optional and unions looked through)."""
    import typing
    todo, kinds = [annotation], set()
    while todo:
        a = todo.pop()
        args = typing.get_args(a)
        if typing.get_origin(a) in (typing.Union, getattr(__import__("types"), "UnionType", None)) or \
                typing.get_origin(a) is Annotated:
            todo.extend(args)
        else:
            kinds.add(a)
    return bool(kinds & {int, float}) and bool not in kinds


def control_characters(value: Any, where: str = "") -> list[tuple[str, str]]:
    """(where, character) for every control character in a string of ``value``, dict keys and list items
    included: C0 and C1 controls, DEL, and the Unicode line and paragraph separators. None of them has a meaning
    in a variable, and each can end a unit line, an env-file line or a YAML scalar early."""
    out: list[tuple[str, str]] = []
    if isinstance(value, str):
        for ch in value:
            if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
                out.append((where, ch))
                break
    elif isinstance(value, dict):
        for k, v in value.items():
            key = str(k)
            out += control_characters(k, f"{where} key {key!r}".strip())
            out += control_characters(v, f"{where}[{key!r}]" if where else f"[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out += control_characters(v, f"{where}[{i}]")
    return out


def _char_name(ch: str) -> str:
    names = {"\n": "newline", "\r": "carriage return", "\t": "tab", "\x00": "NUL"}
    return f"U+{ord(ch):04X}" + (f" ({names[ch]})" if ch in names else "")


def refuse_control_characters(v: Any) -> Any:
    """The one check every variable goes through (strings, and the strings inside dicts and lists)."""
    found = control_characters(v)
    if found:
        where, ch = found[0]
        raise PydanticCustomError("control_character", "{where}holds the control character {char}",
                                  {"where": f"{where} " if where else "", "char": _char_name(ch)})
    return v


# systemd.time(7): "infinity", or numbers with units, e.g. "90min", "2h 30min", "600".
_SPAN_UNITS = "usec|us|msec|ms|seconds?|sec|s|minutes?|min|m|hours?|hr|h|days?|d|weeks?|w|months?|M|years?|y"
_SPAN_PART = rf"\d+(\.\d+)? ?({_SPAN_UNITS})?"
_TIME_SPAN = re.compile(rf"infinity|{_SPAN_PART}( {_SPAN_PART})*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_names(v: dict[str, str] | None) -> dict[str, str] | None:
    """Environment variable names an env file and ``docker --env-file`` both read back as written."""
    for k in v or {}:
        if not _ENV_NAME.fullmatch(k):
            raise PydanticCustomError("env_name", "{key} is not an environment variable name", {"key": repr(k)})
    return v


class CustomHardware(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = "custom hardware"
    gpu_count: int = Field(ge=1, le=64)
    gpu_memory_gib: float = Field(gt=0)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    interconnect: Literal["pcie", "nvlink"]
    nvswitch: bool = False
    rdma: bool = False
    nccl_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("nccl_env")
    @classmethod
    def _env_names(cls, v):
        return env_names(v)


class KBand(BaseModel):
    """One band of a per-load speculation length: from this many running requests on (until the next band's
    ``from_batch``), draft ``k`` tokens per step (0: no speculation at that load)."""
    model_config = ConfigDict(extra="forbid")
    from_batch: int = Field(ge=1, le=1_000_000)
    k: int = Field(ge=0, le=16)


SerialCount = Annotated[int, Field(ge=1, le=100000)]  # hosts per batch
SerialPercent = Annotated[str, Field(pattern=r"^[1-9][0-9]{0,5}%?$")]  # "30%" (or a count written as a string)


def _since_text(load_format: str) -> str:
    """'vLLM >= 0.18.0, SGLang >= 0.5.22': the first release of each engine with that load format."""
    from specdeploy.engines import adapters
    return ", ".join(f"{a.label} >= {a.load_formats[load_format].since}" for a in adapters()
                     if load_format in a.load_formats and a.load_formats[load_format].since)


def _k_by_batch_text() -> str:
    """'vLLM >= 0.24.0': the first release of each engine that takes a speculation length per batch size."""
    from specdeploy.engines import adapters
    return ", ".join(f"{a.label} >= {a.capabilities['spec_tokens_per_batch_size'].since}" for a in adapters()
                     if "spec_tokens_per_batch_size" in a.capabilities) or "none yet"


class HostVars(BaseModel):
    """Variables of one engine host. Field descriptions are the documentation."""

    model_config = ConfigDict(extra="forbid")

    specdeploy_engine: str = Field(description="Serving engine: `vllm` or `sglang`.")
    specdeploy_engine_versions: dict[str, str] = Field(
        default_factory=dict, description="Each engine's pinned release, by engine name, e.g. `{vllm: '0.32.0', "
        "sglang: '0.5.23'}`: changing `specdeploy_engine` alone switches to the other engine's release. An engine "
        "not listed gets the release specdeploy pins for it on the host's hardware (docs/variables.md, "
        "\"Engine releases\"); `specdeploy preflight` says which release it chose and why.")
    specdeploy_engine_version: str | None = Field(
        None, description="Override: the release of whichever engine `specdeploy_engine` names, e.g. `0.16.0` "
        "(vLLM) or `0.5.23` (SGLang). It beats `specdeploy_engine_versions` and must be changed with the engine; "
        "prefer `specdeploy_engine_versions`.")
    specdeploy_engine_patches: Literal["auto", "none"] = Field(
        "auto", description="`auto` applies the patch set the engine version needs; `none` applies nothing.")
    specdeploy_runtime: Literal["docker", "venv"] = Field(
        "docker", description="`docker`: the official engine image, patched where needed. `venv`: a Python "
        "environment on the host.")
    specdeploy_venv_path: str = Field(
        HOST_PATHS["venv"], description="The Python environment used by the `venv` runtime.")
    specdeploy_engine_venv_path: str | None = Field(
        None, description="The engine's own Python environment for the `venv` runtime, where it is not "
        "specdeploy's (`specdeploy_venv_path`, which keeps the exporter and the tools): e.g. an engine build "
        "installed apart. Default: `specdeploy_venv_path`.")
    specdeploy_sandbox_engine: Literal["simulator", "real"] = Field(
        "simulator", description="On a sandbox host (`specdeploy_sandbox`): the engine simulator, or `real`, the "
        "engine itself from `specdeploy_engine_venv_path` (the vLLM CPU build; the `venv` runtime).")
    specdeploy_image: str | None = Field(
        None, description="Engine image to run with the `docker` runtime; default: the image `build.yml` tags.")
    specdeploy_hardware: Literal[PROFILE_NAMES] = Field(  # type: ignore[valid-type]
        description="Hardware profile: " + ", ".join(f"`{n}`" for n in PROFILE_NAMES[:-1])
        + f" or `{PROFILE_NAMES[-1]}`.")
    specdeploy_hardware_custom: CustomHardware | None = Field(
        None, description="For `specdeploy_hardware: custom`: gpu_count, gpu_memory_gib, compute_capability, "
        "interconnect (`pcie`/`nvlink`), nvswitch, nccl_env.")
    specdeploy_sandbox: bool = Field(
        False, description="The host is a sandbox host without GPUs: GPU steps are skipped and the engine "
        "simulator serves.")
    specdeploy_model_path: str = Field(description="Target model directory on the host; its `config.json` is read.")
    specdeploy_model_source: Literal["host", "controller", "shared"] = Field(
        "host", description="Where the weights come from. `host`: already at specdeploy_model_path on the host; "
        "specdeploy only verifies them (config, every shard the index names, sizes from the safetensors headers, "
        "sha256 with a manifest) and writes nothing there. `controller`: pushed from "
        "specdeploy_model_controller_path into a new directory beside the target, then specdeploy_model_path is a "
        "symlink flipped atomically. `shared`: copied on the host from specdeploy_model_shared_path (NFS, Lustre) "
        "to local disk: parallel, resumable, verified, with the same atomic switch.")
    specdeploy_model_controller_path: str | None = Field(
        None, description="`controller` source: the full checkpoint (config, index, every shard) on the controller.")
    specdeploy_model_shared_path: str | None = Field(
        None, description="`shared` source: the full checkpoint on shared storage already mounted on the host.")
    specdeploy_model_sha256_manifest: str | None = Field(
        None, description="Optional `sha256sum` manifest of the checkpoint, a path on the host (relative: inside "
        "the checkpoint directory). Each file is hashed once; unchanged files (size, mtime, inode) are not read "
        "again.")
    specdeploy_model_config_copy: str | None = Field(
        None, description="Controller-side copy of the model's config files (config.json, safetensors index) read "
        "by preflight; never copied to hosts. Default: specdeploy_model_controller_path, else "
        "specdeploy_model_path when it exists on the controller.")
    specdeploy_drafter_source: Literal["host", "controller", "shared"] | None = Field(
        None, description="Where the drafter comes from, as specdeploy_model_source (default: the same).")
    specdeploy_drafter_controller_path: str | None = Field(
        None, description="`controller` source: the drafter checkpoint on the controller.")
    specdeploy_drafter_shared_path: str | None = Field(
        None, description="`shared` source: the drafter checkpoint on shared storage mounted on the host.")
    specdeploy_drafter_sha256_manifest: str | None = Field(
        None, description="Optional `sha256sum` manifest of the drafter, as specdeploy_model_sha256_manifest.")
    specdeploy_drafter_config_copy: str | None = Field(
        None, description="Controller-side copy of the drafter (config.json and safetensors headers) read by "
        "preflight's drafter check; never copied to hosts. Default: specdeploy_drafter_controller_path, else "
        "specdeploy_drafter_path when it exists on the controller.")
    specdeploy_staging_jobs: int = Field(
        4, ge=1, le=64, description="Files copied at once by `shared` staging.")
    specdeploy_staging_max_rate_mbps: float = Field(
        0, ge=0, le=1e6, allow_inf_nan=False, description="`shared` staging reads at most this many MB/s from "
        "shared storage, all files together, so a fleet staging at once does not starve the storage (0: no limit).")
    specdeploy_served_model_name: str | None = Field(
        None, description="Model name served by the OpenAI-compatible API (default: the model directory name).")
    specdeploy_tensor_parallel_size: int | None = Field(
        None, ge=1, description="Tensor-parallel size (default: the profile's GPU count).")
    specdeploy_expert_parallel: bool = Field(False, description="Enable expert parallelism for the MoE layers.")
    specdeploy_max_model_len: int | None = Field(None, ge=1, le=1 << 24, description="Maximum context length.")
    specdeploy_gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory the engine may use.")
    specdeploy_trust_remote_code: bool = Field(True, description="Allow the model's own Python code (Kimi needs it).")
    specdeploy_attention_backend: str | None = Field(
        None, description="Attention backend; default from the hardware profile (e.g. TRITON_MLA on SM120).")
    specdeploy_custom_all_reduce: bool | None = Field(
        None, description="Engine custom all-reduce; default from the hardware profile (off on PCIe).")
    specdeploy_spec_enabled: bool = Field(False, description="Enable speculative decoding.")
    specdeploy_spec_method: Literal["eagle3", "eagle", "mtp", "ngram"] = Field(
        "eagle3", description="Speculative method: `eagle3`, `eagle`, `mtp` or `ngram`.")
    specdeploy_drafter_path: str | None = Field(
        None, description="Drafter checkpoint directory on the host (as trained; specdeploy converts it).")
    specdeploy_spec_num_tokens: int = Field(3, ge=1, le=16, description="Draft tokens per step (k).")
    specdeploy_spec_k_by_batch: list[KBand] = Field(
        default_factory=list, description="Speculation length per load band, as `specdeploy gate` picks it: a list "
        "of `{from_batch, k}` in ascending `from_batch`, the first from 1; each band's k (0: no speculation) holds "
        "from that many running requests up to the next band. Each k is at most specdeploy_spec_num_tokens. Needs "
        "an engine release that takes a per-batch-size speculation length (" + _k_by_batch_text() + "); empty: "
        "one k for every load.")
    specdeploy_spec_config_extra: dict[str, Any] = Field(
        default_factory=dict, description="Extra speculative-config keys, validated against the engine version.")
    specdeploy_engine_probe: bool = Field(
        True, description="Before the engine restarts onto a new release with an EAGLE drafter, run the engine's own "
        "config validation and drafter weight loading (`specdeploy probe`) in that release's image or venv; what the "
        "engine refuses stops the deploy while the serving release keeps serving. A probe that cannot run there "
        "(no engine in the image, SGLang without a GPU) is a warning.")
    specdeploy_spec_gate: bool = Field(
        False, description="After readiness, measure whether speculation pays and apply the verdict.")
    specdeploy_load_format: str | None = Field(
        None, description="Engine weight loader (`--load-format`), checked against the pinned version: e.g. "
        "`safetensors`, `fastsafetensors` (GPU-direct; the image needs the fastsafetensors package), "
        "`runai_streamer` (concurrent streaming), `instanttensor` (" + _since_text("instanttensor") + "). "
        "Default: the engine's `auto`.")
    specdeploy_weight_cache: Literal["auto", "on", "off"] = Field(
        "auto", description="Keep the weights in a weight-cache daemon, a unit of its own started before the engine, "
        "so that an engine restart (the gate, regate, canary, a flag change, a crash) maps them in seconds instead "
        "of loading them: `auto` where the pinned release has a daemon specdeploy renders and it holds this "
        "checkpoint (its quantization, read from its config.json on the controller) in this configuration; `on` "
        "insists (an error where it cannot); `off` never. `specdeploy preflight` says which applies and why.")
    specdeploy_weight_cache_port: int = Field(
        29600, ge=1, le=65535, description="The weight-cache daemon's own rendezvous port (distinct from the "
        "engine's), the same on every rank of a serving group.")
    specdeploy_weight_cache_health_port: int = Field(
        9461, ge=1, le=65535, description="Port of the weight-cache daemon's health endpoint on 127.0.0.1 (where "
        "its release has one).")
    specdeploy_compile_cache: bool = Field(
        True, description="Keep the engine's compile caches (torch.compile, Triton, FlashInfer, CUDA's JIT cache) on "
        "a persistent host path per engine release and model, so a restart reuses them; a new release starts a "
        "fresh one.")
    specdeploy_page_cache_warm: bool = Field(
        True, description="Where no weight-cache daemon holds the weights: before the engine restarts, read the "
        "checkpoint into the host's page cache when the host's available memory holds it (checked on the host), "
        "so the load reads memory instead of disk.")
    specdeploy_engine_extra_args: list[str] = Field(
        default_factory=list, description="Extra engine flags, validated against the engine version.")
    specdeploy_engine_env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables for the engine unit.")
    specdeploy_nccl_env: dict[str, str] | None = Field(
        None, description="Tuned NCCL environment (written by `specdeploy nccl choose`); overrides the profile's.")
    specdeploy_router: Literal["none", "sglang-router"] = Field(
        "none", description="Put a router in front of the group's replicas (`sglang-router`, which serves vLLM and "
        "SGLang workers alike); rolling deploys then drain each replica through it.")
    specdeploy_router_port: int = Field(30080, ge=1, le=65535, description="Router HTTP port.")
    specdeploy_topology: Literal[LAYOUTS] = Field(  # type: ignore[valid-type]
        "single", description="How the hosts of one serving group (`specdeploy_group`) serve the model: "
        + "; ".join(f"`{k}`: {v}" for k, v in LAYOUT_TEXT.items()) + ". Every host of a group gives the same "
        "value; the group's ranks follow the order of its hosts in the inventory, the first being the leader that "
        "serves HTTP (docs/topology.md).")
    specdeploy_group: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", description="The serving group this host belongs to "
        "(one model instance; set it in the group_vars of an Ansible group that lists the instance's hosts). "
        "Required unless `specdeploy_topology` is `single`, where each host is its own group.")
    specdeploy_pd_role: Literal[PD_ROLES] | None = Field(  # type: ignore[valid-type]
        None, description="With `specdeploy_topology: pd`: whether this host serves `prefill` or `decode`.")
    specdeploy_dist_port: int = Field(
        29501, ge=1, le=65535, description="The rendezvous port on a multi-host group's leader (vLLM's "
        "`--master-port` or `--data-parallel-rpc-port`, SGLang's `--dist-init-addr` port).")
    specdeploy_dist_interface: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$", description="The network interface the ranks of a "
        "multi-host group talk over (NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME; `preflight --hosts` checks it "
        "exists on every rank). Default: NCCL's and Gloo's own choice.")
    specdeploy_dist_address: str | None = Field(
        None, description="The address the other ranks of this host's group reach it at (on "
        "`specdeploy_dist_interface`). Default: `ansible_host`.")
    specdeploy_rdma: bool | None = Field(
        None, description="The hosts have RDMA NICs (InfiniBand or RoCE) between them. Default: the hardware "
        "profile's. Cross-host `tp` and `pd` need them; `preflight --hosts` checks the devices.")
    specdeploy_kv_transfer: Literal["nixl", "mooncake"] = Field(
        "nixl", description="With `specdeploy_topology: pd`: how KV caches move from prefill to decode.")
    specdeploy_pd_port: int = Field(
        8998, ge=1, le=65535, description="With `specdeploy_topology: pd`: the KV-transfer side channel's port "
        "(SGLang's bootstrap port on prefill hosts, vLLM's NIXL side channel).")
    specdeploy_serial: SerialCount | SerialPercent | None = Field(
        None, description="Ansible `serial` for deploy.yml and rollback.yml (hosts per batch, e.g. 1 or `25%`); a "
        "fleet-wide setting (group_vars), read from the deploy's first engine host. Default: rolling batches that "
        "keep serving groups whole from `specdeploy_rolling_from_hosts` engine hosts on (one group first, then "
        "`specdeploy_rolling_batch_percent` of the fleet per batch), all at once below that.")
    specdeploy_rolling_from_hosts: int = Field(
        16, ge=1, le=100000, description="From how many engine hosts a deploy without `specdeploy_serial` rolls in "
        "batches (a canary serving group, then `specdeploy_rolling_batch_percent` per batch, each holding whole "
        "groups); a smaller inventory deploys all at once. Fleet-wide (group_vars).")
    specdeploy_rolling_batch_percent: int = Field(
        10, ge=1, le=100, description="Share of the fleet's engine hosts in each rolling batch after the canary "
        "group, rounded up to whole serving groups. Fleet-wide (group_vars).")
    specdeploy_max_fail_percentage: int = Field(
        10, ge=0, le=100, description="The failure budget of a rolling batch (Ansible's `max_fail_percentage`): "
        "when more than this share of a batch's hosts fails, the deploy stops before the next batch, so the "
        "hosts of later batches keep serving their release; a failed host rolls back to its previous release "
        "either way. Applies when the deploy rolls (`specdeploy_serial` set, or a fleet of at least "
        "`specdeploy_rolling_from_hosts` hosts); a deploy of everything at once stops only at the failed hosts. "
        "Fleet-wide (group_vars).")
    specdeploy_forks: int | None = Field(
        None, ge=1, le=1000, description="How many hosts Ansible works on at once (`--forks`), as `specdeploy "
        "deploy|rollback|verify` run the playbooks. Default: the largest batch, at least 10 and at most 100 "
        "(`ansible.cfg` holds 25 for `ansible-playbook` run directly). Fleet-wide (group_vars).")
    specdeploy_port: int = Field(8000, ge=1, le=65535, description="Engine HTTP port.")
    specdeploy_bind_address: str = Field("0.0.0.0", description="Engine bind address.")
    specdeploy_api_key_file: str | None = Field(
        None, description="File on the controller holding the API key; installed 0600, never on a command line.")
    specdeploy_exporter_port: int = Field(9450, ge=1, le=65535, description="Spec-decode exporter port.")
    specdeploy_start_timeout: str = Field(
        "infinity", description="systemd TimeoutStartSec of the engine unit (readiness is checked separately).")
    specdeploy_ready_timeout_s: int = Field(
        3600, ge=1, le=7 * 86400, description="How long the readiness gate waits for health and a real generation.")

    @field_validator("*", mode="before")
    @classmethod
    def _no_control_characters(cls, v: Any) -> Any:
        return refuse_control_characters(v)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, v: Any, info) -> Any:
        """YAML's true/false where a number is wanted is refused: pydantic would read ``specdeploy_port: true``
        as port 1."""
        if isinstance(v, bool) and _wants_number(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("bool_for_number", "{v} is a boolean where a number is wanted (write the number)",
                                      {"v": str(v).lower()})
        return v

    @field_validator("specdeploy_engine_env", "specdeploy_nccl_env")
    @classmethod
    def _env_names(cls, v):
        return env_names(v)

    @field_validator("specdeploy_model_path", "specdeploy_drafter_path", "specdeploy_venv_path",
                     "specdeploy_engine_venv_path")
    @classmethod
    def _absolute_path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("/"):
            raise PydanticCustomError("absolute_path", "'{v}' is not an absolute path", {"v": v})
        if ":" in v:  # docker -v SRC:DST[:ro] and the bind mounts split on it
            raise PydanticCustomError("colon_in_path", "'{v}' holds a ':', which docker -v reads as a separator",
                                      {"v": v})
        return v

    @field_validator("specdeploy_start_timeout")
    @classmethod
    def _time_span(cls, v: str) -> str:
        if not _TIME_SPAN.fullmatch(v):
            raise PydanticCustomError("time_span", "'{v}' is not a systemd time span", {"v": v})
        return v

    @field_validator("specdeploy_engine")
    @classmethod
    def _engine_known(cls, v: str) -> str:
        from specdeploy.engines import names
        if v not in names():  # worded as pydantic words a Literal's error
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": " or ".join(repr(n) for n in names())})
        return v

    @field_validator("specdeploy_engine_version")
    @classmethod
    def _version_shape(cls, v: str) -> str:
        parts = v.split(".")
        if len(parts) < 3 or not all(p.split("post")[0].isdigit() or p.startswith("post") for p in parts):
            raise ValueError(f"'{v}' is not a release version like 0.16.0")
        return v

    @field_validator("specdeploy_engine_versions")
    @classmethod
    def _versions_shape(cls, v: dict[str, str]) -> dict[str, str]:
        from specdeploy.engines import names
        for engine, version in v.items():
            if engine not in names():
                raise PydanticCustomError("unknown_engine", "{engine} is not an engine; engines: {known}",
                                          {"engine": repr(engine), "known": ", ".join(names())})
            cls._version_shape(version)
        return v

    _version_from: str = PrivateAttr("specdeploy_engine_version")

    @model_validator(mode="after")
    def _pin_release(self):
        """The engine's release: the override, else the inventory's per-engine pin, else the project's pin for this
        hardware (the adapter's ``pins``)."""
        if self.specdeploy_engine_version is not None:
            self._version_from = "specdeploy_engine_version"
        elif self.specdeploy_engine in self.specdeploy_engine_versions:
            self.specdeploy_engine_version = self.specdeploy_engine_versions[self.specdeploy_engine]
            self._version_from = f"specdeploy_engine_versions.{self.specdeploy_engine}"
        elif self.specdeploy_hardware != "custom" or self.specdeploy_hardware_custom is not None:
            from specdeploy.engines import get
            self.specdeploy_engine_version = get(self.specdeploy_engine).pinned(self.profile()).version
            self._version_from = "pinned"
        return self

    def release_choice(self) -> str:
        """Which release of the engine this host runs, and why (``specdeploy preflight`` shows it)."""
        from specdeploy.engines import get
        cls = get(self.specdeploy_engine)
        what = f"{cls.label} {self.specdeploy_engine_version}"
        if self._version_from != "pinned":
            return f"{what}, from {self._version_from}"
        pin = cls.pinned(self.profile())
        return f"{what}, the release specdeploy pins for {self.specdeploy_engine} on {self.specdeploy_hardware} " \
            f"(neither specdeploy_engine_version nor specdeploy_engine_versions.{self.specdeploy_engine} is set): " \
            f"{pin.reason}"

    @property
    def uses_drafter(self) -> bool:
        """Whether this host serves a separate drafter checkpoint (the adapter's answer for the method)."""
        from specdeploy.engines import get
        return bool(self.specdeploy_spec_enabled and self.specdeploy_drafter_path
                    and get(self.specdeploy_engine).draft_source(self.specdeploy_spec_method) == "drafter")

    @model_validator(mode="after")
    def _cross_field(self):
        if self.specdeploy_hardware == "custom" and self.specdeploy_hardware_custom is None:
            raise ValueError("specdeploy_hardware_custom is required when specdeploy_hardware is 'custom'")
        if self.specdeploy_sandbox_engine == "real" and not (
                self.specdeploy_sandbox and self.specdeploy_runtime == "venv" and self.specdeploy_engine_venv_path):
            raise ValueError("specdeploy_sandbox_engine 'real' runs the engine from specdeploy_engine_venv_path on a "
                             "sandbox host: it needs specdeploy_sandbox: true, specdeploy_runtime: venv and "
                             "specdeploy_engine_venv_path")
        return self

    @property
    def engine_venv(self) -> str:
        """The Python environment the `venv` runtime runs the engine from."""
        return self.specdeploy_engine_venv_path or self.specdeploy_venv_path

    @property
    def drafter_source(self) -> str:
        return self.specdeploy_drafter_source or self.specdeploy_model_source

    def weights(self) -> list[dict]:
        """The checkpoints this host serves, each with its source mode and paths (model first, then drafter)."""
        out = [{"kind": "model", "path": self.specdeploy_model_path, "source": self.specdeploy_model_source,
                "controller": self.specdeploy_model_controller_path, "shared": self.specdeploy_model_shared_path,
                "manifest": self.specdeploy_model_sha256_manifest}]
        if self.uses_drafter:
            out.append({"kind": "drafter", "path": self.specdeploy_drafter_path, "source": self.drafter_source,
                        "controller": self.specdeploy_drafter_controller_path,
                        "shared": self.specdeploy_drafter_shared_path,
                        "manifest": self.specdeploy_drafter_sha256_manifest})
        from specdeploy.hostscripts.staging import store_of
        for it in out:  # where controller and shared copies are staged, beside the target
            it["path"] = it["path"].rstrip("/") or "/"
            it["store"] = str(store_of(it["path"]))
        return out

    # ---- derived values -------------------------------------------------------------------
    def profile(self):
        from specdeploy.values.hardware import get_profile
        custom = self.specdeploy_hardware_custom.model_dump() if self.specdeploy_hardware_custom else None
        return get_profile(self.specdeploy_hardware, custom)

    @property
    def rdma(self) -> bool:
        """RDMA NICs between hosts: as the inventory says, else as the hardware profile ships."""
        return self.profile().rdma if self.specdeploy_rdma is None else self.specdeploy_rdma

    @property
    def tp(self) -> int:
        return self.specdeploy_tensor_parallel_size or self.profile().gpu_count

    @property
    def served_model_name(self) -> str:
        return self.specdeploy_served_model_name or self.specdeploy_model_path.rstrip("/").rsplit("/", 1)[-1]


FIELDS = HostVars.model_fields

RENAMED = {"specdeploy_model_local_path": "specdeploy_model_config_copy",
           "specdeploy_drafter_local_path": "specdeploy_drafter_config_copy"}

_FIXES = {
    "control_character": "remove the control character (newline, carriage return, tab, ...): a systemd unit "
    "line, an env file or a YAML value cannot carry it",
    "time_span": "give `infinity` or a time span such as `90min` or `2h 30min` (systemd.time(7))",
    "env_name": "use letters, digits and underscores, not starting with a digit",
    "absolute_path": "give the absolute path on the host (starting with /)",
    "colon_in_path": "move or link the directory to a path without ':'",
    "literal_error": "use one of the allowed values",
    "missing": "set it in group_vars/ or host_vars/",
    "extra_forbidden": "remove it",
}


def _type_fix(err: dict) -> str:
    t = err["type"]
    if t in _FIXES:
        return _FIXES[t]
    if t.endswith("_parsing") or t.endswith("_type"):
        return f"give a value of type {t.split('_')[0]}"
    return "correct the value"


# Validated variables by their content: a fleet's hosts mostly share their group's variables, and each distinct set
# is validated once per process (bounded; a set whose findings name the host it was validated for is not shared).
_SEEN: dict[str, tuple[str, HostVars | None, list[Finding]]] = {}
_SEEN_MAX = 4096


def content_key(ours: dict[str, Any]) -> str | None:
    try:
        return json.dumps(ours, sort_keys=True, allow_nan=True, default=lambda o: f"<{type(o).__name__}>{o!r}")
    except (TypeError, ValueError, RecursionError):
        return None


def validate_host(host: str, variables: dict[str, Any]) -> HostVars:
    """Validate the ``specdeploy_*`` variables of one host. Raises SpecdeployError with one line per problem.
    Hosts with the same ``specdeploy_*`` values share one validation (its findings carry each host's name)."""
    ours = {k: v for k, v in variables.items() if k.startswith(PREFIX)}
    key = content_key(ours)
    seen = _SEEN.get(key) if key is not None else None
    if seen is not None:
        first, hv, found = seen
        problems = [replace(f, host=host if f.host == first else f.host) for f in found]
        problems.extend(address_problems(host, variables))
        if problems:
            raise SpecdeployError(problems)
        return hv.model_copy()
    try:
        hv = _validate(host, ours)
        found: list[Finding] = []
    except SpecdeployError as exc:
        hv, found = None, list(exc.problems)
    if key is not None and not any(_names(f, host) for f in found):
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[key] = (host, hv, [replace(f) for f in found])  # copies: a caller may edit what it gets
    problems = found + address_problems(host, variables)
    if problems:
        raise SpecdeployError(problems)
    return hv.model_copy()


def _names(f: Finding, host: str) -> bool:
    """Whether a finding's text names the host (then it is not shared with hosts of other names)."""
    return any(host in (part or "") for part in (f.subject, f.message, f.fix))


def _validate(host: str, ours: dict[str, Any]) -> HostVars:
    problems: list[Finding] = []
    for key in list(ours):
        if key in RENAMED:
            problems.append(Finding("error", key, f"was renamed to {RENAMED[key]} (a controller-side config copy, "
                                    "never copied to hosts)", f"rename it to {RENAMED[key]}; to push a full "
                                    "checkpoint from the controller set specdeploy_model_source: controller and "
                                    "specdeploy_model_controller_path", host))
            ours.pop(key)
        elif key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            problems.append(Finding("error", key, "unknown variable",
                                    f"{hint}see docs/variables.md for the variables specdeploy reads", host))
            ours.pop(key)
    try:
        hv = HostVars(**ours)
    except ValidationError as exc:
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            subject = ".".join(loc) if loc else "variables"
            msg = err["msg"]
            if err["type"] == "missing":
                msg = "is required"
            problems.append(Finding("error", subject, msg, _type_fix(err), host))
        raise SpecdeployError(problems) from None
    problems.extend(semantic_problems(host, hv))
    if problems:
        raise SpecdeployError(problems)
    return hv


# The checks that need more than one field (hostvars/semantics.py); validate_host runs them.
from specdeploy.hostvars.semantics import address_problems, semantic_problems  # noqa: E402
