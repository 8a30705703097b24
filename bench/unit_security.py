"""`systemd-analyze security --offline=yes` exposure of every unit specdeploy renders (engine with the docker and
the venv runtime, exporter, router). Run from the repository root: ``PYTHONPATH=src python3 bench/unit_security.py``.
Prints one line per unit: its name and the overall exposure (0 is the most confined, 10 the least)."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from specdeploy.plan import render_host
from specdeploy.plan.render.systemd import render_router
from specdeploy.hostvars.schema import validate_host

BASE = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": "h200_nvl8",
        "specdeploy_model_path": "/models/m", "specdeploy_spec_enabled": True, "specdeploy_drafter_path": "/models/d"}


def units() -> dict[str, str]:
    out = {}
    for runtime in ("docker", "venv"):
        plan = render_host("h", validate_host("h", {**BASE, "specdeploy_runtime": runtime}))
        for path, text in plan.files.items():
            if path.endswith(".service"):
                name = Path(path).name
                out[f"{runtime}/{name}" if "exporter" not in name else name] = text
    out["specdeploy-router.service"] = render_router(["http://10.0.0.1:8000"], 30080, "/opt/specdeploy/venv")
    return out


def exposure(text: str, tmp: Path, name: str) -> str:
    f = tmp / Path(name).name
    f.write_text(text)
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(f)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+ \w+)", r.stdout + r.stderr)
    return m.group(1) if m else f"? ({(r.stderr or r.stdout).strip()[:200]})"


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        for name, text in units().items():
            print(f"{name:40s} {exposure(text, Path(d), name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
