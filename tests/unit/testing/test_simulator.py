"""The engine simulator behaves as the engines do wherever specdeploy depends on it: the command line checked
against the real releases' flags and speculative methods, the HTTP port closed during the load, SGLang's
/metrics only with --enable-metrics, a dead engine that stays up but fails its health check."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from helpers import DRAFTER, MODEL, free_port, sim_argv, stop, wait_http
from specdeploy.testing import engine_facts
from specdeploy.engines import get_adapter
from specdeploy.testing.simulator import ArgError, parse_argv


def _vllm(cfg: dict, *extra: str) -> list[str]:
    return ["vllm", "serve", str(MODEL), "--speculative-config", json.dumps(cfg), *extra]


def test_speculative_config_values_are_checked():
    good = {"method": "eagle3", "model": str(DRAFTER), "num_speculative_tokens": 3}
    assert parse_argv("vllm", "0.16.0", _vllm(good))["spec"]["k"] == 3
    with pytest.raises(ArgError, match="literal_error.*input_value='bogus'"):
        parse_argv("vllm", "0.16.0", _vllm(dict(good, method="bogus")))
    with pytest.raises(ArgError, match="greater_than"):
        parse_argv("vllm", "0.16.0", _vllm(dict(good, num_speculative_tokens=0)))
    with pytest.raises(ValueError, match="Expecting property name"):
        parse_argv("vllm", "0.16.0", ["vllm", "serve", str(MODEL), "--speculative-config", "{method: eagle3"])
    sg = sim_argv("sglang", "127.0.0.1", 1)
    sg[sg.index("--speculative-algorithm") + 1] = "EAGLE4"
    with pytest.raises(ArgError, match="Unknown speculative algorithm name: EAGLE4"):
        parse_argv("sglang", "0.5.23", sg)
    with pytest.raises(ArgError, match="invalid int value: 'three'"):
        parse_argv("sglang", "0.5.23", sim_argv("sglang", "127.0.0.1", 1)[:-6] + ["--speculative-num-steps", "three"])


def test_flags_come_from_the_real_release_not_from_our_table():
    facts = engine_facts.recorded("vllm", "0.16.0")
    ours = get_adapter("vllm", "0.16.0")
    real_only = sorted(f for f in facts["flags"] if not ours.flag_exists(f) and f.startswith("--enable-"))
    assert real_only  # the release has switches specdeploy never renders...
    opts = parse_argv("vllm", "0.16.0", ["vllm", "serve", str(MODEL), real_only[0]])  # ...and they are accepted
    assert opts[real_only[0][2:].replace("-", "_")] is True
    with pytest.raises(ArgError, match="unrecognized arguments: --speculative-model"):  # removed in 0.16
        parse_argv("vllm", "0.16.0", ["vllm", "serve", str(MODEL), "--speculative-model", str(DRAFTER)])
    # a flag a later release added is refused by the earlier one, though specdeploy's table has neither
    sg10 = engine_facts.recorded("sglang", "0.5.10")["flags"]
    sg23 = engine_facts.recorded("sglang", "0.5.23")["flags"]
    newer = sorted(f for f in sg23 - sg10 if f.startswith("--enable-"))[0]
    base = sim_argv("sglang", "127.0.0.1", 1)
    assert parse_argv("sglang", "0.5.23", base + [newer])
    with pytest.raises(ArgError, match=f"unrecognized arguments: {newer}"):
        parse_argv("sglang", "0.5.10", base + [newer])


def _start(engine: str, port: int, argv: list[str], **env) -> subprocess.Popen:
    version = "0.16.0" if engine == "vllm" else "0.5.23"
    e = dict(os.environ, SPECDEPLOY_SIM_STEP_MS="2", **env)
    return subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", engine, "--version",
                             version, "--"] + argv, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_port_opens_only_once_loaded(engine):
    port = free_port()
    p = _start(engine, port, sim_argv(engine, "127.0.0.1", port), SPECDEPLOY_SIM_LOAD_SECONDS="3")
    try:
        time.sleep(1.2)
        assert p.poll() is None and not _port_open(port)  # loading: connection refused
        wait_http(f"http://127.0.0.1:{port}/health", timeout=15)
    finally:
        stop(p)


def test_sglang_metrics_need_enable_metrics():
    port = free_port()
    argv = [a for a in sim_argv("sglang", "127.0.0.1", port) if a != "--enable-metrics"]
    p = _start("sglang", port, argv, SPECDEPLOY_SIM_LOAD_SECONDS="0")
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert e.value.code == 404
    finally:
        stop(p)
    port = free_port()
    p = _start("sglang", port, sim_argv("sglang", "127.0.0.1", port), SPECDEPLOY_SIM_LOAD_SECONDS="0")
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop(p)


def test_a_dead_engine_stays_up_and_fails_its_health_check():
    port = free_port()
    p = _start("vllm", port, sim_argv("vllm", "127.0.0.1", port), SPECDEPLOY_SIM_LOAD_SECONDS="0",
               SPECDEPLOY_SIM_DIE_AFTER="1")
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        time.sleep(2.5)
        assert p.poll() is None  # the process stays; only its health says it is dead
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
        assert e.value.code == 503
    finally:
        stop(p)


def test_sigterm_stops_the_simulator_at_once():
    """docker stop sends SIGTERM to PID 1, which has no default handler: the simulator handles it itself."""
    port = free_port()
    p = _start("vllm", port, sim_argv("vllm", "127.0.0.1", port), SPECDEPLOY_SIM_LOAD_SECONDS="0")
    wait_http(f"http://127.0.0.1:{port}/health")
    t0 = time.monotonic()
    p.terminate()
    assert p.wait(5) == 0 and time.monotonic() - t0 < 3
