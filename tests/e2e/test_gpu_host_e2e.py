"""The gpu_host role on a real sandbox host (no GPU): Docker configuration (daemon.json merged, never clobbered),
the ACS unit, the limits cleanup, idempotence, and ``specdeploy preflight --hosts`` reporting "no GPU"."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from helpers import REPO

# fleet a (one host, before test_sandbox_e2e brings its two up): fleet b's modules are the suite's longest chain
pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
    reason="needs root and systemd-nspawn (CI runs as root; scripts/setup.sh installs systemd-container)")]


@pytest.fixture(scope="module")
def inv(tmp_path_factory):
    from specdeploy.testing import sandbox
    sandbox.down()
    hosts = sandbox.up(1)
    yield sandbox.write_inventory(hosts, tmp_path_factory.mktemp("inv") / "sandbox", "vllm"), hosts[0]
    sandbox.down()


def ssh(addr: str, cmd: str) -> subprocess.CompletedProcess:
    from specdeploy.testing.sandbox import STATE
    return subprocess.run(["ssh", "-i", str(STATE / "id_ed25519"), "-o", "StrictHostKeyChecking=no", "-o",
                           "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"root@{addr}", cmd],
                          capture_output=True, text=True, timeout=60)


def provision(inv_dir) -> tuple[int, str, dict]:
    r = subprocess.run(["ansible-playbook", "-i", str(inv_dir), str(REPO / "ansible/provision.yml"),
                        "-e", "specdeploy_runtime=docker", "-e", "gpu_host_acs_disable=true"],
                       capture_output=True, text=True, cwd=REPO, timeout=600)
    recap = {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
             for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", r.stdout, re.M)}
    return r.returncode, r.stdout + r.stderr, recap


def test_preflight_hosts_reports_no_gpu(inv):
    inv_dir, host = inv
    r = subprocess.run(["specdeploy", "preflight", "-i", str(inv_dir), "--hosts", "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)["hosts"][host.name]
    assert any(f["subject"] == "GPU" and f["message"].startswith("no GPU (sandbox host)") for f in rep["findings"])


def test_role_configures_docker_keeps_user_keys_and_is_idempotent(inv):
    inv_dir, host = inv
    # the user's own daemon.json and an earlier limits.d file are on the host before the role runs
    setup = ssh(host.address, "mkdir -p /etc/docker /etc/security/limits.d && "
                "echo '{\"log-level\": \"warn\"}' > /etc/docker/daemon.json && "
                "echo '* soft memlock unlimited' > /etc/security/limits.d/90-specdeploy.conf")
    assert setup.returncode == 0, setup.stderr
    rc, out, recap = provision(inv_dir)
    assert rc == 0, out[-4000:]
    assert recap[host.name]["changed"] > 0 and recap[host.name]["failed"] == 0
    assert "no GPU (sandbox host)" in out
    daemon = json.loads(ssh(host.address, "cat /etc/docker/daemon.json").stdout)
    assert daemon["log-level"] == "warn"
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert "default-ulimits" not in daemon  # no GPUs here: raised limits would stop every container from starting
    assert ssh(host.address, "test -e /etc/security/limits.d/90-specdeploy.conf").returncode == 1
    unit = ssh(host.address, "systemctl is-active specdeploy-acs-off; journalctl -u specdeploy-acs-off -o cat")
    assert unit.stdout.startswith("active") and "no NVIDIA GPU on the PCI bus" in unit.stdout
    before = ssh(host.address, "stat -c %Y /etc/docker/daemon.json").stdout
    rc, out, recap = provision(inv_dir)
    assert rc == 0, out[-4000:]
    assert recap[host.name]["changed"] == 0, out[-4000:]
    assert ssh(host.address, "stat -c %Y /etc/docker/daemon.json").stdout == before
