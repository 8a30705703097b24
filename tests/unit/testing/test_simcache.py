"""The simulator's weight-cache daemon and the attach (testing/simcache.py), played from the command lines the
plan renders: the daemon refuses what the release refuses, serves a socket per local rank and its health; an
attached engine maps the weights (no weight shards in its log), fails fast on a mismatch or a missing daemon with
the release's exception (which triage names), vLLM's drafter goes to a draft group unless it loads with the
engine, and SGLang's engine kills itself when its daemon dies."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import MODEL, free_port
from specdeploy.testing.fixtures import write_model
from specdeploy.triage import triage_lines

FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _reap():
    """Every simulated process a test started is gone after it, however the test ended."""
    yield
    while STARTED:
        p = STARTED.pop()
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=10)


def sim(engine, version, argv, env, **kw):
    p = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", engine, "--version",
                          version, "--", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, **kw)
    STARTED.append(p)
    return p


def run(engine, version, argv, env, timeout=60):
    p = sim(engine, version, argv, env)
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out


@pytest.fixture
def ckpt(tmp_path):
    cfg = json.loads((MODEL / "config.json").read_text())
    int4 = write_model(tmp_path / "int4", cfg, random_bytes=1 << 16, hole_bytes=1 << 20)
    cfg["text_config"]["quantization_config"] = FP8
    fp8 = write_model(tmp_path / "fp8", cfg, random_bytes=1 << 16, hole_bytes=1 << 20)
    # other weights of the same layout (same tensor names, shapes, dtypes: the same safetensors headers), and another
    # layout (two shards)
    same = write_model(tmp_path / "fp8same", cfg, random_bytes=1 << 16, hole_bytes=1 << 20, seed=1)
    other = write_model(tmp_path / "fp8b", cfg, shards=2, random_bytes=1 << 16, hole_bytes=1 << 20)
    # sockets under a short path: an AF_UNIX path holds at most 107 bytes (pytest's tmp paths are long)
    short = Path(tempfile.mkdtemp(prefix="wc", dir="/tmp"))
    yield {"int4": str(int4), "fp8": str(fp8), "other": str(other), "same": str(same), "tmp": short}
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def env(ckpt):
    e = dict(os.environ, SPECDEPLOY_SIM_LOAD_SECONDS="1", SPECDEPLOY_SIM_STEP_MS="1")
    e["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"] = f"{ckpt['tmp']}/sg/{{device_uuid}}.sock"
    e["SGLANG_WEIGHT_CACHE_READY_TEMPLATE"] = f"{ckpt['tmp']}/sg/{{device_uuid}}.ready"
    return e


def _wait(url, t=30):
    end = time.time() + t
    while time.time() < end:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(url)


def _vllm_daemon(ckpt, env, model="fp8"):
    hp = free_port()
    d = sim("vllm", "0.32.0", ["vllm", "preload", "--model", ckpt[model], "--tensor-parallel-size", "2",
                               "--weight-cache-socket-dir", str(ckpt["tmp"] / "s"), "--weight-cache-master-port",
                               "29600", "--weight-cache-health-port", str(hp), "--weight-cache-health-host",
                               "127.0.0.1"], env)
    _wait(f"http://127.0.0.1:{hp}/health")
    return d


def _vllm_engine(ckpt, model="fp8", tp=2, extra=(), spec=None):
    cfg = json.dumps({"fallback": False, "socket_dir": str(ckpt["tmp"] / "s"), "state_timeout_s": 2})
    argv = ["vllm", "serve", ckpt[model], "--host", "127.0.0.1", "--port", str(free_port()),
            "--tensor-parallel-size", str(tp), "--load-format", "ipc_cache", "--model-loader-extra-config", cfg,
            *extra]
    if spec:
        argv += ["--speculative-config", json.dumps(spec)]
    return argv


def test_vllm_daemon_refuses_kimi_int4_before_it_loads(ckpt, env):
    rc, out = run("vllm", "0.32.0", ["vllm", "preload", "--model", ckpt["int4"], "--tensor-parallel-size", "2",
                                     "--weight-cache-socket-dir", str(ckpt["tmp"] / "s")], env)
    assert rc == 1 and "UnsupportedQuantForIPCError" in out and "CompressedTensorsWNA16MoEMethod" in out
    assert "Loading safetensors" not in out
    t = triage_lines(out.splitlines())
    assert t.signature == "weight-cache-quantization"


def test_vllm_engine_attaches_fails_fast_on_a_mismatch_and_its_drafter_needs_draft_load_config(ckpt, env):
    d = _vllm_daemon(ckpt, env)
    try:
        e = sim("vllm", "0.32.0", _vllm_engine(ckpt), env)
        time.sleep(4)
        e.send_signal(signal.SIGTERM)
        out, _ = e.communicate(timeout=20)
        assert out.count("Mapped 1283 tensors from the weight cache daemon") == 2, out
        assert "Loading safetensors checkpoint shards" not in out and "Application startup complete" in out
        # vLLM keys a checkpoint by its safetensors headers: other weights of the same layout attach to the daemon's
        # (old) weights without a word, which is why a deploy restarts the daemon whenever the weights change
        same = sim("vllm", "0.32.0", _vllm_engine(ckpt, "same"), env)
        time.sleep(4)
        same.send_signal(signal.SIGTERM)
        out, _ = same.communicate(timeout=20)
        assert out.count("Mapped 1283 tensors from the weight cache daemon") == 2, out
        for model, tp, field in (("other", 2, "checkpoint"), ("fp8", 4, "tp_size")):
            t0 = time.time()
            rc, out = run("vllm", "0.32.0", _vllm_engine(ckpt, model, tp), env)
            assert rc == 1 and f"WeightCacheKey mismatch on fields: ['{field}'" in out, out
            assert time.time() - t0 < 20
            assert triage_lines(out.splitlines()).signature == "weight-cache-mismatch"
        spec = {"method": "eagle3", "model": ckpt["fp8"], "num_speculative_tokens": 3}
        rc, out = run("vllm", "0.32.0", _vllm_engine(ckpt, spec=spec), env)
        assert rc == 1 and "_draft.sock is unavailable" in out  # the draft group no daemon serves
        ok = sim("vllm", "0.32.0", _vllm_engine(ckpt, spec={**spec, "draft_load_config": {"load_format": "auto"}}),
                 env)
        time.sleep(4)
        ok.send_signal(signal.SIGTERM)
        out, _ = ok.communicate(timeout=20)
        assert "Mapped 1283 tensors" in out and "_draft" not in out, out
    finally:
        d.send_signal(signal.SIGTERM)
        d.communicate(timeout=20)
    # no daemon: the engine waits its state_timeout_s, then fails with the release's exception, which triage names
    rc, out = run("vllm", "0.32.0", _vllm_engine(ckpt), env)
    assert rc == 1 and "WeightCacheUnavailableError: Weight cache daemon did not become ready within 2.0s" in out
    assert triage_lines(out.splitlines()).signature == "weight-cache-daemon-missing"


def test_sglang_client_watches_its_daemon_and_falls_back_only_without_a_socket(ckpt, env):
    rc, out = run("sglang", "0.5.23", ["python", "-m", "sglang.launch_server", "--model-path", ckpt["fp8"],
                                       "--tp-size", "2", "--weight-cache-mode", "client", "--speculative-algorithm",
                                       "EAGLE3", "--speculative-draft-model-path", ckpt["fp8"]], env)
    assert rc == 1 and "not supported together with speculative decoding" in out
    engine = ["python", "-m", "sglang.launch_server", "--model-path", ckpt["fp8"], "--host", "127.0.0.1",
              "--tp-size", "2", "--weight-cache-mode", "client", "--enable-metrics"]
    # no daemon: the release's own fall back to a disk load (its socket file is absent)
    e = sim("sglang", "0.5.23", engine + ["--port", str(free_port())], env)
    time.sleep(3)
    e.send_signal(signal.SIGTERM)
    out, _ = e.communicate(timeout=20)
    assert "falling back to disk load" in out and "Loading safetensors checkpoint shards" in out
    d = sim("sglang", "0.5.23", ["python", "-m", "sglang.srt.weight_cache.daemon", "--model-path", ckpt["fp8"],
                                 "--tp-size", "2", "--dist-init-method", "tcp://127.0.0.1:29600"], env)
    from specdeploy.engines.weightcache import health
    end = time.time() + 30
    while not health(f"files:{ckpt['tmp']}/sg/*.ready:2")[0] and time.time() < end:
        time.sleep(0.2)
    port = free_port()
    e = sim("sglang", "0.5.23", engine + ["--port", str(port)], env)
    try:
        _wait(f"http://127.0.0.1:{port}/health_generate")
    finally:
        d.kill()  # the daemon dies while the engine maps its weights
        d.communicate(timeout=10)
    out, _ = e.communicate(timeout=30)
    assert e.returncode == -signal.SIGKILL and "Loaded model via IPC (mode=client)" in out
    t = triage_lines(out.splitlines())
    assert t.signature == "weight-cache-daemon-died", (t.root_cause, out[-2000:])
