"""Restarts that keep the weights, end to end on a sandbox host: vLLM 0.32.0 (the simulator playing `vllm preload`
and `vllm serve --load-format ipc_cache` as the release does, testing/simcache.py) with a block-FP8 checkpoint,
which its weight cache holds (the example Kimi-K2.5 INT4 checkpoint it refuses), through ansible-playbook.

- The first deploy with the gate loads the weights once, in the weight-cache daemon, and the gate's two engines
  (baseline and speculative) attach in seconds while the daemon keeps its PID.
- A regate (the deploy with the gate forced) with a flag change restarts only the engine: three more attaches, the
  same daemon.
- New weights at the model path (a staged checkpoint switched in) restart the daemon: a full load, a new PID.
- A killed daemon stops its engine within seconds (systemd's BindsTo=), triage names the daemon as the root cause,
  the exporter reports it down; the next deploy reloads it and the release that was serving serves again.

The load is slowed (SPECDEPLOY_SIM_LOAD_SECONDS) so that a full load and an attach are told apart by time."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request

import pytest

from helpers import FLEETS, REPO, sandbox_fleet
from test_sandbox_e2e import chat, play, ssh

pytestmark = [pytest.mark.sandbox(fleet="b"), pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
    reason="needs root and systemd-nspawn (CI runs as root; scripts/setup.sh installs systemd-container)")]

N = FLEETS["b"]
HOST, ADDR = f"sdhost{N}", f"10.231.{N}.2"
DAEMON, ENGINE = "specdeploy-vllm-weights", "specdeploy-vllm"
LOAD_S = 12  # the simulated load: 70% weights (the daemon's), 30% CUDA graphs (every engine start's)
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


@pytest.fixture(scope="module")
def inv(tmp_path_factory):
    with sandbox_fleet("b") as first:
        yield from _inventory(first, tmp_path_factory)


def _inventory(first: int, tmp_path_factory):
    import yaml
    from specdeploy.testing import sandbox
    from specdeploy.testing.fixtures import write_model
    sandbox.down()
    hosts = sandbox.up(1, first=first)
    sandbox.artifacts()
    ckpt = tmp_path_factory.mktemp("ckpt")
    cfg = json.loads((REPO / "examples/models/kimi-k2.5-int4/config.json").read_text())
    cfg["text_config"]["quantization_config"] = FP8  # as DeepSeek-V3 ships it
    for name, seed in (("a", 0), ("b", 1)):  # two checkpoints of one layout: other weights, the same headers
        m = write_model(ckpt / name, cfg, seed=seed)
        for f in (REPO / "examples/models/kimi-k2.5-int4").iterdir():
            if f.name != "config.json":
                shutil.copyfile(f, m / f.name)
        for f in m.iterdir():
            f.chmod(0o644)
    d = sandbox.write_inventory(hosts, tmp_path_factory.mktemp("inv") / "sandbox", "vllm", "venv")
    gv = d / "group_vars" / "specdeploy_engines.yml"
    data = yaml.safe_load(gv.read_text())
    data["specdeploy_engine_versions"]["vllm"] = "0.32.0"
    data.update({"specdeploy_model_path": "/models/kimi-fp8", "specdeploy_model_controller_path": str(ckpt / "a"),
                 "specdeploy_spec_gate": True, "speculation_gate_concurrency": "1", "speculation_gate_max_tokens": 24,
                 "specdeploy_engine_env": {**data["specdeploy_engine_env"],
                                           "SPECDEPLOY_SIM_LOAD_SECONDS": str(LOAD_S)}})
    gv.write_text(yaml.safe_dump(data, sort_keys=False))
    yield d, ckpt
    sandbox.down()


def daemon_state() -> dict:
    out = ssh(ADDR, f"systemctl show {DAEMON} -p MainPID -p InvocationID -p ActiveState")
    return dict(line.split("=", 1) for line in out.split())


def engine_attaches(out: str) -> list[float]:
    """The seconds of each engine start the deploy recorded as an attach ("ATTACH host: attached in N s")."""
    return [float(s) for s in re.findall(rf"ATTACH {HOST}: attached in (\d+) s", out)]


def full_loads(out: str) -> int:
    return len(re.findall(rf"RESTART {HOST}: the weight-cache daemon {DAEMON}\.service restarts, a full load", out))


def metrics() -> str:
    return urllib.request.urlopen(f"http://{ADDR}:9450/metrics", timeout=10).read().decode()


def current() -> str:
    return ssh(ADDR, "cat /var/lib/specdeploy/current").strip()


def test_the_gate_loads_the_weights_once_and_its_engines_attach(inv):
    d, _ = inv
    rc, out, _ = play(d)
    assert rc == 0, out[-4000:]
    assert f"GATE {HOST}:" in out
    assert full_loads(out) == 1, out[-4000:]
    # the gate's baseline and its speculative engine each restart only the engine
    assert len(re.findall(rf"RESTART {HOST}: only the engine restarts and attaches", out)) == 2
    loaded = float(re.search(rf"WEIGHT CACHE {HOST}: {DAEMON}\.service loaded the weights in ([\d.]+) s", out)[1])
    # the wait is timed from its own start, a task after the daemon's: on a busy controller a second or two of the
    # daemon's 0.7 * LOAD_S go unseen, while an attach takes 0.3 * LOAD_S
    assert loaded >= 0.5 * LOAD_S
    assert len(engine_attaches(out)) == 3 and max(engine_attaches(out)) < loaded
    s = daemon_state()
    assert s["ActiveState"] == "active"
    assert ssh(ADDR, f"journalctl -u {DAEMON} -o cat | grep -c 'Weight cache daemon READY'").strip() == "1"
    journal = ssh(ADDR, f"journalctl -u {ENGINE} -o cat")
    assert journal.count("Mapped 1283 tensors from the weight cache daemon") >= 3 * 8  # 3 starts, 8 ranks each
    assert "Loading safetensors checkpoint shards" not in journal  # no engine ever read the weights
    assert chat(f"http://{ADDR}:8000")["choices"][0]["message"]["content"]
    m = metrics()
    assert "specdeploy_weight_cache_up 1.0" in m and "specdeploy_weight_cache_expected 1.0" in m
    assert re.search(r'specdeploy_engine_start_seconds\{how="attached"\} \d', m), m


def test_a_regate_and_a_flag_change_restart_only_the_engine(inv):
    d, _ = inv
    before = daemon_state()
    rc, out, _ = play(d, "speculation_gate_force=true",
                      json.dumps({"specdeploy_engine_extra_args": ["--max-num-seqs", "8"]}))
    assert rc == 0, out[-4000:]
    assert full_loads(out) == 0 and f"GATE {HOST}:" in out
    assert len(engine_attaches(out)) == 3  # the new release, then the gate's baseline and speculative runs
    assert daemon_state() == before  # the same daemon process throughout
    assert "--max-num-seqs 8" in ssh(ADDR, f"cat /etc/specdeploy/{ENGINE}.argv")
    assert "--max-num-seqs" not in ssh(ADDR, f"cat /etc/specdeploy/{DAEMON}.argv")


def test_new_weights_restart_the_daemon(inv):
    d, ckpt = inv
    before = daemon_state()
    rc, out, _ = play(d, f"specdeploy_model_controller_path={ckpt / 'b'}", "specdeploy_spec_gate=false")
    assert rc == 0, out[-4000:]
    assert full_loads(out) == 1 and "a new checkpoint was switched in at the model path" in out
    after = daemon_state()
    assert after["MainPID"] != before["MainPID"] and after["InvocationID"] != before["InvocationID"]
    assert len(engine_attaches(out)) == 1
    assert chat(f"http://{ADDR}:8000")["choices"][0]["message"]["content"]


def test_a_killed_daemon_stops_its_engine_fast_with_the_cause_named(inv):
    d, ckpt = inv
    serving = current()
    pid = daemon_state()["MainPID"]
    t0 = time.time()
    ssh(ADDR, f"kill -9 {pid}")
    while ssh(ADDR, f"systemctl is-active {ENGINE}").strip() in ("active", "deactivating") and time.time() - t0 < 60:
        time.sleep(0.5)
    stopped = time.time() - t0
    assert stopped < 30, f"the engine still served {stopped:.0f} s after its daemon was killed"
    r = json.loads(ssh(ADDR, f"/opt/specdeploy/venv/bin/specdeploy triage --journal {ENGINE}.service --json"))
    assert r["signature"] == "bound-unit-stopped" and DAEMON in r["root_cause"], r
    # both stay down until the next deploy: no restart of the engine that would pull the daemon into a full load
    # (the engine's ExecStopPost stops it for good when its daemon failed, whichever of the two saw the death first)
    units = ssh(ADDR, f"systemctl show {ENGINE} {DAEMON} -p Id -p ActiveState -p SubState -p NRestarts")
    seen = f"{units}\n" + ssh(ADDR, f"journalctl -u {ENGINE} -u {DAEMON} -o short-precise -n 30 --no-pager")
    show = {u["Id"]: u for u in (dict(x.split("=", 1) for x in b.split()) for b in units.strip().split("\n\n"))}
    assert show[f"{ENGINE}.service"]["SubState"] == "dead" and show[f"{ENGINE}.service"]["NRestarts"] == "0", seen
    assert show[f"{DAEMON}.service"]["SubState"] == "failed", seen
    m = metrics()
    assert "specdeploy_weight_cache_up 0.0" in m, "\n".join(
        [x for x in m.splitlines() if x.startswith("specdeploy_weight_cache")] + [seen])
    assert current() == serving  # nothing lost the current release
