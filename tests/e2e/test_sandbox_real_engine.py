"""The real vLLM 0.32 CPU build on two sandbox hosts as one tensor-parallel serving group, deployed through
ansible-playbook: a tiny MLA + MoE target (DeepSeek-V3 shaped) with its EAGLE-3 drafter, staged and converted by the
roles, probed in the release's own engine code, started by the units specdeploy renders, ready on a real chat
completion; the exporter and `specdeploy status` show the engine's own acceptance, a release the engine refuses
restarts nothing, and a lost follower shows at once. One deploy of the real engine serves every check: each
costs minutes of CPU."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from helpers import REPO

pytestmark = [pytest.mark.sandbox, pytest.mark.realengine, pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
    reason="needs root and systemd-nspawn (CI runs as root; scripts/setup.sh installs systemd-container)")]

H1, H2 = "10.231.1.2", "10.231.2.2"
VERSION = "0.32.0"
TARGET = "deepseek_v3"


@pytest.fixture(scope="module")
def hosts():
    from specdeploy.testing import sandbox
    sandbox.down()
    up = sandbox.up(2, real_engine=VERSION)
    sandbox.artifacts()
    yield up
    sandbox.down()


@pytest.fixture(scope="module")
def group_inv(hosts, tmp_path_factory):
    """sdhost1 and sdhost2 as one serving group, tensor parallel across the two hosts: each host one CPU "GPU" (a
    custom hardware profile), so TP 2 spans them; the sandbox's network stands in for the RDMA fabric."""
    import yaml
    from specdeploy.testing import sandbox
    d = sandbox.write_inventory(hosts, tmp_path_factory.mktemp("inv") / "sandbox", "vllm", "venv",
                                real_engine=VERSION, target=TARGET)
    doc = yaml.safe_load((d / "hosts.yml").read_text())
    engines = doc["all"]["children"]["specdeploy_engines"]
    engines["children"] = {"tiny_tp": {"vars": {"specdeploy_group": "tiny_tp"}, "hosts": engines.pop("hosts")}}
    (d / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    gv = d / "group_vars" / "specdeploy_engines.yml"
    data = yaml.safe_load(gv.read_text())
    data.update({"specdeploy_topology": "tp", "specdeploy_hardware": "custom", "specdeploy_router": "none",
                 "specdeploy_hardware_custom": {"gpu_count": 1, "gpu_memory_gib": 16, "compute_capability": "9.0",
                                                "interconnect": "pcie", "rdma": True},
                 "specdeploy_tensor_parallel_size": None})
    gv.write_text(yaml.safe_dump(data, sort_keys=False))
    return d


def flat(text: str) -> str:
    """Ansible's output with its line folding undone (the yaml result format wraps long messages)."""
    return " ".join(text.split())


def probed(r) -> str:
    out = r.stdout + r.stderr
    i = out.find("Engine probe")
    return out[max(0, i - 200):i + 6000] if i >= 0 else out[-4000:]


def ssh(cmd: str, host: str = H1) -> str:
    from specdeploy.testing.sandbox import STATE
    r = subprocess.run(["ssh", "-i", str(STATE / "id_ed25519"), "-o", "StrictHostKeyChecking=no", "-o",
                        "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"root@{host}", cmd],
                       capture_output=True, text=True, timeout=60)
    return r.stdout


def chat(text: str) -> dict:
    req = urllib.request.Request(f"http://{H1}:8000/v1/chat/completions", data=json.dumps({
        "model": f"tiny-{TARGET}", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": text}]}).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))


def engine_counters() -> dict[str, float]:
    page = urllib.request.urlopen(f"http://{H1}:8000/metrics", timeout=30).read().decode()
    out = {}
    for line in page.splitlines():
        for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def probed_and_speculating(inv, r) -> None:
    """Before the engine started, the probe ran the release's own engine code on its target and converted drafter;
    the leader runs the real engine (not the simulator) with EAGLE-3, its good drafter's first tokens are accepted,
    and the fleet view (the exporter's acceptance from the engine's own counters) shows it."""
    said = flat(r.stdout)
    assert "PROBE sdhost1: drafter load: vLLM 0.32.0" in said and "places every checkpoint tensor" in said, probed(r)
    assert "PROBE sdhost1: target: DeepseekV3ForCausalLM implements SupportsEagle3" in said, probed(r)
    assert "simulate" not in engine_cmdline(H1) and "eagle3" in engine_cmdline(H1)
    before = engine_counters()
    for i in range(6):
        assert chat(f"Count to {i + 5}, then stop.")["choices"][0]["message"]["content"]
    after = engine_counters()
    drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0)
    accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before.get("vllm:spec_decode_num_accepted_tokens_total", 0))
    assert drafts > 0 and accepted > 0, (before, after)  # the good drafter's first token is accepted
    row, deadline = {}, time.time() + 120
    while time.time() < deadline:
        row = group_rows(inv).get("sdhost1", {})
        if row.get("acceptance_length"):
            break
        chat("One more sentence, please.")
        time.sleep(5)
    assert row.get("up") is True and row.get("engine") == "vllm" and row.get("version") == VERSION, row
    assert row.get("speculation") == "on"
    assert 1.0 < row["acceptance_length"] <= 2.0, row  # k=1: one draft token, accepted or not
    assert 0.0 < row["acceptance_rate"] <= 1.0, row


def refused_by_the_engine_before_the_restart(inv):
    """A release the engine would refuse at start (a context longer than the target's 262144 positions; no rule of
    ours checks it) is stopped by the probe's finding, in the engine's own words, before anything restarts: the
    serving engine processes (both ranks) and release stay, and it still answers."""
    pids = {h: ssh("systemctl show -p MainPID --value specdeploy-vllm.service", h).strip() for h in (H1, H2)}
    current = ssh("cat /var/lib/specdeploy/current").strip()
    r = subprocess.run(["ansible-playbook", "-i", str(inv), str(REPO / "ansible" / "deploy.yml"),
                        "-e", "specdeploy_max_model_len=1048576"],
                       capture_output=True, text=True, cwd=REPO, timeout=1800)
    out = flat(r.stdout + r.stderr)
    assert r.returncode != 0, probed(r)
    assert "PROBE sdhost1: vLLM 0.32.0 refuses release" in out, probed(r)
    assert "User-specified max_model_len (1048576) is greater than the derived max_model_len" in out, probed(r)
    assert f"Nothing was restarted: release {current} keeps serving" in out, probed(r)
    assert {h: ssh("systemctl show -p MainPID --value specdeploy-vllm.service", h).strip() for h in (H1, H2)} == pids
    assert ssh("cat /var/lib/specdeploy/current").strip() == current
    assert chat("Still there?")["choices"][0]["message"]["content"]


def engine_cmdline(host: str) -> str:
    pid = ssh("systemctl show -p MainPID --value specdeploy-vllm.service", host).strip()
    return ssh(f"tr '\\0' ' ' < /proc/{pid}/cmdline", host)


def test_real_vllm_with_eagle3_serves_one_model_across_two_sandbox_hosts_as_a_tp_group(group_inv):
    """Two hosts, one serving group: the deploy renders a rank line per host, starts the follower, then the leader,
    and is ready when the leader serves a real generation; the two real engines form one tensor-parallel world over
    the hosts' network (the leader's rendezvous), and only the leader serves HTTP."""
    from specdeploy.testing import realengine
    r = subprocess.run(["ansible-playbook", "-i", str(group_inv), str(REPO / "ansible" / "site.yml")],
                       capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    lead, follow = engine_cmdline(H1), engine_cmdline(H2)
    for line, rank in ((lead, 0), (follow, 1)):
        assert f"{realengine.path(VERSION)}/bin/vllm serve /models/tiny-{TARGET}" in line, line
        assert "simulate" not in line and "--tensor-parallel-size 2" in line and "--nnodes 2" in line, line
        assert f"--node-rank {rank}" in line and f"--master-addr {H1}" in line, line
    assert "--headless" in follow and "--headless" not in lead
    for host, rank in ((H1, 0), (H2, 1)):
        journal = ssh("journalctl -u specdeploy-vllm.service -o cat --no-pager", host)
        assert re.search(rf"world_size=2 rank={rank} local_rank=0 distributed_init_method=tcp://{re.escape(H1)}:",
                         journal), journal[-3000:]
    before = engine_counters()
    for i in range(3):
        assert chat(f"Name {i + 2} rivers.")["choices"][0]["message"]["content"]
    after = engine_counters()
    assert after["vllm:spec_decode_num_drafts_total"] > before.get("vllm:spec_decode_num_drafts_total", 0)
    with pytest.raises(OSError):  # headless: no API server on the follower
        urllib.request.urlopen(f"http://{H2}:8000/health", timeout=5)
    probed_and_speculating(group_inv, r)
    refused_by_the_engine_before_the_restart(group_inv)
    follower_lost_is_seen_by_the_leaders_exporter_and_status(group_inv)


def joined_on_leader() -> dict[str, float]:
    page = urllib.request.urlopen(f"http://{H1}:9450/metrics", timeout=30).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^specdeploy_group_rank_joined\{[^}]*rank_host="([^"]+)"[^}]*\} (\S+)$', page, re.M)}


def group_rows(inv) -> dict[str, dict]:
    st = subprocess.run([sys.executable, "-m", "specdeploy.cli", "status", "-i", str(inv), "--json", "--timeout", "5"],
                        capture_output=True, text=True, cwd=REPO, timeout=60)
    assert st.returncode in (0, 1), st.stderr
    return {h["host"]: h for h in json.loads(st.stdout)["hosts"]}


def follower_lost_is_seen_by_the_leaders_exporter_and_status(inv):
    """The real engine's follower holds its connection to the leader's rendezvous port while the group serves; the
    leader's exporter reads it from the kernel's tables, so a follower that goes away shows at once, while the
    leader's engine still answers its health check (it notices at its next step)."""
    assert joined_on_leader() == {"sdhost2": 1.0}
    rows = group_rows(inv)
    assert rows["sdhost2"].get("joined") is True and rows["sdhost2"].get("up") is True, rows["sdhost2"]
    assert not rows["sdhost1"].get("group_state"), rows["sdhost1"]
    ssh("systemctl stop specdeploy-vllm.service", H2)
    deadline = time.time() + 60
    while joined_on_leader() != {"sdhost2": 0.0} and time.time() < deadline:
        time.sleep(2)
    assert joined_on_leader() == {"sdhost2": 0.0}
    assert urllib.request.urlopen(f"http://{H1}:8000/health", timeout=10).status == 200  # the engine: not yet
    rows = group_rows(inv)
    assert rows["sdhost2"]["group_state"] == "rank lost" and rows["sdhost2"]["up"] is False, rows["sdhost2"]
    assert rows["sdhost1"]["group_state"] == "group broken" and "sdhost2" in rows["sdhost1"]["error"], rows
