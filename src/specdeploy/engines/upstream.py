"""Fetch the real upstream engine sources (an sdist or a wheel, as the engine's adapter says: vLLM sdists,
SGLang wheels) for contract tests, patching and the sandbox's stand-in images.

Files are cached under ``~/.cache/specdeploy/upstream`` (``SPECDEPLOY_CACHE`` overrides the root) and
verified against the sha256 the package index publishes. ``pip download`` cannot fetch the vLLM sdist
(its metadata build needs torch), so we read the index's simple page (PEP 691 JSON) ourselves.
"""
from __future__ import annotations

import contextlib
import fcntl
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


def wheel_rank(filename: str) -> tuple[int, int] | None:
    """How well a wheel fits the machines specdeploy reads sources for (Linux x86_64, Python 3): lower is better;
    None for a wheel built for another platform or Python (its sources may differ, e.g. aarch64 kernels)."""
    if not filename.endswith(".whl"):
        return (0, 0)  # an sdist is the same on every platform
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return None
    py, plat = parts[-3], parts[-1]
    plats = plat.split(".")
    if "any" in plats:
        p_rank = 0
    elif any(x.startswith(("manylinux", "linux")) and x.endswith("x86_64") for x in plats):
        p_rank = 1
    else:
        return None
    pys = py.split(".")
    if "py3" in pys:
        return (p_rank, 0)
    if any(x.startswith("cp3") for x in pys):
        return (p_rank, 1)
    return None


def choose(files: list[dict]) -> dict | None:
    """The index entry (``{"filename": ...}``) that fits Linux x86_64 / Python 3 best, or None."""
    ranked = sorted((r, f["filename"], i) for i, f in enumerate(files) if (r := wheel_rank(f["filename"])) is not None)
    return files[ranked[0][2]] if ranked else None


def fetch(project: str, filename_predicate, label: str) -> Path:
    """Download the index file matching ``filename_predicate`` that fits Linux x86_64 / Python 3 best (a
    pure-Python wheel before an x86_64 one; never another platform's) into the cache; verify sha256."""
    dest_dir = cache_root() / "dist"
    dest_dir.mkdir(parents=True, exist_ok=True)
    files = [f for f in _project_files(project) if filename_predicate(f["filename"])]
    entry = choose(files)
    if entry is None:
        found = f" (only {', '.join(f['filename'] for f in files)})" if files else ""
        raise UpstreamError(f"{label}: no matching file for Linux x86_64 / Python 3 on {index_url()}/{project}/{found}")
    want = entry.get("hashes", {}).get("sha256")
    if not want:
        raise UpstreamError(f"{label}: index gives no sha256 for {entry['filename']}")
    dest = dest_dir / entry["filename"]
    if dest.exists() and _sha256(dest) == want:
        return dest
    tmp = dest.with_suffix(f"{dest.suffix}.{os.getpid()}.part")  # one per process: workers share the cache
    with urllib.request.urlopen(entry["url"], timeout=600) as resp, open(tmp, "wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    got = _sha256(tmp)
    if got != want:
        tmp.unlink()
        raise UpstreamError(f"{label}: sha256 mismatch for {entry['filename']}: {got} != {want}")
    tmp.replace(dest)
    return dest


@contextlib.contextmanager
def _locked(name: str):
    """One process at a time fetches or unpacks ``name`` (test workers share the cache); the others wait, then
    find it done."""
    d = cache_root() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def source(engine: str, version: str) -> Path:
    """The engine release's unpacked Python sources; the returned directory contains the ``<engine>/`` package."""
    from specdeploy.engines import get
    kind = get(engine).source_release
    return sdist_source(engine, version) if kind == "sdist" else wheel_source(engine, version)


def sdist_source(project: str, version: str) -> Path:
    """Unpacked source release of a project whose package is named like the project (the .py files)."""
    out = cache_root() / "src" / f"{project}-{version}"
    if (out / project / "__init__.py").exists():
        return out
    with _locked(f"{project}-{version}"):
        if (out / project / "__init__.py").exists():
            return out
        return _unpack_sdist(project, version, out)


def _unpack_sdist(project: str, version: str, out: Path) -> Path:
    sdist = fetch(project, lambda n: n == f"{project}-{version}.tar.gz", f"{project} {version} sdist")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.split("/", 2)[1:2] == [project] and (m.isfile() or m.isdir())
                   and m.name.endswith((".py", "/")) or m.isdir()]
        tar.extractall(tmp, members=members, filter="data")
    top = next(tmp.iterdir())
    shutil.rmtree(out, ignore_errors=True)
    top.rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def wheel_source(project: str, version: str) -> Path:
    """Unpacked wheel (its .py files) of a project whose package is named like the project."""
    out = cache_root() / "src" / f"{project}-{version}"
    stamp = out / ".specdeploy-artifact"  # the wheel it was unpacked from: an older cache may hold another platform's
    def done():
        return (out / project / "__init__.py").exists() and stamp.is_file() and wheel_rank(stamp.read_text().strip())
    if done():
        return out
    with _locked(f"{project}-{version}"):
        if done():
            return out
        return _unpack_wheel(project, version, out, stamp)


def _unpack_wheel(project: str, version: str, out: Path, stamp: Path) -> Path:
    wheel = fetch(project, lambda n: n.startswith(f"{project}-{version}-") and n.endswith(".whl"),
                  f"{project} {version} wheel")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp, members=[n for n in zf.namelist() if n.startswith(f"{project}/") and n.endswith(".py")])
    (tmp / stamp.name).write_text(wheel.name + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
