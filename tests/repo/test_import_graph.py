"""The package's import graph has no circles: every import (module level, inside functions, under
TYPE_CHECKING) of one specdeploy module by another is an edge, read with ``ast``; a strongly connected
component of more than one module is a circle."""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "specdeploy"


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    out = {}
    for f in sorted((root / PKG).rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (f, is_pkg)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, (f, is_pkg) in mods.items():
        here = name.split(".") if is_pkg else name.split(".")[:-1]  # the package relative imports start from
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not (target == PKG or target.startswith(PKG + ".")):
                    continue
                for a in node.names:  # `from pkg import mod` imports the submodule; else the module itself
                    sub = f"{target}.{a.name}"
                    deps.add(sub if sub in mods else target)
        deps.discard(name)
        graph[name] = {d for d in deps if d in mods}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circles_in_specdeploy():
    found = circles(import_graph(SRC))
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The checker finds a circle made of a relative import, a function-level import and a TYPE_CHECKING one."""
    pkg = tmp_path / PKG
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specdeploy import a\n")
    (pkg / "d.py").write_text("import specdeploy.c\n")
    graph = import_graph(tmp_path)
    assert graph["specdeploy.d"] == {"specdeploy.c"}
    assert circles(graph) == [["specdeploy.a", "specdeploy.c", "specdeploy.sub.b"]]
    (pkg / "c.py").write_text("x = 1\n")
    assert circles(import_graph(tmp_path)) == []


@pytest.mark.parametrize("module", ["specdeploy.hostvars.schema", "specdeploy.engines", "specdeploy.engines.base"])
def test_engines_sit_below_the_schema(module):
    """The adapters take host variables as arguments; nothing in engines/ imports the schema."""
    graph = import_graph(SRC)
    reach, todo = set(), [module]
    while todo:
        m = todo.pop()
        for d in graph[m] - reach:
            reach.add(d)
            todo.append(d)
    if module == "specdeploy.hostvars.schema":
        assert "specdeploy.engines" in reach
    else:
        assert "specdeploy.hostvars.schema" not in reach


def test_only_the_command_line_reaches_the_testing_package():
    """specdeploy.testing (simulator, sandbox hosts, test checkpoints) is reached only by the commands that run it;
    no domain module depends on it."""
    graph = import_graph(SRC)
    users = {m for m, deps in graph.items() if not m.startswith(PKG + ".testing")
             and any(d == PKG + ".testing" or d.startswith(PKG + ".testing.") for d in deps)}
    assert users and all(m == PKG + ".cli" or m.startswith(PKG + ".cli.") for m in users), users


# The layers, bottom up: a package imports only packages of a lower rank (and itself). Packages of one rank are
# independent of each other. hostscripts import nothing of ours at all (they run on hosts before anything is
# installed there). docs/architecture.md shows the same table.
LAYERS = {
    "values": 0, "hostscripts": 0,
    "engines": 1,
    "hostvars": 2,
    "checkpoint": 3, "nccl": 3, "triage": 3, "topology": 3,
    "plan": 4,
    "drafter": 5, "gpuhost": 5, "speculation": 5,
    "checks": 6,
    "ops": 7,
    "deploy": 8, "testing": 8,
    "cli": 9,
}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, deps in graph.items():
        here = package_of(m)
        for d in sorted(deps):
            there = package_of(d)
            if here is None or there is None or here == there:
                continue
            if here == "hostscripts" or LAYERS[there] >= LAYERS[here]:
                bad.append(f"{m} ({here}, layer {LAYERS[here]}) imports {d} ({there}, layer {LAYERS[there]})")
    return bad


def test_every_package_has_a_layer():
    found = {package_of(m) for m in modules(SRC)} - {None}
    found = {p for p in found if (SRC / PKG / p).is_dir()}
    assert found == set(LAYERS), f"packages without a layer: {found - set(LAYERS)}; gone: {set(LAYERS) - found}"
    flat = [f.name for f in (SRC / PKG).glob("*.py") if f.name != "__init__.py"]
    assert not flat, f"modules outside every layer package: {flat}"


def test_imports_go_down_the_layers():
    bad = upward_imports(import_graph(SRC))
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_a_planted_upward_import_fails(tmp_path):
    """The layer check is not vacuous: the real tree with one upward import planted in it (the hardware values
    importing the schema) fails it, at exactly that edge."""
    import shutil
    shutil.copytree(SRC / PKG, tmp_path / PKG)
    target = tmp_path / PKG / "values" / "hardware.py"
    target.write_text(target.read_text() + "\n\ndef _planted():\n    from specdeploy.hostvars import schema  # noqa\n")
    bad = upward_imports(import_graph(tmp_path))
    assert len(bad) == 1 and bad[0].startswith("specdeploy.values.hardware (values, layer 0) imports "
                                               "specdeploy.hostvars.schema"), bad
    assert not upward_imports(import_graph(SRC))


def test_host_scripts_import_only_the_standard_library():
    """staging and converged are copied to hosts and run by the host's own python3: a module-level import of
    anything but the standard library (or of ours) breaks them there."""
    import sys
    for f in sorted((SRC / PKG / "hostscripts").glob("*.py")):
        tree = ast.parse(f.read_text())
        tops = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"{f.name}: relative import"
                tops.add((node.module or "").split(".")[0])
        allowed = set(sys.stdlib_module_names) | {"__future__", "yaml"}
        assert tops <= allowed, f"{f.name} imports {sorted(tops - allowed)}"


def test_the_architecture_doc_names_every_module_under_its_layer():
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    rows = {line.split("|")[2].strip().strip("`/"): line for line in doc.splitlines()
            if line.startswith("| ") and line.count("|") >= 5 and line.split("|")[1].strip().isdigit()}
    assert set(rows) == set(LAYERS), f"doc layers {sorted(rows)} != {sorted(LAYERS)}"
    for pkg, rank in LAYERS.items():
        assert rows[pkg].split("|")[1].strip() == str(rank), f"{pkg}: the doc says layer {rows[pkg].split('|')[1]}"
    for f in sorted((SRC / PKG).rglob("*.py")):
        rel = f.relative_to(SRC / PKG)
        if rel.name == "__init__.py" or len(rel.parts) == 1:
            continue
        assert f"`{rel.as_posix()}`" in rows[rel.parts[0]], f"docs/architecture.md: {rel} not named in the " \
                                                            f"{rel.parts[0]} row"
