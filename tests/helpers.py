"""Process helpers for tests that run the simulator, the exporter and Prometheus for real."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MODEL = REPO / "examples/models/kimi-k2.5-int4"
DRAFTER = REPO / "examples/models/kimi-k2.5-eagle3"


def bench_module(name: str):
    """A script under bench/ imported as a module (``bench/NAME.py``), for the tests of its arithmetic."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look their module up by name
    spec.loader.exec_module(mod)
    return mod


# The sandbox tests run as two fleets at once (conftest: one xdist group each, ``pytest.mark.sandbox(fleet=...)``):
# each fleet its own state directory and its own host numbers, so neither's up/down touches the other's hosts.
FLEETS = {"a": 1, "b": 5}  # fleet -> the number of its first host (sdhost1.., sdhost5..)


def fleet_state(fleet: str) -> Path:
    from specdeploy.testing.sandbox import configured_state
    base = configured_state()
    return base if fleet == "a" else base.with_name(f"{base.name}-{fleet}")


@contextlib.contextmanager
def sandbox_fleet(fleet: str):
    """Within: the sandbox module works on ``fleet``'s state directory; yields the fleet's first host number."""
    from specdeploy.testing import sandbox
    old = sandbox.STATE
    sandbox.STATE = fleet_state(fleet)
    try:
        yield FLEETS[fleet]
    finally:
        sandbox.STATE = old


def point_at_loopback(inv: Path) -> Path:
    """An inventory copy whose every host is 127.0.0.1: a command under test never reaches the example's
    addresses."""
    import yaml
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for group in hosts["all"]["children"].values():
        for h in (group.get("hosts") or {}).values():
            h["ansible_host"] = "127.0.0.1"
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def free_port(host="127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20, ok=(200,)) -> None:
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status in ok:
                    return
        except Exception as exc:  # noqa: BLE001
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready: {last}")


def sim_argv(engine: str, host: str, port: int, k: int = 3, served="kimi") -> list[str]:
    if engine == "vllm":
        return ["vllm", "serve", str(MODEL), "--served-model-name", served, "--host", host, "--port", str(port),
                "--speculative-config",
                f'{{"method":"eagle3","model":"{DRAFTER}","num_speculative_tokens":{k}}}']
    return ["python", "-m", "sglang.launch_server", "--model-path", str(MODEL), "--served-model-name", served,
            "--host", host, "--port", str(port), "--enable-metrics", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(DRAFTER), "--speculative-num-steps", str(k),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]


def start_sim(engine: str, host: str, port: int, env_extra: dict | None = None, k: int = 3) -> subprocess.Popen:
    version = "0.16.0" if engine == "vllm" else "0.5.23"
    env = dict(os.environ, SPECDEPLOY_SIM_LOAD_SECONDS="0", SPECDEPLOY_SIM_STEP_MS="2")
    env.update(env_extra or {})
    p = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", engine, "--version",
                          version, "--"] + sim_argv(engine, host, port, k), env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://{host}:{port}/health")
    return p


def start_exporter(engine: str, engine_url: str, host: str, port: int, window: float = 60,
                   gate_file: Path | None = None, info: tuple[str, ...] = (),
                   extra: tuple[str, ...] = ()) -> subprocess.Popen:
    args = [sys.executable, "-m", "specdeploy.cli", "exporter", "--engine", engine, "--engine-url", engine_url,
            "--listen", f"{host}:{port}", "--window", str(window), "--info", "version=test"]
    for kv in info:
        args += ["--info", kv]
    if gate_file:
        args += ["--gate-file", str(gate_file)]
    args += list(extra)
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://{host}:{port}/metrics")
    return p


def load(engine_url: str, n: int = 5, max_tokens: int = 40):
    import json
    for _ in range(n):
        req = urllib.request.Request(f"{engine_url}/v1/chat/completions", data=json.dumps(
            {"model": "kimi", "messages": [{"role": "user", "content": "Write a haiku about GPUs."}],
             "max_tokens": max_tokens}).encode(), headers={"content-type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def stop(*procs):
    for p in procs:
        if p and p.poll() is None:
            p.terminate()
    for p in procs:
        if p:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


class UnderLoad:
    """Requests sent by ``threads`` clients while the block runs (``send()`` raises on a failed request), bounded
    in time and count; ``stats`` holds ok, failed and the first errors."""

    def __init__(self, send, threads: int = 3, max_s: float = 900, max_requests: int = 20000, pause: float = 0.05):
        import threading
        self.send, self.max_s, self.max_requests, self.pause = send, max_s, max_requests, pause
        self.stats = {"ok": 0, "failed": 0, "errors": []}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self):
        t0 = time.time()
        while not self.stop.is_set() and time.time() - t0 < self.max_s:
            if self.stats["ok"] + self.stats["failed"] >= self.max_requests:
                break
            try:
                self.send()
                self.stats["ok"] += 1
            except Exception as exc:  # noqa: BLE001 - every failure counts, whatever it is
                self.stats["failed"] += 1
                self.stats["errors"].append(repr(exc)[:200])
            time.sleep(self.pause)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self.stats

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()
        return False


def ansible_filters():
    """The filters Ansible loads from the plugin shim (ansible/filter_plugins/specdeploy.py), by name."""
    import importlib.util
    import types
    spec = importlib.util.spec_from_file_location("sd_filters", REPO / "ansible/filter_plugins/specdeploy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return types.SimpleNamespace(**mod.FilterModule().filters())
