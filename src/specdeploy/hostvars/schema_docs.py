"""Generate docs/variables.md and each role's meta/argument_specs.yml from the pydantic schema."""
from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from specdeploy.hostvars.schema import FIELDS

# Which variables each role reads. Every role that takes part in the engine deployment validates the full
# engine-host set; the others validate what they use.
_ALL = list(FIELDS)
ROLE_VARS: dict[str, list[str]] = {
    "common": ["specdeploy_venv_path"],
    "gpu_host": ["specdeploy_hardware", "specdeploy_hardware_custom", "specdeploy_sandbox", "specdeploy_runtime"],
    "engine_image": ["specdeploy_engine", "specdeploy_engine_version", "specdeploy_engine_patches",
                     "specdeploy_runtime", "specdeploy_image", "specdeploy_venv_path", "specdeploy_sandbox"],
    "model_store": ["specdeploy_model_path", "specdeploy_model_source", "specdeploy_model_controller_path",
                    "specdeploy_model_shared_path", "specdeploy_model_sha256_manifest", "specdeploy_drafter_path",
                    "specdeploy_drafter_source", "specdeploy_drafter_controller_path",
                    "specdeploy_drafter_shared_path", "specdeploy_drafter_sha256_manifest",
                    "specdeploy_spec_enabled", "specdeploy_spec_method", "specdeploy_staging_jobs",
                    "specdeploy_staging_max_rate_mbps", "specdeploy_venv_path"],
    "drafter": ["specdeploy_engine", "specdeploy_engine_version", "specdeploy_model_path",
                "specdeploy_drafter_path", "specdeploy_spec_enabled", "specdeploy_spec_method",
                "specdeploy_venv_path"],
    "inference_engine": _ALL,
    "spec_exporter": ["specdeploy_engine", "specdeploy_engine_version", "specdeploy_port",
                      "specdeploy_exporter_port", "specdeploy_venv_path"],
    "router": ["specdeploy_router", "specdeploy_router_port", "specdeploy_port", "specdeploy_venv_path"],
}
ROLE_DESCRIPTIONS = {
    "common": "Internal base of the other roles: service user, directories, tools venv, copy to the host, "
              "release bookkeeping.",
    "gpu_host": "Prepare a GPU host: driver checks, persistence mode, fabric manager, ACS/IOMMU, memlock.",
    "engine_image": "Build or install the engine runtime, patched where the version needs it.",
    "model_store": "Verify the model and drafter on the host, or stage them (controller, shared storage) "
                   "beside the target with an atomic switch; never deletes weights.",
    "drafter": "Check the drafter and convert it for the engine.",
    "inference_engine": "Render the units from the core, start the engine, gate readiness, roll back on failure.",
    "spec_exporter": "Run the speculative-decoding exporter next to the engine.",
    "router": "Run sglang-router in front of a group's replicas; drain and re-add replicas in rolling deploys.",
}


def _strip_optional(tp):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _ansible_type(tp) -> dict[str, Any]:
    tp, optional = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:  # Ansible checks choices even for a null value: a nullable choice lists None
        return {"type": "str", "choices": list(typing.get_args(tp)) + ([None] if optional else [])}
    if tp is bool:
        return {"type": "bool"}
    if tp is int:
        return {"type": "int"}
    if tp is float:
        return {"type": "float"}
    if tp is str:
        return {"type": "str"}
    if origin is list:
        (arg,) = typing.get_args(tp) or (str,)
        return {"type": "list", "elements": "dict" if isinstance(arg, type) and issubclass(arg, BaseModel) else
                "int" if arg is int else "str"}
    if origin is dict or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return {"type": "dict"}
    return {"type": "raw"}


def _type_text(tp) -> str:
    tp, opt = _strip_optional(tp)
    t = _ansible_type(tp)
    s = " \\| ".join(f"`{c}`" for c in t["choices"]) if "choices" in t else t["type"]
    return s + (" or null" if opt else "")


def _choices(name: str) -> list | None:
    """Choices that come from a registry rather than from the field's type."""
    if name == "specdeploy_engine":
        from specdeploy.engines import names
        return list(names())
    return None


def ansible_default(value):
    """A default as a role writes it: a host path through the ``specdeploy_path`` filter, so the roles never
    spell one (values/hostpaths.py is the one place)."""
    from specdeploy.values.hostpaths import HOST_PATHS
    for key, path in HOST_PATHS.items():
        if isinstance(value, str) and value == path:
            return "{{ '" + key + "' | specdeploy_path }}"
    return value


def field_spec(name: str) -> dict[str, Any]:
    f = FIELDS[name]
    spec: dict[str, Any] = {"description": f.description or name}
    spec.update(_ansible_type(f.annotation))
    if _choices(name):
        spec["choices"] = _choices(name)
    if f.is_required():
        spec["required"] = True
    else:
        default = f.get_default(call_default_factory=True)
        if default is not None:
            spec["default"] = ansible_default(default)
    return spec


def _role_names(role: str) -> list[str]:
    if role not in ROLE_VARS:
        from specdeploy.values.errors import Finding, SpecdeployError
        raise SpecdeployError([Finding("error", "role", f"unknown role '{role}'",
                                       f"use one of: {', '.join(sorted(ROLE_VARS))}")])
    return ROLE_VARS[role]


ROLES_DIR = Path(__file__).resolve().parents[3] / "ansible" / "roles"


def _role_own(role: str) -> tuple[dict, dict]:
    """The hand-written part of a role's argument specs, kept on regeneration: the main entry point's options
    for the role's own (non-``specdeploy_*``) variables, and the other entry points (tasks_from files)."""
    path = ROLES_DIR / role / "meta" / "argument_specs.yml"
    if not path.is_file():
        return {}, {}
    specs = (yaml.safe_load(path.read_text()) or {}).get("argument_specs") or {}
    own = {n: o for n, o in ((specs.get("main") or {}).get("options") or {}).items() if n not in FIELDS}
    return own, {k: v for k, v in specs.items() if k != "main"}


def argument_specs(role: str) -> dict:
    names = _role_names(role)
    own, entry_points = _role_own(role)
    return {"argument_specs": {"main": {
        "short_description": ROLE_DESCRIPTIONS[role],
        "description": ["Generated from specdeploy.hostvars.schema.HostVars by `specdeploy schema write`;",
                        "the role's own options and its other entry points are written here by hand and kept.",
                        "tests/unit/hostvars/test_schema.py fails when the generated part drifts."],
        "options": {n: field_spec(n) for n in names} | own,
    }, **entry_points}}


def role_defaults(role: str) -> dict:
    """Schema defaults as Ansible role defaults (argument_specs defaults are documentation only)."""
    out = {}
    for n in _role_names(role):
        f = FIELDS[n]
        if not f.is_required():
            out[n] = ansible_default(f.get_default(call_default_factory=True))
    return out


def role_defaults_yaml(role: str) -> str:
    return ("---\n# Generated from specdeploy.hostvars.schema.HostVars by `specdeploy schema write`; do not edit.\n"
            + yaml.safe_dump(role_defaults(role), sort_keys=False, width=110))


class _IndentedDumper(yaml.SafeDumper):
    """Indent block sequences under their key, as yamllint (and ansible-lint) expect."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def argument_specs_yaml(role: str) -> str:
    return "---\n" + yaml.dump(argument_specs(role), Dumper=_IndentedDumper, sort_keys=False, width=95)


def variables_markdown() -> str:
    lines = ["# Inventory variables", "",
             "Generated from `specdeploy.hostvars.schema.HostVars` by `specdeploy schema write`; do not edit by hand.",
             "Engine hosts belong to the group `specdeploy_engines`; the Prometheus/Grafana host to "
             "`specdeploy_monitoring`. Any other `specdeploy_*` variable is an error.", "",
             "| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, f in FIELDS.items():
        default = "required" if f.is_required() else f"`{f.get_default(call_default_factory=True)!r}`"
        kind = " \\| ".join(f"`{c}`" for c in _choices(name)) if _choices(name) else _type_text(f.annotation)
        lines.append(f"| `{name}` | {kind} | {default} | {f.description} |")
    return "\n".join(lines + [""] + release_lines()) + "\n"


def release_lines() -> list[str]:
    """The "Engine releases" section: the release each engine deploys when the inventory pins none, per hardware,
    with the reason (each adapter's ``pins``)."""
    from specdeploy.engines import adapters
    out = ["## Engine releases", "",
           "`specdeploy_engine` alone picks the engine; its release comes from `specdeploy_engine_version` (an "
           "override for whichever engine is chosen), else `specdeploy_engine_versions.<engine>`, else the release "
           "specdeploy pins below. `specdeploy preflight` says which it chose and why. The example inventories pin "
           "both engines in `specdeploy_engine_versions`, so switching `specdeploy_engine` switches the release "
           "with it.", "",
           "| engine | hardware | release | why |", "|---|---|---|---|"]
    for a in adapters():
        for pin in a.pins:
            where = f"compute capability {pin.compute_capability}*" if pin.compute_capability else "every profile"
            out.append(f"| {a.label} | {where} | {pin.version} | {pin.reason} |")
    return out



def generated_files(repo: Path | None = None) -> dict[Path, str]:
    """Every file generated from the schema: each role's defaults/main/schema.yml and meta/argument_specs.yml,
    and docs/variables.md. All are computed before any is written (an argument spec keeps its hand-written part,
    which is read from the file being replaced)."""
    repo = repo or ROLES_DIR.parents[1]
    out: dict[Path, str] = {}
    for role in ROLE_VARS:
        out[repo / "ansible" / "roles" / role / "defaults" / "main" / "schema.yml"] = role_defaults_yaml(role)
        out[repo / "ansible" / "roles" / role / "meta" / "argument_specs.yml"] = argument_specs_yaml(role)
    out[repo / "docs" / "variables.md"] = variables_markdown()
    return out


def write_generated(check: bool = False) -> list[Path]:
    """Regenerate every schema-generated file; with ``check``, write nothing. Returns the files that were (or,
    with ``check``, would be) changed."""
    import os
    changed = []
    for path, text in generated_files().items():
        if path.is_file() and path.read_text() == text:
            continue
        changed.append(path)
        if not check:
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
    return changed
