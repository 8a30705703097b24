"""Reading facts out of an engine's Python sources with ``ast`` (never importing them): class fields, flag
literals, string constants. The adapters' ``facts_from_source`` use these."""
from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path


def class_fields(path: Path, class_pred) -> set[str]:
    """Annotated field names of the classes whose name satisfies ``class_pred``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and class_pred(node.name):
            out |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return out


def flag_literals(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"--[a-z0-9-]+", n.value)}


def strings(node) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


# One model file's summary per content: successive releases share most model files, and the contract tests read
# every release's models directory in one process. Keyed by the file's bytes (a digest), bounded in entries.
# A summary is shared by every caller that reads that content: callers read it and never change it.
_SUMMARIES: dict[bytes, tuple[dict, dict] | None] = {}
MAX_SUMMARIES = 8192


def _summary(data: bytes) -> tuple[dict, dict] | None:
    """(class name -> (base names, method names, class attribute names), EntryClass name -> True) of one model
    file's top level; None when it does not parse."""
    key = hashlib.blake2b(data, digest_size=20).digest()
    if key in _SUMMARIES:
        return _SUMMARIES[key]
    try:
        tree = ast.parse(data.decode(errors="replace"))
    except SyntaxError:
        out = None
    else:
        classes, entries = {}, {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                methods = {s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
                attrs = {t.id for s in node.body if isinstance(s, ast.Assign) for t in s.targets
                         if isinstance(t, ast.Name)}
                attrs |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name)}
                classes[node.name] = (bases, methods, attrs)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                      for t in node.targets):
                vals = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                entries.update({v.id: True for v in vals if isinstance(v, ast.Name)})
        out = (classes, entries)
    if len(_SUMMARIES) >= MAX_SUMMARIES:
        _SUMMARIES.clear()
    _SUMMARIES[key] = out
    return out


def _modules(models_dir: Path):
    """(file, its summary) for every model file that parses."""
    for f in sorted(models_dir.glob("*.py")):
        summary = _summary(f.read_bytes())
        if summary is not None:
            yield f, summary


def model_classes(models_dir: Path) -> dict[str, dict[str, tuple[list[str], set[str], set[str]]]]:
    """module name -> class name -> (base names, method names, class attribute names) for every model file."""
    return {f.stem: classes for f, (classes, _) in _modules(models_dir)}


def implementers(classes: dict, module: str, cls: str, has) -> bool:
    """Whether ``module.cls`` or a base class it inherits (resolved in its own module first, then by name in any
    model module) satisfies ``has(name, (bases, methods, attrs))``."""
    seen: set[tuple[str, str]] = set()
    todo = [(module, cls)]
    while todo:
        mod, name = todo.pop()
        if (mod, name) in seen:
            continue
        seen.add((mod, name))
        entry = classes.get(mod, {}).get(name)
        if entry is None:
            homes = [m for m, cs in classes.items() if name in cs]
            if not homes:
                continue
            mod, entry = homes[0], classes[homes[0]][name]
        if has(name, entry):
            return True
        todo += [(mod, b) for b in entry[0] if b]
    return False


def entry_classes(models_dir: Path) -> dict[str, str]:
    """Architecture name -> module for SGLang-style ``EntryClass = X`` / ``EntryClass = [X, Y]``."""
    out = {}
    for f, (_, entries) in _modules(models_dir):
        out.update({name: f.stem for name in entries})
    return out


def registry_archs(registry: Path) -> dict[str, tuple[str, str]]:
    """vLLM's model registry: architecture -> (module, class), from the dict literals of registry.py."""
    out = {}
    for node in ast.walk(ast.parse(registry.read_text())):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Tuple) \
                        and len(v.elts) == 2 and all(isinstance(e, ast.Constant) for e in v.elts):
                    out.setdefault(k.value, (v.elts[0].value, v.elts[1].value))
    return out
