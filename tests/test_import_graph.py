"""The package's import graph has no circles: every import (module level, inside functions, under
TYPE_CHECKING) of one specdeploy module by another is an edge, read with ``ast``; a strongly connected
component of more than one module is a circle."""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
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
