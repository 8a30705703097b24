"""bench/ci_cpu.py: a test is charged with its worker's tree and its own fleet's hosts in its window, never with the
other fleet's; the sampler's snapshot finds this process's tree."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from helpers import bench_module


def _sample(t, busy, trees, services=None):
    return {"t": t, "busy": busy, "trees": trees, "services": services or {}}


def test_a_sandbox_test_is_charged_with_its_worker_and_its_own_fleet_only():
    m = bench_module("ci_cpu")
    hz = m.HZ
    samples = [
        _sample(0, 0, {"gw1": 0, "gw2": 0, "host:sdhost1": 0, "host:sdhost5": 0}, {"sdhost1|sshd": 0}),
        _sample(10, 20 * hz, {"gw1": 3 * hz, "gw2": 5 * hz, "host:sdhost1": 4 * hz, "host:sdhost5": 7 * hz},
                {"sdhost1|sshd": 4 * hz}),
        _sample(20, 40 * hz, {"gw1": 4 * hz, "gw2": 9 * hz, "host:sdhost1": 6 * hz, "host:sdhost5": 8 * hz},
                {"sdhost1|sshd": 1 * hz}),  # the service restarted: its drop is not counted
    ]
    tests = [{"pid": 1, "id": "tests/e2e/t.py::a@sandbox", "t0": 0, "t1": 10},
             {"pid": 2, "id": "tests/e2e/t.py::b@sandbox-b", "t0": 0, "t1": 20},
             {"pid": 1, "id": "tests/unit/t.py::c", "t0": 10, "t1": 20}]
    rep = m.report(samples, tests, top=10)
    rows = {r["id"].split("::")[1]: r for r in rep["tests"]}
    assert (rows["a@sandbox"]["worker_s"], rows["a@sandbox"]["hosts_s"]) == (3, 4)  # sdhost1 only: fleet a
    assert (rows["b@sandbox-b"]["worker_s"], rows["b@sandbox-b"]["hosts_s"]) == (9, 8)  # sdhost5 only: fleet b
    assert (rows["c"]["worker_s"], rows["c"]["hosts_s"]) == (1, 0) and rows["c"]["group"] == "rest"
    assert [r["id"] for r in rep["tests"]][0].endswith("b@sandbox-b")  # the costliest first
    assert rep["busy_s"] == 40 and rep["groups_s"] == {"sandbox-b": 17, "sandbox": 7, "rest": 1}
    assert rep["host_services_s"] == {"sshd": 4}


def test_the_snapshot_finds_a_worker_started_as_xdist_starts_it():
    m = bench_module("ci_cpu")
    # a process started the way pytest-xdist starts a worker, with a busy child (its tree)
    w = subprocess.Popen([sys.executable, "-c", "import sys;exec(eval(sys.stdin.readline()))"], stdin=subprocess.PIPE,
                         start_new_session=True)
    try:
        w.stdin.write(b"'import subprocess, sys; subprocess.run([sys.executable, \"-c\", \"while 1: pass\"])'\n")
        w.stdin.flush()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            s = m.snapshot()
            if s["trees"].get(f"gw{w.pid}", 0) >= m.HZ // 4:
                break
            time.sleep(0.2)
        assert s["trees"].get(f"gw{w.pid}", 0) >= m.HZ // 4, s["trees"]
        assert s["busy"] > 0 and all(k.startswith(("gw", "host:")) for k in s["trees"])
    finally:
        os.killpg(w.pid, signal.SIGKILL)
        w.wait()


def test_missing_inputs_are_a_clean_error(tmp_path, capsys):
    m = bench_module("ci_cpu")
    assert m.main(["report", str(tmp_path / "none.jsonl"), str(tmp_path / "none2.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
