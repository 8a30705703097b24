"""Serving groups end to end on 4 real sandbox hosts: two groups of two (specdeploy_group), each one model
instance across its hosts. Cross-host tensor parallelism deploys; a batch that would split a group is refused
before anything changes; DP attention + EP by changing one variable rolls out group by group behind the router
with no failed request; a follower rank that crashes on load fails its group within a
minute, the root cause comes from that rank's journal, and that group rolls back while the other serves.

The engines are the simulator playing each rank (testing/simulator.py: the leader serves once its ranks joined
its rendezvous, the others are headless), on the venv runtime; the docker runtime is covered on two hosts by
test_sandbox_e2e.py. The sandbox has no RDMA fabric: the inventory says it has one (specdeploy_rdma), since
cross-host TP is refused without it, and the simulator's rendezvous goes over the hosts' own network."""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest

from helpers import FLEETS, UnderLoad, sandbox_fleet
from test_sandbox_e2e import chat, play, ssh

pytestmark = [pytest.mark.sandbox(fleet="b"), pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
    reason="needs root and systemd-nspawn (CI runs as root; scripts/setup.sh installs systemd-container)")]

N = FLEETS["b"]  # this module runs on fleet b: hosts sdhost5..sdhost8
H1, H2, H3, H4 = (f"sdhost{N + i}" for i in range(4))
ADDR = {f"sdhost{N + i}": f"10.231.{N + i}.2" for i in range(4)}
LEADERS, FOLLOWERS = (H1, H3), (H2, H4)
ROUTER = f"http://{ADDR[H1]}:30080"


@pytest.fixture(scope="module")
def inv(tmp_path_factory):
    with sandbox_fleet("b") as first:
        yield from _groups(first, tmp_path_factory)


def _groups(first: int, tmp_path_factory):
    import yaml
    from specdeploy.testing import sandbox
    sandbox.down()
    hosts = sandbox.up(4, first=first)
    sandbox.artifacts()
    d = sandbox.write_inventory(hosts, tmp_path_factory.mktemp("inv") / "sandbox", "vllm", "venv")
    doc = yaml.safe_load((d / "hosts.yml").read_text())
    engines = doc["all"]["children"]["specdeploy_engines"]
    engines["children"] = {g: {"vars": {"specdeploy_group": g},
                               "hosts": {h: engines["hosts"][h] for h in members}}
                           for g, members in (("kimi_a", [H1, H2]), ("kimi_b", [H3, H4]))}
    del engines["hosts"]
    (d / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    gv = d / "group_vars" / "specdeploy_engines.yml"
    data = yaml.safe_load(gv.read_text())
    data.update({"specdeploy_topology": "tp", "specdeploy_rdma": True,
                 "specdeploy_engine_env": {**data["specdeploy_engine_env"], "SPECDEPLOY_SIM_GROUP_TIMEOUT": "120"}})
    gv.write_text(yaml.safe_dump(data, sort_keys=False))
    yield d
    sandbox.down()


def _argv(host: str) -> str:
    return ssh(ADDR[host], "cat /etc/specdeploy/specdeploy-vllm.argv")


def _closed(host: str, port: int = 8000) -> bool:
    try:
        urllib.request.urlopen(f"http://{ADDR[host]}:{port}/health", timeout=5)
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError) or "refused" in str(exc.reason)
    return False


def _router_workers() -> set[str]:
    body = json.load(urllib.request.urlopen(f"{ROUTER}/workers", timeout=10))
    return {w["url"] for w in body["workers"]}


def _serves_as_groups(layout_flag: str) -> None:
    for lead, follow in zip(LEADERS, FOLLOWERS):
        assert chat(f"http://{ADDR[lead]}:8000")["choices"][0]["message"]["content"]
        assert _closed(follow)  # headless: no API server on the follower
        assert ssh(ADDR[follow], "systemctl is-active specdeploy-vllm").strip() == "active"
        assert layout_flag in _argv(lead) and layout_flag in _argv(follow)
        assert "--headless" in _argv(follow) and "--headless" not in _argv(lead)
        assert ssh(ADDR[follow], "test -e /etc/systemd/system/specdeploy-exporter.service || echo none").strip() \
            == "none"
    assert _router_workers() == {f"http://{ADDR[h]}:8000" for h in LEADERS}
    assert chat(ROUTER)["choices"]


def test_two_groups_of_two_deploy_with_cross_host_tensor_parallelism(inv):
    rc, out, _ = play(inv, playbook="site.yml")
    assert rc == 0, out[-4000:]
    _serves_as_groups("--nnodes")
    for lead, follow in zip(LEADERS, FOLLOWERS):
        assert re.search(r"--tensor-parallel-size 16\b", _argv(lead)), _argv(lead)
        assert f"--node-rank 1 --master-addr {ADDR[lead]}" in _argv(follow), _argv(follow)
    # Prometheus scrapes the leaders' engines and exporters, and every host's node exporter
    deadline = time.time() + 60
    while True:
        t = json.load(urllib.request.urlopen(f"http://{ADDR[H1]}:9090/api/v1/targets", timeout=10))
        jobs: dict[str, set] = {}
        for x in t["data"]["activeTargets"]:
            jobs.setdefault(x["labels"]["job"], set()).add((x["labels"]["host"], x["health"]))
        if {(H1, "up"), (H3, "up")} <= jobs.get("specdeploy_exporter", set()) or time.time() > deadline:
            break
        time.sleep(3)
    assert {h for h, _ in jobs["specdeploy_engine"]} == set(LEADERS)
    assert {h for h, _ in jobs["node"]} == set(ADDR)


def _dist_port_errors(inv, limit: str) -> list[dict]:
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "preflight", "-i", str(inv), "--hosts", "--json",
                        "--limit", limit], capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1) and r.stdout.strip(), r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(r.stdout)
    findings = [f for rep in (doc.get("hosts") or doc).values() if isinstance(rep, dict)
                for f in rep.get("findings", [])]
    return [f for f in findings if f.get("subject") == "specdeploy_dist_port" and f.get("severity") == "error"]


def test_preflight_hosts_checks_each_follower_reaches_its_leaders_rendezvous(inv):
    """Each follower connects to its leader's rendezvous port from its own network; when the leader's host drops
    what the follower sends (a blackhole route in the leader's network namespace: its answers go nowhere), the
    follower is refused with the leader, the port and the reason, within the check's few seconds."""
    from specdeploy.testing.sandbox import SandboxHost
    assert _dist_port_errors(inv, f"{H2},{H4}") == []
    leader_ns = SandboxHost(H1, N).netns
    route = ["ip", "-n", leader_ns, "route", "add", "blackhole", f"{ADDR[H2]}/32"]
    import subprocess
    subprocess.run(route, check=True)
    try:
        t0 = time.monotonic()
        [err] = _dist_port_errors(inv, H2)
        assert time.monotonic() - t0 < 60
    finally:
        subprocess.run(["ip", "-n", leader_ns, "route", "del", "blackhole", f"{ADDR[H2]}/32"], check=True)
    assert err["host"] == H2 and f"cannot reach the leader {H1} at {ADDR[H1]}:29501" in \
        err["message"] and "no answer within 3 s" in err["message"], err
    assert chat(f"http://{ADDR[H1]}:8000")["choices"]  # the check's connection did not disturb the group


def test_a_batch_that_would_split_a_group_is_refused_before_anything_changes(inv):
    before = {h: _argv(h) for h in ADDR}
    rc, out, _ = play(inv, "specdeploy_topology=dp_ep", "specdeploy_serial=1", "specdeploy_spec_num_tokens=5")
    assert rc != 0
    assert "a group deploys and rolls back as one unit" in out and "multiple of the group's 2 hosts" in out, \
        out[-3000:]
    assert {h: _argv(h) for h in ADDR} == before


def test_the_groups_switch_to_dp_attention_and_expert_parallelism_group_by_group_under_load(inv):
    """One variable (specdeploy_topology) switches both groups to data-parallel attention with expert parallelism,
    rolled out a group per batch under load, with a drafter change in the same run: no request fails."""
    with UnderLoad(lambda: chat(ROUTER, timeout=60)) as stats:
        rc, out, _ = play(inv, "specdeploy_topology=dp_ep", "specdeploy_serial=2", "specdeploy_spec_num_tokens=4")
    assert rc == 0, out[-4000:]
    # one batch per group, and only the leaders go out of and back into the router
    assert out.count("Take the replica out of the router") >= 2, out[-3000:]
    assert stats["ok"] > 50 and stats["failed"] == 0, stats
    for h in ADDR:
        assert '"num_speculative_tokens":4' in _argv(h).replace("\\", "")
    _serves_as_groups("--enable-expert-parallel")
    for lead, follow in zip(LEADERS, FOLLOWERS):
        assert "--data-parallel-size 16 --data-parallel-size-local 8" in _argv(follow)
        assert "--data-parallel-start-rank 8" in _argv(follow) and "--nnodes" not in _argv(follow)


def test_a_follower_crash_fails_its_group_fast_names_the_rank_and_rolls_it_back_while_the_other_serves(inv):
    import yaml
    before = {h: ssh(ADDR[h], "cat /var/lib/specdeploy/current").strip() for h in (H3, H4)}
    group = yaml.safe_load((inv / "group_vars/specdeploy_engines.yml").read_text())
    hv = inv / "host_vars"
    hv.mkdir(exist_ok=True)
    (hv / f"{H4}.yml").write_text(yaml.safe_dump({"specdeploy_engine_env": {
        **group["specdeploy_engine_env"], "SPECDEPLOY_SIM_CRASH": "load", "SPECDEPLOY_SIM_LOAD_SECONDS": "1"}}))
    stop = threading.Event()
    served = {"ok": 0, "failed": 0}

    def other_group():  # kimi_a keeps serving, straight at its leader
        while not stop.is_set():
            try:
                chat(f"http://{ADDR[H1]}:8000", timeout=30)
                served["ok"] += 1
            except Exception:  # noqa: BLE001
                served["failed"] += 1
            time.sleep(0.1)

    t = threading.Thread(target=other_group)
    t.start()
    try:
        rc, out, _ = play(inv, "specdeploy_topology=dp_ep", "specdeploy_spec_num_tokens=4", limit="kimi_b")
    finally:
        stop.set()
        t.join()
        (hv / f"{H4}.yml").unlink()
    assert rc != 0
    waits = [float(x) for x in re.findall(r"crashed after ([0-9.]+) s", out)]
    assert waits and max(waits) < 60, out[-4000:]  # the group failed within a minute of its start
    assert f"TRIAGE specdeploy-vllm.service on {H4}" in out
    flat = re.sub(r"\s+", " ", out.replace("\\\n", ""))  # Ansible wraps long messages
    assert f"(serving group kimi_b, ranks {H3}, {H4}): rank 1 ({H4}): AttributeError" in flat, out[-4000:]
    assert "image_token_index" in out
    assert out.count("Rolled back to release") >= 2  # both ranks of the group
    for h in (H3, H4):
        assert ssh(ADDR[h], "cat /var/lib/specdeploy/current").strip() == before[h]
    assert "SPECDEPLOY_SIM_CRASH" not in ssh(ADDR[H4], "cat /etc/specdeploy/specdeploy-vllm.env")
    assert chat(f"http://{ADDR[H3]}:8000")["choices"][0]["message"]["content"]  # kimi_b serves again
    assert served["ok"] > 10 and served["failed"] == 0, served


def _counter(host: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{ADDR[host]}:8000/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_pd_layout_behind_the_router_in_pd_mode_sends_each_request_through_prefill_and_decode(inv):
    """The same two groups as prefill/decode pairs on SGLang (vLLM's pd is refused): sglang-router in PD mode
    sends each request to a prefill and a decode instance with one bootstrap room; the decode instance takes the
    prompt's KV from the prefill's bootstrap port, then decodes."""
    import yaml
    from specdeploy.engines import get
    hv = inv / "host_vars"
    hv.mkdir(exist_ok=True)
    roles = {H1: "prefill", H2: "decode", H3: "prefill", H4: "decode"}
    for h, role in roles.items():
        (hv / f"{h}.yml").write_text(yaml.safe_dump({"specdeploy_pd_role": role}))
    pd = json.dumps({"specdeploy_engine": "sglang", "specdeploy_engine_version": get("sglang").sandbox_version,
                     "specdeploy_topology": "pd"})
    try:
        rc, out, _ = play(inv, pd)
        assert rc == 0, out[-4000:]
        unit = ssh(ADDR[H1], "cat /etc/systemd/system/specdeploy-router.service")
        assert "--pd-disaggregation" in unit and unit.count("--prefill") == 2 and unit.count("--decode") == 2
        for h, role in roles.items():
            assert f"--disaggregation-mode {role}" in ssh(ADDR[h], "cat /etc/specdeploy/specdeploy-sglang.argv")
        deadline = time.time() + 60  # the router registers instances as their health checks pass
        while time.time() < deadline:
            body = json.load(urllib.request.urlopen(f"{ROUTER}/workers", timeout=10))
            if body["stats"]["prefill_count"] == 2 and body["stats"]["decode_count"] == 2 and all(
                    w["is_healthy"] for w in body["workers"]):
                break
            time.sleep(2)
        assert body["stats"] == {**body["stats"], "prefill_count": 2, "decode_count": 2}, body
        before = {h: (_counter(h, "sglang:prompt_tokens_total"), _counter(h, "sglang:generation_tokens_total"))
                  for h in roles}
        for _ in range(8):
            assert chat(ROUTER)["choices"][0]["message"]["content"]
        after = {h: (_counter(h, "sglang:prompt_tokens_total"), _counter(h, "sglang:generation_tokens_total"))
                 for h in roles}
        prompt = {h: after[h][0] - before[h][0] for h in roles}
        gen = {h: after[h][1] - before[h][1] for h in roles}
        assert sum(prompt[h] for h in (H1, H3)) > 0, prompt  # prompts computed on prefill...
        assert prompt[H2] == prompt[H4] == 0, prompt  # ...and never on decode
        assert sum(gen[h] for h in (H2, H4)) >= 8 * 8, gen  # the answers decoded on decode
    finally:
        for h in roles:
            (hv / f"{h}.yml").unlink(missing_ok=True)
