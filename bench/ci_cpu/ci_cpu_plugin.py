"""pytest plugin for bench/ci_cpu.py: each test's start and end (setup to teardown), its xdist worker's pid, appended
as one JSON line per test to the file named by $SPECDEPLOY_CI_CPU_TIMES (nothing is written when it is unset)."""
from __future__ import annotations

import json
import os
import time

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0 = time.time()
    yield
    path = os.environ.get("SPECDEPLOY_CI_CPU_TIMES")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "pid": os.getpid(),
                                 "id": item.nodeid, "t0": t0, "t1": time.time()}) + "\n")
