"""Fetch the real upstream engine sources (vLLM sdist, SGLang wheel) for contract tests and patching.

Files are cached under ``~/.cache/specdeploy/upstream`` (``SPECDEPLOY_CACHE`` overrides the root) and
verified against the sha256 the package index publishes. ``pip download`` cannot fetch the vLLM sdist
(its metadata build needs torch), so we read the index's simple page (PEP 691 JSON) ourselves.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import urllib.request
import zipfile
from pathlib import Path

DEFAULT_INDEX = "https://pypi.org/simple"


class UpstreamError(RuntimeError):
    pass


def cache_root() -> Path:
    root = os.environ.get("SPECDEPLOY_CACHE") or os.path.join(Path.home(), ".cache", "specdeploy")
    return Path(root) / "upstream"


def index_url() -> str:
    """The index pip is configured with (PIP_INDEX_URL, pip config), else PyPI."""
    env = os.environ.get("PIP_INDEX_URL")
    if env:
        return env.rstrip("/")
    try:
        out = subprocess.run(["pip", "config", "get", "global.index-url"], capture_output=True,
                             text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().rstrip("/")
    except (OSError, subprocess.SubprocessError):
        pass
    return DEFAULT_INDEX


def _project_files(project: str) -> list[dict]:
    url = f"{index_url()}/{project}/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        data = json.load(resp)
    return data.get("files", [])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(project: str, filename_predicate, label: str) -> Path:
    """Download the first index file matching ``filename_predicate`` into the cache; verify sha256."""
    dest_dir = cache_root() / "dist"
    dest_dir.mkdir(parents=True, exist_ok=True)
    files = [f for f in _project_files(project) if filename_predicate(f["filename"])]
    if not files:
        raise UpstreamError(f"{label}: no matching file on {index_url()}/{project}/")
    entry = files[0]
    want = entry.get("hashes", {}).get("sha256")
    if not want:
        raise UpstreamError(f"{label}: index gives no sha256 for {entry['filename']}")
    dest = dest_dir / entry["filename"]
    if dest.exists() and _sha256(dest) == want:
        return dest
    tmp = dest.with_suffix(dest.suffix + ".part")
    with urllib.request.urlopen(entry["url"], timeout=600) as resp, open(tmp, "wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    got = _sha256(tmp)
    if got != want:
        tmp.unlink()
        raise UpstreamError(f"{label}: sha256 mismatch for {entry['filename']}: {got} != {want}")
    tmp.replace(dest)
    return dest


def vllm_source(version: str) -> Path:
    """Unpacked vLLM source release; the returned directory contains ``vllm/``."""
    out = cache_root() / "src" / f"vllm-{version}"
    if (out / "vllm" / "__init__.py").exists():
        return out
    sdist = fetch("vllm", lambda n: n == f"vllm-{version}.tar.gz", f"vllm {version} sdist")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.split("/", 2)[1:2] == ["vllm"] and (m.isfile() or m.isdir())
                   and m.name.endswith((".py", "/")) or m.isdir()]
        tar.extractall(tmp, members=members, filter="data")
    top = next(tmp.iterdir())
    shutil.rmtree(out, ignore_errors=True)
    top.rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def sglang_source(version: str) -> Path:
    """Unpacked SGLang wheel; the returned directory contains ``sglang/``."""
    out = cache_root() / "src" / f"sglang-{version}"
    if (out / "sglang" / "__init__.py").exists():
        return out
    wheel = fetch("sglang", lambda n: n.startswith(f"sglang-{version}-") and n.endswith(".whl"),
                  f"sglang {version} wheel")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp, members=[n for n in zf.namelist() if n.startswith("sglang/") and n.endswith(".py")])
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
