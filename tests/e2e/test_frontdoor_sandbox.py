"""The front door on real sandbox hosts: `specdeploy deploy` with per-host load progress ending in a summary,
a crash on load with its triage inline, and `specdeploy status` within 5 s, unreachable hosts included."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, sandbox_fleet

pytestmark = [pytest.mark.sandbox(fleet="b"), pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
    reason="needs root and systemd-nspawn (CI runs as root; scripts/setup.sh installs systemd-container)")]

SLOW_LOAD = json.dumps({"specdeploy_engine_env": {"SPECDEPLOY_SIM_LOAD_SECONDS": "10", "SPECDEPLOY_SIM_STEP_MS": "5"}})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from specdeploy.testing import sandbox
    with sandbox_fleet("b") as first:
        sandbox.down()
        hosts = sandbox.up(2, first=first)
        sandbox.artifacts()
        # the venv runtime: the front door runs the same site.yml on either, and the docker runtime's image builds
        # are covered by test_sandbox_e2e.py's first deploy (here they would only add minutes of CPU)
        inv = sandbox.write_inventory(hosts, tmp_path_factory.mktemp("inv") / "sandbox", "vllm", "venv")
        yield inv, hosts
        sandbox.down()


def sd(*args, timeout=1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env=dict(os.environ, COLUMNS="160"))


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_deploy_shows_progress_per_host_and_ends_in_a_summary(fleet, tmp_path):
    inv, hosts = fleet
    ev = tmp_path / "deploy.jsonl"
    r = sd("deploy", "-i", str(inv), "-e", SLOW_LOAD, "--events", str(ev))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    out = r.stdout
    assert "preflight" in out and "2/2 hosts ok" in out
    evs = events(ev)
    for h in hosts:
        phases = [e["phase"] for e in evs if e.get("host") == h.name and e.get("event") == "runner_on_start"]
        for p in ("provision", "image", "stage", "start", "load", "ready"):
            assert p in phases, (h.name, p, sorted(set(phases)))
        # the engine's own load lines, read from its journal while the play waited for readiness
        prog = [e["progress"] for e in evs if e.get("host") == h.name and e.get("event") == "load_progress"]
        assert prog, f"no load progress for {h.name}"
        assert any(p.get("shards") and p["shards"][1] == 64 for p in prog)
        assert any(p.get("eta_s") is not None for p in prog) or any(p["stage"] == "ready" for p in prog)
        assert f"{h.name}: load - shards" in out
    fin = evs[-1]
    assert fin["event"] == "finished" and {r["result"] for r in fin["rows"].values()} == {"ok"}


def test_status_shows_the_fleet_within_5_seconds(fleet):
    inv, hosts = fleet
    t0 = time.monotonic()
    r = sd("status", "-i", str(inv), "--json")
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads(r.stdout)
    assert wall < 5, wall
    rows = {row["host"]: row for row in st["hosts"]}
    for h in hosts:
        row = rows[h.name]
        assert row["reachable"] and row["up"] and row["engine"] == "vllm" and row["speculation"] == "on"
        from specdeploy.testing.sandbox import STATE
        cur = subprocess.run(["ssh", "-i", str(STATE / "id_ed25519"), "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"root@{h.address}",
                              "cat /var/lib/specdeploy/current"], capture_output=True, text=True).stdout.strip()
        assert row["release"] == cur and cur
    assert st["prometheus"], st["prometheus_errors"]
    table = sd("status", "-i", str(inv))
    assert all(h.name in table.stdout for h in hosts) and "vllm 0.16.0" in table.stdout


def test_a_vaulted_inventory_plans_and_deploys_as_ansible_playbook_does(fleet, tmp_path):
    """A copy of the sandbox inventory with an inline !vault value: plan matches the plain copy, `specdeploy deploy`
    deploys with the password file, the value never reaches the events, and without the secret the deploy stops
    before any host, naming the file. With the first test's -e, the vaulted copy asks for
    what the hosts already run: the deploy (ansible-playbook site.yml under the front door, with the password file)
    changes nothing on either host, which holds only where the decrypted value equals the plain one. (The copy's
    inventory files differ from the plain one's, so the deploy takes the full path rather than the converged skip.)"""
    import yaml
    inv, hosts = fleet
    vaulted = tmp_path / "vaulted"
    shutil.copytree(inv, vaulted)
    pw = tmp_path / "vault-pass"
    pw.write_text("sandbox vault secret\n")
    gv = vaulted / "group_vars" / "specdeploy_engines.yml"
    data = yaml.safe_load(gv.read_text())
    name = data.pop("specdeploy_served_model_name")
    enc = subprocess.run(["ansible-vault", "encrypt_string", "--vault-password-file", str(pw), name, "--name",
                          "specdeploy_served_model_name"], capture_output=True, text=True, timeout=120, check=True)
    gv.write_text("---\n" + yaml.safe_dump(data, sort_keys=False) + enc.stdout)
    assert "$ANSIBLE_VAULT" in gv.read_text() and name not in gv.read_text()

    plain = sd("plan", "-i", str(inv), "--json")
    secret = sd("plan", "-i", str(vaulted), "--json", "--vault-password-file", str(pw))
    assert plain.returncode == secret.returncode == 0, secret.stderr
    assert json.loads(plain.stdout) == json.loads(secret.stdout)

    ev = tmp_path / "vault.jsonl"
    r = sd("deploy", "-i", str(vaulted), "--vault-password-file", str(pw), "-e", SLOW_LOAD, "--events", str(ev))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "2/2 hosts ok" in r.stdout and name not in ev.read_text() and (ev.stat().st_mode & 0o777) == 0o600
    # site.yml (which the front door runs) found nothing to change on either host: the decrypted value is the plain
    # one (another served name would have changed the command line and restarted the engine)
    rows = events(ev)[-1]["rows"]
    assert {h.name: rows[h.name]["changed"] for h in hosts} == {h.name: 0 for h in hosts}, rows

    none = sd("deploy", "-i", str(vaulted), "--events", str(tmp_path / "none.jsonl"))
    assert none.returncode != 0 and "specdeploy_engines.yml" in none.stdout + none.stderr, none.stdout[-2000:]
    assert "Traceback" not in none.stdout + none.stderr


def test_crash_on_load_shows_triage_inline(fleet, tmp_path):
    inv, hosts = fleet
    ev = tmp_path / "crash.jsonl"
    crash = json.dumps({"specdeploy_engine_env": {"SPECDEPLOY_SIM_CRASH": "load", "SPECDEPLOY_SIM_LOAD_SECONDS": "2"}})
    r = sd("deploy", "-i", str(inv), "--limit", hosts[1].name, "-e", crash, "--events", str(ev))
    assert r.returncode == 1, r.stdout[-4000:]
    assert f"triage: {hosts[1].name}" in r.stdout and "root_cause" in r.stdout
    tri = [e["triage"] for e in events(ev) if e.get("triage")]
    assert tri and tri[0]["root_cause"]
    assert tri[0]["root_cause"] in r.stdout.replace("\n", " ") or tri[0]["root_cause"][:40] in r.stdout
    fin = events(ev)[-1]
    assert fin["rows"][hosts[1].name]["result"] == "failed"


def test_unreachable_host_is_shown_within_seconds(fleet):
    from specdeploy.testing import sandbox
    inv, hosts = fleet
    sandbox.stop_host(hosts[1])
    t0 = time.monotonic()
    r = sd("status", "-i", str(inv), "--json")
    wall = time.monotonic() - t0
    st = json.loads(r.stdout)
    rows = {row["host"]: row for row in st["hosts"]}
    assert r.returncode == 1 and wall < 5, wall
    assert not rows[hosts[1].name]["reachable"] and rows[hosts[0].name]["up"]
