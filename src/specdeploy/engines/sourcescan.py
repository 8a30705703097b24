"""Reading facts out of an engine's Python sources with ``ast`` (never importing them): class fields, flag
literals, string constants. The adapters' ``facts_from_source`` use these."""
from __future__ import annotations

import ast
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
