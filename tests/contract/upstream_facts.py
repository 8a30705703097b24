"""Static facts read from real upstream sources: flags, speculative-config keys, metric names."""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path


def _class_fields(path: Path, class_pred) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and class_pred(node.name):
            out |= {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return out


def _dash_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"--[a-z0-9-]+", n.value)}


@lru_cache(maxsize=None)
def vllm_flags(root: Path) -> frozenset[str]:
    """Flags of `vllm serve`: EngineArgs and the frontend *Args dataclasses become --kebab-case flags;
    explicit add_argument names are added as written."""
    vl = root / "vllm"
    files = [vl / "engine" / "arg_utils.py"] + list((vl / "entrypoints").rglob("cli_args.py"))
    flags: set[str] = set()
    for f in files:
        for name in _class_fields(f, lambda n: n.endswith("Args")):
            flags.add("--" + name.replace("_", "-"))
        flags |= _dash_literals(f)
    return frozenset(flags)


@lru_cache(maxsize=None)
def vllm_spec_keys(root: Path) -> frozenset[str]:
    return frozenset(_class_fields(root / "vllm" / "config" / "speculative.py", lambda n: n == "SpeculativeConfig"))


def _string_literals(root: Path, prefix: str) -> set[str]:
    out = set()
    for f in root.rglob("*.py"):
        text = f.read_text(errors="replace")
        if prefix not in text:
            continue
        out |= set(re.findall(r"[\"'](" + re.escape(prefix) + r"[a-z0-9_]+)[\"']", text))
    return out


@lru_cache(maxsize=None)
def vllm_metric_names(root: Path) -> frozenset[str]:
    return frozenset(_string_literals(root / "vllm" / "v1", "vllm:"))


@lru_cache(maxsize=None)
def sglang_flags(root: Path) -> frozenset[str]:
    srt = root / "sglang" / "srt"
    flags: set[str] = set()
    files = list((srt / "arg_groups").rglob("*.py")) + [srt / "server_args.py"]
    for f in files:
        if not f.exists():
            continue
        for name in _class_fields(f, lambda n: True):
            flags.add("--" + name.replace("_", "-"))
        flags |= _dash_literals(f)
    return frozenset(flags)


@lru_cache(maxsize=None)
def sglang_metric_names(root: Path) -> frozenset[str]:
    return frozenset(_string_literals(root / "sglang" / "srt", "sglang:"))


def exposed(name: str, defined: frozenset[str]) -> bool:
    """prometheus_client exposes a counter `x` as `x_total`; histograms keep their name."""
    return name in defined or (name.endswith("_total") and name[:-6] in defined)


@lru_cache(maxsize=None)
def vllm_load_formats(root: Path) -> frozenset[str]:
    """Keys of the model loader registry (the --load-format choices) in vllm/model_executor/model_loader."""
    tree = ast.parse((root / "vllm/model_executor/model_loader/__init__.py").read_text())
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "_LOAD_FORMAT_TO_MODEL_LOADER" \
                and isinstance(node.value, ast.Dict):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise AssertionError(f"{root}: no _LOAD_FORMAT_TO_MODEL_LOADER table")


@lru_cache(maxsize=None)
def sglang_load_formats(root: Path) -> frozenset[str]:
    """Values of the LoadFormat enum in sglang/srt/configs/load_config.py."""
    tree = ast.parse((root / "sglang/srt/configs/load_config.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "LoadFormat":
            return frozenset(s.value.value for s in node.body if isinstance(s, ast.Assign)
                             and isinstance(s.value, ast.Constant))
    raise AssertionError(f"{root}: no LoadFormat enum")
