"""Every role's argument specs cover exactly its defaults, with matching types, and every entry point that a
playbook or role includes (tasks_from) has a spec of its own. Ansible validates a role's arguments against these
specs before its first task; a default without a spec is an unchecked variable."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers import REPO

ROLES = sorted(p.name for p in (REPO / "ansible/roles").iterdir() if p.is_dir())
TYPES = {"str": (str,), "int": (int,), "float": (float, int), "bool": (bool,), "list": (list,), "dict": (dict,)}


def _defaults(role: str) -> dict:
    out: dict = {}
    for f in sorted((REPO / "ansible/roles" / role / "defaults").rglob("*.yml")):
        out.update(yaml.safe_load(f.read_text()) or {})
    return out


def _specs(role: str) -> dict:
    return yaml.safe_load((REPO / "ansible/roles" / role / "meta/argument_specs.yml").read_text())["argument_specs"]


def _includes(node, where: str):
    """(role, tasks_from, file) for every include_role/import_role with tasks_from below node."""
    if isinstance(node, dict):
        for key, val in node.items():
            if key.split(".")[-1] in ("include_role", "import_role") and isinstance(val, dict) \
                    and "tasks_from" in val:
                yield val["name"], val["tasks_from"], where
            yield from _includes(val, where)
    elif isinstance(node, list):
        for item in node:
            yield from _includes(item, where)


def _all_includes():
    files = sorted((REPO / "ansible").glob("*.yml")) + sorted((REPO / "ansible/roles").glob("*/tasks/*.yml"))
    for f in files:
        yield from _includes(yaml.safe_load(f.read_text()), str(f.relative_to(REPO)))


@pytest.mark.parametrize("role", ROLES)
def test_defaults_equal_the_argument_specs(role):
    defaults, specs = _defaults(role), _specs(role)
    options = {n: o for entry in specs.values() for n, o in (entry.get("options") or {}).items()}
    optional = {n for n, o in options.items() if not o.get("required")}
    assert set(defaults) - optional == set(), f"{role}: defaults without an argument spec"
    assert optional - set(defaults) == set(), f"{role}: optional arguments without a default in defaults/"
    for entry, spec in specs.items():
        for name, opt in (spec.get("options") or {}).items():
            where = f"{role} {entry}.{name}"
            if opt.get("required"):
                assert name not in defaults, f"{where}: required, yet defaulted"
                continue
            value = defaults[name]
            if opt["type"] != "raw" and value is not None:
                assert isinstance(value, TYPES[opt["type"]]), f"{where}: {opt['type']}, default {value!r}"
                assert opt["type"] == "bool" or not isinstance(value, bool), f"{where}: {value!r} is a bool"
            if "default" in opt:
                assert opt["default"] == value, f"{where}: spec says {opt['default']!r}, defaults/ {value!r}"
            if "choices" in opt and value is not None:
                assert value in opt["choices"], where


def test_every_included_entry_point_has_a_spec():
    seen = set()
    for role, tasks_from, where in _all_includes():
        entry = Path(tasks_from).stem
        assert (REPO / "ansible/roles" / role / "tasks" / tasks_from).is_file(), (where, role, tasks_from)
        assert entry in _specs(role), f"{where} includes {role}/{tasks_from}, which has no argument spec '{entry}'"
        seen.add((role, entry))
    assert ("router", "drain") in seen and ("common", "release") in seen  # the walk does find includes
    for role in ROLES:
        for entry in _specs(role):
            assert (REPO / "ansible/roles" / role / "tasks" / f"{entry}.yml").is_file(), f"{role}: spec '{entry}'"


def test_the_check_catches_a_default_without_a_spec(tmp_path, monkeypatch):
    """The comparison above is not vacuous: a role with one unspecified default fails it."""
    role = tmp_path / "ansible/roles/demo"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults/main.yml").write_text("demo_a: 1\ndemo_b: x\n")
    (role / "meta/argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      demo_a: {type: int, default: 1, description: a}\n")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    with pytest.raises(AssertionError, match="defaults without an argument spec"):
        test_defaults_equal_the_argument_specs("demo")
    (role / "meta/argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      demo_a: {type: str, default: 1, description: a}\n"
        "      demo_b: {type: str, default: x, description: b}\n")
    with pytest.raises(AssertionError, match="str, default 1"):
        test_defaults_equal_the_argument_specs("demo")
