"""Facts read from the engines' real sources (vLLM sdists, SGLang wheels): the command-line flags, the
speculative-config keys and the speculative methods each release accepts.

The simulator checks a command line against these facts rather than against specdeploy's own flag table, so a
flag or a method the real engine would reject is rejected in the sandbox too. ``engines/facts.json`` holds the
facts of the releases the sandbox plays; ``tests/contract`` re-extracts them from the downloaded sources and
fails when they drift. Refresh: ``python -m specdeploy.engine_facts record vllm 0.16.0`` (needs the index).
"""
from __future__ import annotations

import ast
import json
import re
import sys
from functools import lru_cache
from pathlib import Path

FACTS_FILE = Path(__file__).resolve().parent / "engines" / "facts.json"


def _fields(path: Path, class_pred) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and class_pred(node.name):
            out |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return out


def _flag_literals(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"--[a-z0-9-]+", n.value)}


def _strings(node) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _vllm(root: Path) -> dict:
    vl = root / "vllm"
    flags: set[str] = set()
    for f in [vl / "engine" / "arg_utils.py"] + sorted((vl / "entrypoints").rglob("cli_args.py")):
        flags |= {"--" + n.replace("_", "-") for n in _fields(f, lambda c: c.endswith("Args"))} | _flag_literals(f)
    spec = vl / "config" / "speculative.py"
    methods: set[str] = set()
    for node in ast.walk(ast.parse(spec.read_text())):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith(("ModelTypes", "Method"))
                                                for t in node.targets):
            methods |= set(_strings(node.value))
    return {"flags": sorted(flags), "spec_keys": sorted(_fields(spec, lambda c: c == "SpeculativeConfig")),
            "spec_methods": sorted(methods)}


def _sglang(root: Path) -> dict:
    srt = root / "sglang" / "srt"
    flags: set[str] = set()
    algos: set[str] = set()
    for f in sorted((srt / "arg_groups").rglob("*.py")) + [srt / "server_args.py"]:
        if not f.exists():
            continue
        flags |= {"--" + n.replace("_", "-") for n in _fields(f, lambda c: True)} | _flag_literals(f)
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == "--speculative-algorithm"):
                for kw in node.keywords:
                    if kw.arg == "choices":
                        algos |= set(_strings(kw.value))
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
                algos |= set(_strings(node.value))
    return {"flags": sorted(flags), "spec_methods": sorted(algos)}


def extract(engine: str, root: Path) -> dict:
    """Facts from an unpacked release (the directory that contains ``vllm/`` or ``sglang/``)."""
    return _vllm(root) if engine == "vllm" else _sglang(root)


@lru_cache(maxsize=None)
def _all() -> dict:
    return json.loads(FACTS_FILE.read_text()) if FACTS_FILE.is_file() else {}


def recorded(engine: str, version: str) -> dict | None:
    """The recorded facts of a release, or None when specdeploy has none for it."""
    d = _all().get(engine, {}).get(version)
    if d is None:
        return None
    return {k: frozenset(v) for k, v in d.items()}


def record(engine: str, version: str) -> dict:
    from . import upstream
    root = upstream.vllm_source(version) if engine == "vllm" else upstream.sglang_source(version)
    data = json.loads(FACTS_FILE.read_text()) if FACTS_FILE.is_file() else {}
    data.setdefault(engine, {})[version] = extract(engine, root)
    FACTS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    _all.cache_clear()
    return data[engine][version]


if __name__ == "__main__":  # python -m specdeploy.engine_facts record ENGINE VERSION...
    if len(sys.argv) < 4 or sys.argv[1] != "record":
        sys.exit("usage: python -m specdeploy.engine_facts record vllm|sglang VERSION...")
    for v in sys.argv[3:]:
        f = record(sys.argv[2], v)
        print(f"{sys.argv[2]} {v}: {len(f['flags'])} flags, {len(f['spec_methods'])} speculative methods")
