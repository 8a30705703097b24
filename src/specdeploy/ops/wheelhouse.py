"""A wheelhouse of specdeploy and the few packages its host-side commands need (exporter, drafter check and
convert, simulator, triage), built on the controller for the hosts' Python and platform, installed offline."""
from __future__ import annotations

import fcntl
import hashlib
import re
import subprocess
import sys
from pathlib import Path

HOST_REQUIREMENTS = ["typer>=0.12", "rich>=13", "prometheus-client>=0.20", "pyyaml>=6", "jinja2>=3.1",
                     "pydantic>=2.6", "safetensors>=0.4", "numpy>=1.24"]
# What an engine image adds to its own packages for specdeploy's patch and exporter commands (docker/*.Dockerfile
# installs these from the package index when the build host has one).
IMAGE_REQUIREMENTS = ["typer>=0.12", "rich>=13", "prometheus-client>=0.20"]
REPO = Path(__file__).resolve().parents[3]


class TargetError(ValueError):
    pass


def source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(list((REPO / "src").rglob("*.py")) + list((REPO / "templates").rglob("*")) +
                    [REPO / "pyproject.toml"]):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(REPO)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def target_args(target: str | None) -> list[str]:
    """``pip download`` arguments for a host described as ``PY_VERSION:MACHINE:GLIBC`` (e.g. ``3.11:x86_64:2.36``,
    what ``python3 -c 'import platform,sys; ...'`` reports on the host): binary wheels for that interpreter and
    every manylinux tag its glibc accepts. None: the controller's own interpreter."""
    if not target:
        return []
    m = re.fullmatch(r"(3)\.(\d+):([a-z0-9_]+):2\.(\d+)", target.strip())
    if not m:
        raise TargetError(f"wheelhouse target '{target}': expected PY_VERSION:MACHINE:GLIBC, e.g. 3.11:x86_64:2.36")
    major, minor, machine, glibc = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
    plats = [f"manylinux_2_{g}_{machine}" for g in range(glibc, 16, -1)] + [f"manylinux2014_{machine}",
                                                                           f"linux_{machine}"]
    args = ["--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}",
            "--abi", "abi3", "--abi", "none"]
    for p in plats:
        args += ["--platform", p]
    return args


def build(out: Path, target: str | None = None) -> str:
    """Build (or reuse) the wheelhouse; returns its stamp (source hash and target). ``out`` is written beside
    itself and renamed into place (:mod:`specdeploy.plan.outdir`): it must not exist or be a previous wheelhouse."""
    from specdeploy.plan.outdir import check_target
    extra = target_args(target)
    stamp = source_hash() + (f"-{target.strip()}" if target else "")
    marker = out / "STAMP"
    check_target(out, WHEELHOUSE_CMD, (), _previous)
    if marker.is_file() and marker.read_text().strip() == stamp:
        return stamp
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    # two deploys from one controller build it once: the second waits, then finds it built
    with open(out.absolute().parent / f".{out.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text().strip() == stamp:
            return stamp
        _build(out, extra, stamp)
    return stamp


def _build(out: Path, extra: list[str], stamp: str) -> None:
    from specdeploy.plan.outdir import atomic_output_dir
    with atomic_output_dir(out, WHEELHOUSE_CMD, (), _previous) as tmp:
        pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["wheel", "--no-deps", "-w", str(tmp), str(REPO)], check=True)
        subprocess.run(pip + ["download", "-d", str(tmp), "--only-binary=:all:", *extra] + HOST_REQUIREMENTS,
                       check=True)
        (tmp / "requirements-host.txt").write_text("\n".join(HOST_REQUIREMENTS) + "\n")
        (tmp / "requirements-image.txt").write_text("\n".join(IMAGE_REQUIREMENTS) + "\n")
        (tmp / "STAMP").write_text(stamp + "\n")


WHEELHOUSE_CMD = "wheelhouse"


def _previous(path: Path) -> bool:
    """A wheelhouse written before outputs were marked."""
    return (path / "STAMP").is_file() and (path / "requirements-host.txt").is_file()
