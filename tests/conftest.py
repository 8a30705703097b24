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


def pytest_collection_modifyitems(config, items):
    """The sandbox tests share the machine's sandbox hosts (one fleet at a time): under pytest-xdist
    (`-n 2 --dist loadgroup`, as .ci/run runs) they all go to one worker, in order, while the other worker
    runs the rest."""
    for item in items:
        if item.get_closest_marker("sandbox"):
            item.add_marker(pytest.mark.xdist_group("sandbox"))
