"""End to end on real sandbox hosts (systemd-nspawn, bookworm) with the production runtime: dockerd on each host,
engine images built there from docker/*.Dockerfile, engines in containers. Deploy, idempotence, rolling deploy
under load through the router, a crash on load that fails fast, triages and rolls back, the gate, an engine
switch, rollback.yml. The gate's host runs the venv runtime (the simulator a host process), switched from docker."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, UnderLoad

pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
    reason="needs root and systemd-nspawn (CI runs as root; scripts/setup.sh installs systemd-container)")]

H1, H2 = "10.231.1.2", "10.231.2.2"
ROUTER = f"http://{H1}:30080"


# A value with a space: docker --env-file would keep the quotes a systemd EnvironmentFile needs.
ARCH = "9.0 10.0"


@pytest.fixture(scope="module")
def inv(tmp_path_factory):
    import yaml
    from specdeploy.testing import sandbox
    from specdeploy.testing.fixtures import drafter_config, write_drafter, write_model
    sandbox.down()  # fresh hosts: the first deploy starts from bare Debian
    # what older code left on a machine: a target with config.json only; up and artifacts() must rebuild it
    stale = sandbox.STATE / "artifacts"
    write_model(stale / sandbox.ARTIFACT_MODEL, json.loads((REPO / "examples/models/kimi-k2.5-int4/config.json")
                                                           .read_text()), shards=1)
    write_drafter(stale / sandbox.ARTIFACT_DRAFTER, drafter_config(eagle_config=None))
    hosts = sandbox.up(2)
    sandbox.artifacts()
    assert (stale / sandbox.ARTIFACT_MODEL / "tokenizer_config.json").is_file()
    assert len(list((stale / sandbox.ARTIFACT_MODEL).glob("model-*.safetensors"))) == 3
    d = sandbox.write_inventory(hosts, tmp_path_factory.mktemp("inv") / "sandbox", "vllm", "docker")
    gv = d / "group_vars" / "specdeploy_engines.yml"
    data = yaml.safe_load(gv.read_text())
    assert data["specdeploy_runtime"] == "docker" and "specdeploy_ready_timeout_s" not in data  # default timeout
    data["specdeploy_engine_env"]["TORCH_CUDA_ARCH_LIST"] = ARCH
    data["monitoring_regate_after"] = "20s"  # the continuous gate's window, short for the test
    gv.write_text(yaml.safe_dump(data, sort_keys=False))
    yield d
    sandbox.down()


def play(inv: Path, *extra: str, playbook="deploy.yml", limit=None) -> tuple[int, str, dict]:
    cmd = ["ansible-playbook", "-i", str(inv), str(REPO / "ansible" / playbook)]
    for e in extra:
        cmd += ["-e", e]
    if limit:
        cmd += ["--limit", limit]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1200)
    recap = {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
             for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", r.stdout, re.M)}
    return r.returncode, r.stdout + r.stderr, recap


def ssh(host: str, cmd: str, input: str | None = None) -> str:
    from specdeploy.testing.sandbox import STATE
    r = subprocess.run(["ssh", "-i", str(STATE / "id_ed25519"), "-o", "StrictHostKeyChecking=no", "-o",
                        "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"root@{host}", cmd],
                       capture_output=True, text=True, timeout=60, input=input)
    return r.stdout


def chat(base: str, timeout=30) -> dict:
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps({
        "model": "moonshotai/Kimi-K2.5", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Explain speculative decoding in one line."}]}).encode(),
        headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=timeout))


def test_full_deploy_to_two_hosts(inv):
    rc, out, recap = play(inv, playbook="site.yml")
    assert rc == 0, out[-3000:]
    from specdeploy.plan.images import image_tag
    for h in (H1, H2):
        assert chat(f"http://{h}:8000")["choices"][0]["message"]["content"]
        assert ssh(h, "systemctl is-active specdeploy-vllm specdeploy-exporter").split() == ["active", "active"]
        # the engine runs in a container of the image built on the host from docker/vllm.Dockerfile
        ps = ssh(h, "docker ps --format '{{.Names}} {{.Image}}'").split()
        assert ps == ["specdeploy-vllm", image_tag("vllm", "0.16.0")], ps
        labels = json.loads(ssh(h, "docker image inspect --format '{{json .Config.Labels}}' " + ps[1]))
        assert labels["io.specdeploy.engine-version"] == "0.16.0" and labels["io.specdeploy.patch-set"] == ps[1][-11:]
        # the patch step ran on vLLM 0.16.0's real sources in the image, and every patch applied
        status = json.loads(ssh(h, f"docker run --rm --entrypoint cat {ps[1]} /opt/specdeploy-patch-status.json"))
        assert status["patches"] and {p["status"] for p in status["patches"]} == {"applied"}
        # the container reads its env file verbatim: no stray quotes
        assert ssh(h, "docker exec specdeploy-vllm printenv TORCH_CUDA_ARCH_LIST").strip() == ARCH
        assert "--gpus" not in ssh(h, "cat /etc/systemd/system/specdeploy-vllm.service")  # no GPUs here
        metrics = urllib.request.urlopen(f"http://{h}:9450/metrics", timeout=10).read().decode()
        assert "specdeploy_engine_up 1.0" in metrics
        # the drafter was converted on the host and checked for the engine
        meta = json.loads(ssh(h, "cat /var/lib/specdeploy/drafter/vllm/specdeploy-conversion.json"))
        assert meta["engine"] == "vllm"
    assert chat(ROUTER)["choices"]
    want = {(job, host) for job in ("specdeploy_engine", "specdeploy_exporter") for host in ("sdhost1", "sdhost2")}
    deadline = time.time() + 60  # Prometheus on sdhost1 scrapes every 15 s
    while True:
        targets = json.load(urllib.request.urlopen(f"http://{H1}:9090/api/v1/targets", timeout=10))
        up = {(t["labels"]["job"], t["labels"]["host"]) for t in targets["data"]["activeTargets"]
              if t["health"] == "up"}
        if want <= up or time.time() > deadline:
            break
        time.sleep(3)
    assert want <= up, up


def _converged_run(inv: Path) -> None:
    rc, out, recap = play(inv)
    assert rc == 0, out[-3000:]
    assert recap and all(v["changed"] == 0 for v in recap.values()), recap
    # each host matched its record in one call and skipped the full path
    assert re.search(r"PLAY \[Deploy the engine[^\n]*\n+skipping: no hosts matched", out), out[-3000:]


def test_second_run_changes_nothing(inv):
    _converged_run(inv)
    # drift: a managed file edited by hand on one host and a variable changed: the full path runs and applies both
    unit = "/etc/systemd/system/specdeploy-exporter.service"
    good = ssh(H2, f"cat {unit}")
    ssh(H2, f"echo '# edited by hand' >> {unit}")
    rc, out, recap = play(inv, "monitoring_scrape_interval=20s")
    assert rc == 0, out[-3000:]
    assert recap["sdhost1"]["changed"] > 0 and recap["sdhost2"]["changed"] > 0, recap
    assert ssh(H2, f"cat {unit}") == good
    assert "scrape_interval: 20s" in ssh(H1, "cat /etc/prometheus/prometheus.yml")
    rc, out, recap = play(inv)  # the inventory's value again: a change, not a converged skip
    assert rc == 0, out[-3000:]
    assert recap["sdhost1"]["changed"] > 0, recap
    assert "scrape_interval: 15s" in ssh(H1, "cat /etc/prometheus/prometheus.yml")
    _converged_run(inv)


def _host_state(h: str) -> str:
    """Every file specdeploy manages on a host (path, size, mtime) and the engine's main PID."""
    return ssh(h, "find /etc/systemd/system -maxdepth 1 -name 'specdeploy*'; "
                  "find /etc/specdeploy /var/lib/specdeploy /opt/specdeploy/wheelhouse -maxdepth 3 "
                  "-printf '%p %s %T@\\n' 2>/dev/null | sort; systemctl show -p MainPID specdeploy-vllm")


def test_check_diff_shows_a_changed_variable_and_changes_nothing(inv):
    before = {h: _host_state(h) for h in (H1, H2)}
    cmd = ["ansible-playbook", "-i", str(inv), str(REPO / "ansible" / "deploy.yml"), "--check", "--diff",
           "-e", "specdeploy_max_model_len=4096"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    # the new command line shows as a diff of the files the release would install
    assert re.search(r"^\+.*max-model-len.*4096", out, re.M), out[-4000:]
    assert "--check: specdeploy-vllm.service would restart onto release" in out
    for h in (H1, H2):
        assert _host_state(h) == before[h]
    assert chat(f"http://{H1}:8000")["choices"]


def test_rolling_deploy_under_load_loses_no_request(inv):
    with UnderLoad(lambda: chat(ROUTER, timeout=60)) as stats:
        rc, out, recap = play(inv, "specdeploy_serial=1", "specdeploy_spec_num_tokens=4")
    assert rc == 0, out[-3000:]
    assert "Take the replica out of the router" in out and "Put the replica back into the router" in out
    assert stats["ok"] > 50 and stats["failed"] == 0, stats
    for h in (H1, H2):
        assert '"num_speculative_tokens":4' in ssh(h, "cat /etc/specdeploy/specdeploy-vllm.argv").replace("\\", "")


def test_crash_on_load_fails_fast_triages_and_rolls_back(inv):
    """The default ready timeout (an hour) stays: the crash loop itself ends the wait."""
    before = ssh(H2, "cat /var/lib/specdeploy/current").strip()
    crash = json.dumps({"specdeploy_engine_env": {"SPECDEPLOY_SIM_CRASH": "load", "SPECDEPLOY_SIM_LOAD_SECONDS": "1"},
                        "specdeploy_spec_num_tokens": 4})
    t0 = time.monotonic()
    rc, out, recap = play(inv, crash, limit="sdhost2")
    took = time.monotonic() - t0
    assert rc != 0
    assert took < 300, f"the failed deploy took {took:.0f} s"
    assert "crashed: the engine exited" in out or "crashed: systemd restarted" in out, out[-3000:]
    assert "TRIAGE specdeploy-vllm.service on sdhost2" in out
    assert "'KimiK25Config' object has no attribute 'image_token_index'" in out
    assert "kimi-image-token-index" in out and "Worker_TP" in out
    assert f"Rolled back to release {before}" in out
    assert ssh(H2, "cat /var/lib/specdeploy/current").strip() == before
    assert chat(f"http://{H2}:8000")["choices"][0]["message"]["content"]
    assert "SPECDEPLOY_SIM_CRASH" not in ssh(H2, "cat /etc/specdeploy/specdeploy-vllm.env")


ACCEPTANCE_FILE = "/var/lib/specdeploy-sim/acceptance"  # the simulated traffic's fit to the drafter, on sdhost2


def _runs_from_the_venv(h: str) -> None:
    """The venv runtime (the gate test's host runs it, switched from docker by its host_vars): the simulator runs
    from the host venv, out of any container, and systemd hands it the env file (a value with a space intact)."""
    assert "specdeploy-vllm" not in ssh(h, "docker ps --format '{{.Names}}'")
    unit = ssh(h, "cat /etc/systemd/system/specdeploy-vllm.service")
    assert "EnvironmentFile=/etc/specdeploy/specdeploy-vllm.env" in unit and "docker" not in unit
    pid = ssh(h, "systemctl show specdeploy-vllm -p MainPID --value").strip()
    assert f"TORCH_CUDA_ARCH_LIST={ARCH}" in ssh(h, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert chat(f"http://{h}:8000")["choices"][0]["message"]["content"]


def _alerts(name: str) -> list[dict]:
    body = json.load(urllib.request.urlopen(f"http://{H1}:9090/api/v1/alerts", timeout=10))
    return [a for a in body["data"]["alerts"] if a["labels"].get("alertname") == name]


SURFACE = "/var/lib/specdeploy/surface/surface.json"  # the exporter's default --surface-file


def _surface(version: str) -> dict:
    """A measured price at k=4: at one running request 1.0x needs AL 2.0, at four 2.6 (speedup AL / 2 and AL / 2.6
    between the measured points)."""
    return {"kind": "specdeploy-speculation-surface", "engine": "vllm", "release": version, "margin": 0.1,
            "concurrency": [1, 4], "points": [{"k": 4, "concurrency": c, "al_measured": al, "speedup": al / need}
                                              for c, need in ((1, 2.0), (4, 2.6)) for al in (1.5, 2.5)]}


def _one(query: str) -> float | None:
    body = json.load(urllib.request.urlopen(f"http://{H1}:9090/api/v1/query?" + urllib.parse.urlencode(
        {"query": query}), timeout=10))
    res = body["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def test_gate_keeps_speculation_that_pays_then_regates_it_when_acceptance_falls(inv, tmp_path):
    """The gate keeps a drafter that pays (acceptance 0.8, cheap draft). The price measured on the host (a
    recorded surface) says what AL one running request needs; the exporter publishes it and the continuous gate
    divides live acceptance by it instead of the gate's step ratio. Then the traffic drifts away from the drafter
    (acceptance 0.1): the exporter's live acceptance length falls below the AL it needs,
    Prometheus's SpecdeploySpeculationBelowBreakeven fires after the inventory's monitoring_regate_after, and
    `specdeploy regate` runs the gated deploy on that host: the gate measures again and disables speculation, and
    the unit changes: speculation now costs (speedup below 1.0, the seeds' 0.66x case) and the verdict is written
    to the host's host_vars. A rollback right after the re-gate returns the release the gate kept, speculating. The
    host's settings are in its host_vars (what a re-gate deploys is the inventory, not -e)."""
    import yaml
    group = yaml.safe_load((inv / "group_vars/specdeploy_engines.yml").read_text())
    hv_dir = inv / "host_vars" / "sdhost2"
    hv_dir.mkdir(parents=True)
    (hv_dir / "regate-test.yml").write_text(yaml.safe_dump({
        "specdeploy_runtime": "venv",  # the simulator a host process, reading the host's acceptance file
        "specdeploy_engine_env": {**group["specdeploy_engine_env"], "SPECDEPLOY_SIM_LOAD_SECONDS": "2",
                                  "SPECDEPLOY_SIM_STEP_MS": "5", "SPECDEPLOY_SIM_ACCEPTANCE": "0.8",
                                  "SPECDEPLOY_SIM_SPEC_STEP_RATIO": "1.3",
                                  "SPECDEPLOY_SIM_ACCEPTANCE_FILE": ACCEPTANCE_FILE},
        "specdeploy_spec_num_tokens": 4, "speculation_gate_concurrency": "1,4", "speculation_gate_max_tokens": 48}))
    stop = threading.Event()
    try:
        rc, out, _ = play(inv, "specdeploy_spec_gate=true", limit="sdhost2")
        assert rc == 0, out[-3000:]
        assert "GATE sdhost2: keep" in out
        kept = ssh(H2, "cat /var/lib/specdeploy/current").strip()  # the release the gate kept, speculating
        _runs_from_the_venv(H2)
        assert not (hv_dir / "specdeploy_gate.yml").exists()  # keep changes nothing in the inventory
        assert "--speculative-config" in ssh(H2, "cat /etc/specdeploy/specdeploy-vllm.argv")
        m = urllib.request.urlopen(f"http://{H2}:9450/metrics", timeout=10).read().decode()
        assert 'specdeploy_gate_verdict{verdict="keep"} 1.0' in m
        assert re.search(r'specdeploy_gate_speedup\{concurrency="1"\} (\d\.\d+)', m).group(1) > "1.1"
        ratio = float(re.search(r'specdeploy_gate_step_ratio\{concurrency="1"\} ([0-9.e+-]+)', m).group(1))
        assert 1.0 < ratio < 2.0, m
        # the roofline's ratio for the inventory's Kimi-K2.5 on its profile, beside the measured one
        pred = {r: float(re.search(rf'specdeploy_gate_predicted_step_ratio\{{concurrency="1",routing="{r}"\}} '
                                   r'([0-9.e+-]+)', m).group(1)) for r in ("local", "uniform")}
        assert 1.0 < pred["local"] < pred["uniform"], m
        assert _alerts("SpecdeploySpeculationBelowBreakeven") == []
        # the price of speculation measured on the host (breakeven --measure's surface, at the deployed k=4 and
        # release): 1.0x needs AL 2.0 with one running request, above the gate's step ratio
        version = re.search(r'specdeploy_engine_info\{[^}]*version="([^"]+)"', m).group(1)
        ssh(H2, f"mkdir -p {SURFACE.rsplit('/', 1)[0]} && cat > {SURFACE}", input=json.dumps(_surface(version)))

        def traffic():  # a steady trickle: the exporter's window needs requests, not a saturated CPU
            while not stop.is_set():
                try:
                    chat(f"http://{H2}:8000")
                    time.sleep(0.1)
                except OSError:
                    time.sleep(0.5)
        threading.Thread(target=traffic, daemon=True).start()
        # the continuous gate divides live acceptance by the surface's needed AL, not by the gate's step ratio
        # (the exporter reads the surface at its next scrape, the rule at its next evaluation: until then the
        # series is the gate's step ratio's)
        t0, got, live, needed = time.monotonic(), None, None, None
        while time.monotonic() - t0 < 120:
            time.sleep(5)
            got = _one('specdeploy:spec_predicted_speedup{host="sdhost2"}')
            live = _one('specdeploy_spec_acceptance_length{host="sdhost2"}')
            needed = _one('specdeploy_surface_needed_acceptance_length_now{host="sdhost2"}')
            if None not in (got, live, needed) and got == pytest.approx(live / needed, rel=0.15):
                break
        assert needed == pytest.approx(2.0) and got is not None and live is not None, (got, live, needed)
        assert abs(got - live / 2.0) < abs(got - live / ratio) and got == pytest.approx(live / 2.0, rel=0.15)
        # the traffic drifts: from now on one draft token in ten is accepted
        ssh(H2, f"mkdir -p {ACCEPTANCE_FILE.rsplit('/', 1)[0]} && echo 0.1 > {ACCEPTANCE_FILE}")
        t0, fired = time.monotonic(), []
        while time.monotonic() - t0 < 240 and not fired:
            fired = [a for a in _alerts("SpecdeploySpeculationBelowBreakeven") if a["state"] == "firing"]
            time.sleep(5)
        took = time.monotonic() - t0
        assert fired and fired[0]["labels"]["host"] == "sdhost2", _alerts("SpecdeploySpeculationBelowBreakeven")
        assert fired[0]["labels"]["specdeploy_action"] == "regate" and float(fired[0]["value"]) < 1.0
        # the exporter's 60 s window, the rules' 20 s and two 15 s evaluations: well inside four minutes
        assert took < 240, took
        stop.set()
        state = tmp_path / "regate.json"
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "regate", "-i", str(inv), "--prometheus",
                            f"http://{H1}:9090", "--state", str(state)], capture_output=True, text=True, cwd=REPO,
                           timeout=1800)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert "regate sdhost2: SpecdeploySpeculationBelowBreakeven firing" in r.stdout
        assert "regate sdhost2: deploy with the gate exited 0" in r.stdout
        assert "specdeploy_spec_enabled: false" in (hv_dir / "specdeploy_gate.yml").read_text()
        assert "--speculative-config" not in ssh(H2, "cat /etc/specdeploy/specdeploy-vllm.argv")
        m = urllib.request.urlopen(f"http://{H2}:9450/metrics", timeout=10).read().decode()
        assert 'specdeploy_gate_verdict{verdict="disable"} 1.0' in m
        speedup = float(re.search(r'specdeploy_gate_speedup\{concurrency="1"\} ([0-9.e+-]+)', m).group(1))
        assert speedup < 1.0  # net negative (the seeds' 0.66x case): what SpecdeploySpeculationSlowerThanNone fires on
        # the re-gate read the host's recorded price: each level beside the AL its band needs there
        rep = json.loads(ssh(H2, "cat /var/lib/specdeploy/gate/report.json"))
        assert rep["surface"]["used"] and 1 in rep["surface"]["below_breakeven_at"], rep.get("surface")
        lv1 = next(lv for lv in rep["levels"] if lv["concurrency"] == 1)
        assert lv1["surface_needed_al"][0] == pytest.approx(2.0), lv1
        assert chat(f"http://{H2}:8000")["choices"]  # serving, without speculation
        assert json.loads(state.read_text())["sdhost2"]["rc"] == 0
        # right away again: within the cooldown nothing is run (and the alert no longer concerns a speculating host)
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "regate", "-i", str(inv), "--prometheus",
                            f"http://{H1}:9090", "--state", str(state), "--json"], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
        assert r.returncode == 0 and all(h["action"] == "skipped" for h in json.loads(r.stdout)["hosts"]), r.stdout
        # rollback right after the re-gate undoes its deploy: back to the release that served before it (not to
        # the gate's no-drafter baseline nor to the trial release), speculation on
        assert ssh(H2, "cat /var/lib/specdeploy/previous").strip() == kept
        rc, out, _ = play(inv, playbook="rollback.yml", limit="sdhost2")
        assert rc == 0, out[-3000:]
        assert ssh(H2, "cat /var/lib/specdeploy/current").strip() == kept
        assert "--speculative-config" in ssh(H2, "cat /etc/specdeploy/specdeploy-vllm.argv")
        assert chat(f"http://{H2}:8000")["choices"]
    finally:
        stop.set()
        ssh(H2, f"rm -f {ACCEPTANCE_FILE} {SURFACE}")
        shutil.rmtree(inv / "host_vars", ignore_errors=True)


def test_canary_with_a_worse_drafter_is_not_promoted_and_the_fleet_stays_on_the_serving_release(inv, tmp_path):
    """`specdeploy canary` deploys a change to one host, measures it against the other at matched load and rolls
    it back when it loses. The change is a drafter that accepts far less (the simulator's acceptance for that
    release, 0.2 instead of the serving 0.7 or 0.8): its acceptance length and time per output token are worse, so
    it is not promoted, sdhost2 goes back to the release it served and sdhost1 is never touched."""
    import yaml
    group = yaml.safe_load((inv / "group_vars/specdeploy_engines.yml").read_text())
    before = {h: ssh(h, "cat /var/lib/specdeploy/current").strip() for h in (H1, H2)}
    unit_files = "cat /etc/specdeploy/specdeploy-vllm.env /etc/specdeploy/specdeploy-vllm.argv"
    serving_files = ssh(H2, unit_files)  # what the serving release runs with (earlier tests may have set a lot)
    pid1 = ssh(H1, "systemctl show -p MainPID --value specdeploy-vllm").strip()
    worse = json.dumps({"specdeploy_engine_env": {**group["specdeploy_engine_env"],
                                                  "SPECDEPLOY_SIM_ACCEPTANCE": "0.2"}})
    out = tmp_path / "canary"
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "canary", "-i", str(inv), "--host", "sdhost2",
                        "-e", worse, "--rounds", "4", "--requests", "4", "--concurrency", "2", "--max-tokens", "32",
                        "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=1800)
    log = r.stdout + r.stderr
    assert r.returncode == 1, log[-4000:]  # not promoted, fleet on its serving releases
    rep = json.loads((out / "canary.json").read_text())
    assert rep["canary_deploy_rc"] == 0 and rep["canary_release"] != before[H2], log[-3000:]
    d = rep["decision"]
    assert d["decision"] == "reject", d
    al = d["criteria"]["acceptance_length"]
    assert al["ok"] is False and al["canary"] < al["control"], al
    tp = d["criteria"]["tpot"]
    assert tp["ok"] is False and tp["canary_ms"] > tp["control_ms"] and tp["interval"][1] < 1, tp
    assert len(rep["sides"]["canary"]["rounds"]) == len(rep["sides"]["control"]["rounds"]) == 4
    assert "canary sdhost2: not promoted - acceptance length" in log and "rolling it back" in log
    assert rep["rollback_rc"] == 0 and rep["fleet_on_serving"] is True
    assert (out / "canary.png").stat().st_size > 1000
    for h in (H1, H2):
        assert ssh(h, "cat /var/lib/specdeploy/current").strip() == before[h]
    # nothing of the canary's change is left on the host: its environment and command line are the serving ones
    assert ssh(H2, unit_files) == serving_files
    assert not re.search(r'^SPECDEPLOY_SIM_ACCEPTANCE="?0\.2"?$', serving_files, re.M)  # the change differed
    assert ssh(H1, "systemctl show -p MainPID --value specdeploy-vllm").strip() == pid1  # the control never restarted
    assert chat(ROUTER)["choices"]


def _set_engine(inv: Path, engine: str) -> None:
    """Edit only the specdeploy_engine line of the sandbox's group_vars, as the file's own comment invites."""
    gv = inv / "group_vars" / "specdeploy_engines.yml"
    lines = gv.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.startswith("specdeploy_engine:")]
    assert len(hits) == 1
    lines[hits[0]] = f"specdeploy_engine: {engine}\n"
    gv.write_text("".join(lines))


def _serves(engine: str, other: str) -> None:
    for h in (H1, H2):
        unit = f"/etc/systemd/system/specdeploy-{other}.service"
        assert ssh(h, f"test -e {unit} && echo present || echo gone").strip() == "gone"
        assert ssh(h, f"systemctl is-active specdeploy-{engine}").strip() == "active"
        metrics = urllib.request.urlopen(f"http://{h}:9450/metrics", timeout=10).read().decode()
        assert f'engine="{engine}"' in metrics and "specdeploy_engine_up 1.0" in metrics
    assert chat(ROUTER)["choices"]


def test_editing_only_the_engine_line_switches_both_hosts_to_sglang(inv):
    """vLLM -> SGLang by the one inventory variable: each engine's release comes from specdeploy_engine_versions,
    so nothing else changes in the inventory. (The switch is symmetric in the roles: the same tasks, the engines'
    names swapped; rollback.yml below goes back to vLLM, and test_model_e2e switches by -e and back.)"""
    _set_engine(inv, "sglang")
    rc, out, _ = play(inv)
    assert rc == 0, out[-3000:]
    _serves("sglang", "vllm")
    for h in (H1, H2):
        urllib.request.urlopen(f"http://{h}:8000/health_generate", timeout=30)  # same port, SGLang semantics
        cfg = json.loads(ssh(h, "cat /var/lib/specdeploy/drafter/sglang/config.json"))
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
        assert "--speculative-algorithm EAGLE3" in ssh(h, "cat /etc/specdeploy/specdeploy-sglang.argv")


def test_rollback_returns_to_the_previous_engine(inv):
    """After the switch, the release before it served vLLM: rollback.yml starts it again and stops SGLang."""
    previous = {h: ssh(h, "cat /var/lib/specdeploy/previous").strip() for h in (H1, H2)}
    rc, out, _ = play(inv, playbook="rollback.yml")
    assert rc == 0, out[-3000:]
    for h in (H1, H2):
        assert ssh(h, "cat /var/lib/specdeploy/current").strip() == previous[h]
        assert ssh(h, "systemctl is-active specdeploy-vllm specdeploy-sglang").split() == ["active", "inactive"]
        assert chat(f"http://{h}:8000")["choices"][0]["message"]["content"]
        m = urllib.request.urlopen(f"http://{h}:9450/metrics", timeout=10).read().decode()
        assert 'engine="vllm"' in m
    _set_engine(inv, "vllm")  # the inventory says what the hosts serve again


