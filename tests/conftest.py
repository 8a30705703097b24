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
    """The sandbox tests share a fleet of sandbox hosts per module: under pytest-xdist (`-n 3 --dist loadgroup`,
    as .ci/run runs) each fleet's tests go to one worker, in order, while another worker runs the other fleet and
    the third the rest. The real-engine tests form a group of their own, so no two of them load an engine at
    once."""
    for item in items:
        mark = item.get_closest_marker("sandbox")
        if mark:  # each fleet (helpers.FLEETS) its own hosts and state: the two run side by side
            fleet = mark.kwargs.get("fleet", "a")
            item.add_marker(pytest.mark.xdist_group("sandbox" if fleet == "a" else f"sandbox-{fleet}"))
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
