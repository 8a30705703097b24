"""A wheelhouse of specdeploy and the few packages its host-side commands need (exporter, drafter check and
convert, simulator, triage), built on the controller and installed offline on hosts."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

HOST_REQUIREMENTS = ["typer>=0.12", "rich>=13", "prometheus-client>=0.20", "pyyaml>=6", "jinja2>=3.1",
                     "pydantic>=2.6", "requests>=2.31"]
REPO = Path(__file__).resolve().parents[2]


def source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(list((REPO / "src").rglob("*.py")) + list((REPO / "templates").rglob("*")) +
                    [REPO / "pyproject.toml"]):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(REPO)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(out: Path) -> str:
    """Build (or reuse) the wheelhouse; returns its stamp (source hash)."""
    stamp = source_hash()
    marker = out / "STAMP"
    if marker.is_file() and marker.read_text().strip() == stamp:
        return stamp
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("specdeploy-*.whl"):
        old.unlink()
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "-w", str(out), str(REPO)], check=True)
    subprocess.run(pip + ["download", "-d", str(out), "--only-binary=:all:"] + HOST_REQUIREMENTS, check=True)
    (out / "requirements-host.txt").write_text("\n".join(HOST_REQUIREMENTS) + "\n")
    marker.write_text(stamp + "\n")
    return stamp
