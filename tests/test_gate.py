"""The gate against the engine simulator: good acceptance with a cheap draft is kept, poor acceptance with an
expensive draft is disabled; the report and chart are written."""
import json
import subprocess
import sys

import pytest

from helpers import free_port, start_sim, stop


@pytest.fixture(scope="module")
def engines():
    ports = {name: free_port() for name in ("base", "good", "poor")}
    base = _start_plain(ports["base"])
    good = start_sim("vllm", "127.0.0.1", ports["good"], {"SPECDEPLOY_SIM_ACCEPTANCE": "0.8",
                                                           "SPECDEPLOY_SIM_SPEC_STEP_RATIO": "1.3",
                                                           "SPECDEPLOY_SIM_STEP_MS": "4"})
    poor = start_sim("vllm", "127.0.0.1", ports["poor"], {"SPECDEPLOY_SIM_ACCEPTANCE": "0.15",
                                                           "SPECDEPLOY_SIM_SPEC_STEP_RATIO": "2.2",
                                                           "SPECDEPLOY_SIM_STEP_MS": "4"})
    yield ports
    stop(base, good, poor)


def _start_plain(port):
    import os
    from helpers import MODEL, wait_http
    env = dict(os.environ, SPECDEPLOY_SIM_LOAD_SECONDS="0", SPECDEPLOY_SIM_STEP_MS="4")
    p = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", "vllm", "--version",
                          "0.16.0", "--", "vllm", "serve", str(MODEL), "--served-model-name", "kimi", "--host",
                          "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/health")
    return p


def _gate(port, out, *extra):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", f"http://127.0.0.1:{port}",
                        "--concurrency", "1,4", "--max-tokens", "48", "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "report.json").read_text())


def test_gate_keeps_good_and_disables_poor(engines, tmp_path):
    base = _gate(engines["base"], tmp_path / "base")
    assert base["speculation"] is False and base["verdict"] is None
    good = _gate(engines["good"], tmp_path / "good", "--baseline", str(tmp_path / "base/report.json"))
    poor = _gate(engines["poor"], tmp_path / "poor", "--baseline", str(tmp_path / "base/report.json"))
    assert good["verdict"] == "keep" and poor["verdict"] == "disable"
    for lv in good["levels"]:
        assert lv["speedup"] > 1.5 and lv["acceptance_length"] > 2.4 and len(lv["per_position"]) == 3
        assert lv["per_position"][0] >= lv["per_position"][2]
        assert lv["itl_ms"] > 0 and lv["errors"] == 0
    for lv in poor["levels"]:
        assert lv["speedup"] < 1 and lv["acceptance_length"] < 1.4
        assert lv["breakeven_al"] > lv["acceptance_length"]  # AL below the step-time ratio: no pay-off
    png = (tmp_path / "poor/report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000


def test_gate_bad_input_is_a_clean_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", "http://127.0.0.1:9",
                        "--concurrency", "1,x"], capture_output=True, text=True)
    assert r.returncode == 2 and "--concurrency" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", "http://127.0.0.1:9",
                        "--baseline", str(tmp_path / "nope.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "does not exist" in r.stderr
