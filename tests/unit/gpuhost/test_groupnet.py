"""preflight --hosts for serving groups: each rank's RDMA devices, interface, address and ports, read by the real
gather script (run here on this machine's own ip, ss and sysfs), and the group refusals on the hosts they name."""
from __future__ import annotations

import subprocess

import yaml

from specdeploy.gpuhost import groupnet, remote
from specdeploy.gpuhost.report import facts_from_sections, gather_script, split_sections


def local_probe(name, variables, reach=None):
    """The gather script run by this machine's sh: the facts of a real host without GPUs."""
    r = subprocess.run(["sh", "-s"], input=gather_script(reach), capture_output=True, text=True, timeout=120)
    return facts_from_sections(split_sections(r.stdout)), None


def inventory(tmp_path, hardware="h200_nvl8", **gvars):
    doc = {"all": {"children": {"specdeploy_engines": {
        "vars": {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": hardware,
                 "specdeploy_model_path": "/models/kimi", "specdeploy_topology": "tp", "specdeploy_group": "g",
                 **gvars},
        "hosts": {"r0": {"ansible_host": "127.0.0.1"}, "r1": {"ansible_host": "127.0.0.1"}}}}}}
    p = tmp_path / "hosts.yml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_the_gather_script_reads_this_machines_interfaces_and_ports():
    facts, _ = local_probe("here", {})
    assert facts.interfaces is not None and "127.0.0.1" in facts.interfaces.get("lo", [])
    assert facts.rdma is not None  # read, whether or not the machine has RDMA devices
    assert facts.listening is not None


def test_parsers_on_sysfs_and_iproute_lines():
    assert groupnet.parse_rdma("mlx5_0 1 4: ACTIVE\nmlx5_1 1 1: DOWN\n") == {"mlx5_0": ["ACTIVE"],
                                                                            "mlx5_1": ["DOWN"]}
    ifs = groupnet.parse_interfaces("2: ib0    inet 10.0.0.5/24 brd 10.0.0.255 scope global ib0\\\n"
                                    "3: eth0.100@eth0    inet6 fd00::5/64 scope global\\\n")
    assert ifs == {"ib0": ["10.0.0.5"], "eth0.100": ["fd00::5"]}
    assert groupnet.parse_listening("LISTEN 0 128 0.0.0.0:29501 0.0.0.0:*\nLISTEN 0 4096 [::]:22 [::]:*\n") \
        == {29501, 22}


def test_each_rank_without_rdma_devices_is_refused_naming_the_host(tmp_path):
    facts, _ = local_probe("here", {})
    reps = remote.preflight_hosts(inventory(tmp_path, specdeploy_dist_interface="lo"), probe_fn=local_probe)
    for host in ("r0", "r1"):
        rdma = [f for f in reps[host].errors if f.subject == "RDMA"]
        if facts.rdma:  # a machine with RDMA devices: only inactive ports would be refused
            continue
        assert rdma and rdma[0].host == host and "no RDMA device" in rdma[0].message
        assert not [f for f in reps[host].errors if f.subject.startswith("specdeploy_dist")]


def test_a_missing_interface_and_an_address_not_on_it_are_refused(tmp_path):
    reps = remote.preflight_hosts(inventory(tmp_path, specdeploy_dist_interface="ib7"), probe_fn=local_probe)
    [f] = [f for f in reps["r1"].errors if f.subject == "specdeploy_dist_interface"]
    assert "ib7 does not exist" in f.message and "lo" in f.message
    reps = remote.preflight_hosts(inventory(tmp_path, specdeploy_dist_interface="lo",
                                            specdeploy_dist_address="127.9.9.9"), probe_fn=local_probe)
    [f] = [f for f in reps["r0"].errors if f.subject == "specdeploy_dist_address"]
    assert "127.9.9.9" in f.message and "127.0.0.1" in f.message


def test_cross_host_tp_on_a_profile_without_rdma_is_refused_naming_the_hosts(tmp_path):
    reps = remote.preflight_hosts(inventory(tmp_path, hardware="rtx_pro_6000_pcie"), probe_fn=local_probe)
    found = [f for r in reps.values() for f in r.errors if f.subject == "specdeploy_topology"]
    assert len(found) == 1 and "without RDMA (r0, r1" in found[0].message and "rtx_pro_6000_pcie" in found[0].message
    assert found[0].host == "r0" and found[0] in reps["r0"].errors


def _reach(address, port):
    r = subprocess.run(["sh", "-s"], input=gather_script((address, port)), capture_output=True, text=True,
                       timeout=60)
    return facts_from_sections(split_sections(r.stdout)).reach


def test_the_reach_section_connects_to_the_leaders_rendezvous_port_for_real():
    import socket
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        assert _reach("127.0.0.1", port) == {"dev": "lo", "tcp": "connected"}
    assert _reach("127.0.0.1", port) == {"dev": "lo", "tcp": "refused"}  # nothing listens: the host answered
    assert _reach("x'; touch /tmp/specdeploy-injected; '", 1)["tcp"] != "connected"
    import os
    assert not os.path.exists("/tmp/specdeploy-injected")  # the address is quoted, never run


def test_parse_reach_reads_each_outcome():
    route = "10.0.0.1 dev ib0 src 10.0.0.2 uid 0 \\    cache \n"
    assert groupnet.parse_reach(route + "tcp 0\n") == {"dev": "ib0", "tcp": "connected"}
    assert groupnet.parse_reach(route + "bash: connect: Connection refused\ntcp 1\n")["tcp"] == "refused"
    assert groupnet.parse_reach(route + "tcp 124\n")["tcp"] == "timeout"
    assert groupnet.parse_reach("RTNETLINK answers: Network is unreachable\nbash: connect: Network is "
                                "unreachable\ntcp 1\n") == {"dev": None, "tcp": "unreachable"}
    assert groupnet.parse_reach("") == {"dev": None, "tcp": None}


def test_a_follower_that_cannot_reach_its_leader_is_refused_and_a_wrong_route_warned(tmp_path):
    def probe(reach_to):
        def fn(name, variables, reach=None):
            facts, err = local_probe(name, variables)
            if reach is not None:
                facts.reach = reach_to
            return facts, err
        return fn
    inv = inventory(tmp_path, specdeploy_dist_interface="lo")
    reps = remote.preflight_hosts(inv, probe_fn=probe({"dev": "lo", "tcp": "timeout"}))
    [f] = [f for f in reps["r1"].errors if f.subject == "specdeploy_dist_port"]
    assert f.host == "r1" and "cannot reach the leader r0 at 127.0.0.1:29501" in f.message and "3 s" in f.message
    assert not [f for f in reps["r0"].errors if f.subject == "specdeploy_dist_port"]  # the leader joins nobody
    reps = remote.preflight_hosts(inv, probe_fn=probe({"dev": "eth9", "tcp": "refused"}))
    assert not [f for f in reps["r1"].errors if f.subject == "specdeploy_dist_port"]  # refused: the host answered
    [w] = [f for f in reps["r1"].findings if f.severity == "warning" and f.subject == "specdeploy_dist_interface"]
    assert "leaves by eth9" in w.message and "told to use lo" in w.message


def test_each_follower_probes_its_own_leader(tmp_path):
    seen = {}

    def fn(name, variables, reach=None):
        seen[name] = reach
        return local_probe(name, variables)
    remote.preflight_hosts(inventory(tmp_path, specdeploy_dist_interface="lo", specdeploy_dist_port=29777),
                           probe_fn=fn)
    assert seen == {"r0": None, "r1": ("127.0.0.1", 29777)}
