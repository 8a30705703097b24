from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def example_inv(tmp_path) -> Path:
    """A copy of inventory/example that a test may edit."""
    dst = tmp_path / "inventory" / "example"
    shutil.copytree(REPO / "inventory" / "example", dst)
    # keep {{ inventory_dir }}/../../examples working
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return dst


def pytest_terminal_summary(terminalreporter):
    """The generative robustness suite's case count, shown whatever -s/-q say (CI reads it from the log)."""
    import sys
    rc = sys.modules.get("robust_cases")
    if rc is not None and rc.COUNTS:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(rc.COUNTS.items()))
        terminalreporter.write_line(f"robustness: {sum(rc.COUNTS.values())} cases run ({parts})")
