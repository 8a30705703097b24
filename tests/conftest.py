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
