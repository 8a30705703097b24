"""The host-side commands (drafter check/convert, exporter, triage, readiness, staging, simulator) import only what
the hosts' offline wheelhouse carries: a module-level import of a package missing there breaks the deploy on the
host, far from the change that caused it."""
from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from specdeploy.ops.wheelhouse import HOST_REQUIREMENTS
from helpers import REPO

SRC = REPO / "src" / "specdeploy"
HOST_ENTRY = ["cli", "cli.host", "cli.drafter", "cli.patch", "cli.ops", "drafter", "speculation.exporter", "triage",
              "checks.readiness", "testing.simulator", "hostscripts.staging", "checkpoint.safetensors_io"]


def _module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _module_level_imports(name: str) -> tuple[set[str], set[str]]:
    """(specdeploy submodules, third-party top-level names) imported at module level by ``name``."""
    path = _module_file(name)
    tree = ast.parse(path.read_text())
    pkg = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    ours, theirs = set(), set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            theirs |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".") if pkg else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                mod = ".".join(p for p in [*parts, node.module or ""] if p)
                ours.add(mod)
                ours |= {f"{mod}.{a.name}" for a in node.names if _module_file(f"{mod}.{a.name}")}
            elif node.module and node.module.split(".")[0] == "specdeploy":
                mod = node.module.removeprefix("specdeploy").lstrip(".")
                ours.add(mod)
                ours |= {f"{mod}.{a.name}".lstrip(".") for a in node.names
                         if _module_file(f"{mod}.{a.name}".lstrip("."))}
            elif node.module:
                theirs.add(node.module.split(".")[0])
    return {m for m in ours if m and _module_file(m)}, theirs - {"__future__"}


def test_host_side_imports_are_in_the_wheelhouse():
    assert all(_module_file(m) for m in HOST_ENTRY), [m for m in HOST_ENTRY if not _module_file(m)]
    seen, todo, third = set(), list(HOST_ENTRY), set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        ours, theirs = _module_level_imports(m)
        todo.extend(ours - seen)
        third |= theirs
    assert {"values.errors", "engines", "drafter.model"} <= seen, "the walk follows specdeploy's own imports"
    third -= set(sys.stdlib_module_names)
    dists = packages_distributions()
    wanted = {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in HOST_REQUIREMENTS}
    missing = {}
    for name in sorted(third):
        have = {d.lower().replace("_", "-") for d in dists.get(name, [name])}
        if not have & wanted:
            missing[name] = sorted(have)
    assert not missing, f"imported at module level by host-side commands but not in HOST_REQUIREMENTS: {missing}"
