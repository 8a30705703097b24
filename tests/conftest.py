from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tests live in a tree that mirrors the packages (unit/<package>/, e2e/, contract/, repo/); they share the
# modules at this level (helpers, robust_cases, engines_fake, unitcheck).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group from the marks
def pytest_collection_modifyitems(config, items):
    """The sandbox tests share the machine's sandbox hosts (one fleet at a time): under pytest-xdist
    (`-n 2 --dist loadgroup`, as .ci/run runs) they all go to one worker, in order, while the other worker
    runs the rest. The real-engine tests form a group of their own, so no two real engines load at once."""
    for item in items:
        if item.get_closest_marker("sandbox"):
            item.add_marker(pytest.mark.xdist_group("sandbox"))
        elif item.get_closest_marker("realengine"):  # one real engine at a time, beside the sandbox fleet
            item.add_marker(pytest.mark.xdist_group("realengine"))


_WORKER_COUNTS: list[dict] = []


def _robust_counts() -> dict:
    import sys
    rc = sys.modules.get("robust_cases")
    return dict(rc.COUNTS) if rc is not None else {}


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the count to the controller
        session.config.workeroutput["robust_counts"] = _robust_counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _WORKER_COUNTS.append(getattr(node, "workeroutput", {}).get("robust_counts") or {})


def pytest_terminal_summary(terminalreporter):
    """The generative robustness suite's case count, shown whatever -s/-q say (CI reads it from the log), summed
    over the xdist workers."""
    counts: dict = {}
    for c in [_robust_counts(), *_WORKER_COUNTS]:
        for k, n in c.items():
            counts[k] = counts.get(k, 0) + n
    if counts:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        terminalreporter.write_line(f"robustness: {sum(counts.values())} cases run ({parts})")
