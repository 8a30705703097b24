"""Serving groups: ranks from the inventory, each rank's command line, the group-level refusals, and the Ansible
filters rendering what `specdeploy plan` renders."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import yaml

from specdeploy.hostvars import inventory as inv_mod
from specdeploy.plan import plan, render_host
from specdeploy.topology import Member, inventory_ranks, resolve, router_workers
from specdeploy.values.errors import SpecdeployError

BASE = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": "h200_nvl8",
        "specdeploy_model_path": "/models/kimi", "specdeploy_served_model_name": "kimi"}


def write_inventory(tmp_path, groups: dict[str, tuple[dict, list[str]]], common: dict | None = None):
    """groups: name -> (group vars, host names); host i gets ansible_host 127.0.1.<i>."""
    n = 0
    children = {}
    for name, (gvars, hosts) in groups.items():
        hs = {}
        for h in hosts:
            n += 1
            hs[h] = {"ansible_host": f"127.0.1.{n}"}
        children[name] = {"vars": gvars, "hosts": hs}
    doc = {"all": {"children": {"specdeploy_engines": {"vars": {**BASE, **(common or {})}, "children": children}}}}
    p = tmp_path / "hosts.yml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def argv_of(plans, host):
    return next(p for h, _, p in plans if h == host).argv


def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_vllm_tp_across_two_hosts_leader_and_headless_follower(tmp_path):
    inv = write_inventory(tmp_path, {"kimi_a": ({"specdeploy_topology": "tp", "specdeploy_group": "kimi_a",
                                                 "specdeploy_dist_interface": "ib0"}, ["a1", "a2"])})
    _, plans, _ = plan(str(inv))
    lead, follow = argv_of(plans, "a1"), argv_of(plans, "a2")
    for argv, rank in ((lead, "0"), (follow, "1")):
        assert flag(argv, "--tensor-parallel-size") == "16"
        assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == rank
        assert flag(argv, "--master-addr") == "127.0.1.1" and flag(argv, "--master-port") == "29501"
        assert flag(argv, "--distributed-executor-backend") == "mp"
    assert "--headless" not in lead and "--headless" in follow
    p = {h: pl for h, _, pl in plans}
    assert p["a1"].serves and not p["a2"].serves
    assert p["a2"].env["NCCL_SOCKET_IFNAME"] == "ib0" and p["a2"].env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert p["a2"].env["VLLM_HOST_IP"] == "127.0.1.2"
    assert p["a1"].release_id() != p["a2"].release_id()


def test_vllm_dp_ep_start_ranks_cover_every_gpu_once(tmp_path):
    inv = write_inventory(tmp_path, {"g": ({"specdeploy_topology": "dp_ep", "specdeploy_group": "g"},
                                           ["b1", "b2", "b3"])})
    _, plans, _ = plan(str(inv))
    starts = []
    for h in ("b1", "b2", "b3"):
        argv = argv_of(plans, h)
        assert flag(argv, "--data-parallel-size") == "24" and flag(argv, "--data-parallel-size-local") == "8"
        assert flag(argv, "--tensor-parallel-size") == "1" and "--enable-expert-parallel" in argv
        assert flag(argv, "--data-parallel-address") == "127.0.1.1"
        starts.append(int(flag(argv, "--data-parallel-start-rank") or 0))
        assert ("--headless" in argv) == (h != "b1")
    assert starts == [0, 8, 16]


@pytest.mark.parametrize("version,spelling", [("0.5.21", ["--dp-size", "16", "--enable-dp-attention"]),
                                              ("0.5.22", ["--attn-dp-size", "16"])])
def test_sglang_dp_attention_spelled_as_the_pinned_release_takes_it(tmp_path, version, spelling):
    inv = write_inventory(tmp_path, {"g": ({"specdeploy_topology": "dp_ep", "specdeploy_group": "g"}, ["s1", "s2"])},
                          {"specdeploy_engine": "sglang", "specdeploy_engine_version": version})
    _, plans, _ = plan(str(inv))
    argv = argv_of(plans, "s2")
    i = argv.index(spelling[0])
    assert argv[i:i + len(spelling)] == spelling
    assert flag(argv, "--tp-size") == "16" and flag(argv, "--ep-size") == "16"
    assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == "1"
    assert flag(argv, "--dist-init-addr") == "127.0.1.1:29501"
    assert argv.count("--ep-size") == 1


def test_sglang_pd_roles_and_the_router_in_pd_mode(tmp_path):
    pd = {"specdeploy_topology": "pd", "specdeploy_group": "pd1", "specdeploy_router": "sglang-router"}
    inv = write_inventory(tmp_path, {"pre": ({**pd, "specdeploy_pd_role": "prefill"}, ["p1"]),
                                     "dec": ({**pd, "specdeploy_pd_role": "decode"}, ["d1", "d2"])},
                          {"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.23"})
    loaded, plans, _ = plan(str(inv))
    assert flag(argv_of(plans, "p1"), "--disaggregation-mode") == "prefill"
    assert flag(argv_of(plans, "p1"), "--disaggregation-bootstrap-port") == "8998"
    assert flag(argv_of(plans, "d1"), "--disaggregation-mode") == "decode"
    assert "--disaggregation-bootstrap-port" not in argv_of(plans, "d1")
    assert all(flag(argv_of(plans, h), "--disaggregation-transfer-backend") == "nixl" for h in ("p1", "d1", "d2"))
    assert all(p.serves for _, _, p in plans)
    members = [Member(h.name, h.address, h.hv) for h in loaded.engine_hosts]
    w = router_workers(members, inventory_ranks(loaded))
    assert w == {"prefill": [("http://127.0.1.1:8000", 8998)],
                 "decode": ["http://127.0.1.2:8000", "http://127.0.1.3:8000"]}


def test_a_limited_plan_renders_a_follower_from_its_whole_group(tmp_path):
    inv = write_inventory(tmp_path, {"g": ({"specdeploy_topology": "tp", "specdeploy_group": "g"}, ["a1", "a2"])})
    _, whole, _ = plan(str(inv))
    _, limited, _ = plan(str(inv), limit="a2")
    assert [h for h, _, _ in limited] == ["a2"]
    assert limited[0][2].files == next(p for h, _, p in whole if h == "a2").files


@pytest.mark.parametrize("groups,common,field,words", [
    ({"g": ({"specdeploy_topology": "tp", "specdeploy_group": "g"}, ["a1", "a2"])},
     {"specdeploy_hardware": "rtx_pro_6000_pcie"}, "specdeploy_topology", ("RDMA", "a1, a2")),
    ({"g": ({"specdeploy_topology": "tp", "specdeploy_group": "g"}, ["a1"])}, {}, "specdeploy_group g",
     ("one host",)),
    ({"g": ({"specdeploy_group": "g"}, ["a1", "a2"])}, {}, "specdeploy_group g", ("single",)),
    ({"g": ({"specdeploy_topology": "pd", "specdeploy_group": "g", "specdeploy_pd_role": "decode",
             "specdeploy_router": "sglang-router"}, ["a1"])},
     {"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.23"}, "specdeploy_group g", ("prefill",)),
    ({"g": ({"specdeploy_topology": "pd", "specdeploy_group": "g", "specdeploy_pd_role": "decode"}, ["a1"]),
      "h": ({"specdeploy_topology": "pd", "specdeploy_group": "g", "specdeploy_pd_role": "prefill"}, ["a2"])},
     {"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.23"}, "specdeploy_router", ("PD mode",)),
])
def test_a_group_its_layout_cannot_serve_is_refused_naming_the_field(tmp_path, groups, common, field, words):
    inv = write_inventory(tmp_path, groups, common)
    with pytest.raises(SpecdeployError) as e:
        plan(str(inv))
    hit = [f for f in e.value.problems if f.subject == field]
    assert hit, [f.subject for f in e.value.problems]
    assert all(w in hit[0].message for w in words), hit[0].message


def test_hosts_of_one_group_that_disagree_are_refused(tmp_path):
    inv = write_inventory(tmp_path, {"g": ({"specdeploy_topology": "tp", "specdeploy_group": "g"}, ["a1", "a2"])})
    doc = yaml.safe_load(inv.read_text())
    doc["all"]["children"]["specdeploy_engines"]["children"]["g"]["hosts"]["a2"]["specdeploy_engine_version"] = \
        "0.17.1"
    inv.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecdeployError) as e:
        plan(str(inv))
    f = e.value.problems[0]
    assert f.subject == "specdeploy_engine_version" and "a1: '0.16.0'; a2: '0.17.1'" in f.message


def test_generated_groups_keep_the_rank_invariants():
    """Random group sizes, GPU counts and DP widths: every GPU of a group is one DP rank exactly once, node ranks
    are 0..N-1, every rank names the leader, and only the leader serves."""
    from specdeploy.hostvars.schema import validate_host
    rng = random.Random(30)
    for trial in range(60):
        gpus = rng.choice([1, 2, 4, 8])
        size = rng.randint(2, 5)
        tp = rng.choice([d for d in (1, 2, 4, 8) if gpus % d == 0])
        layout = rng.choice(["tp", "dp_ep"])
        engine, version = rng.choice([("vllm", "0.16.0"), ("vllm", "0.33.0"), ("sglang", "0.5.21"),
                                      ("sglang", "0.5.23")])
        v = {**BASE, "specdeploy_engine": engine, "specdeploy_engine_version": version,
             "specdeploy_hardware": "custom", "specdeploy_topology": layout, "specdeploy_group": "g",
             "specdeploy_hardware_custom": {"gpu_count": gpus, "gpu_memory_gib": 80, "compute_capability": "9.0",
                                            "interconnect": "nvlink", "rdma": True}}
        if layout == "dp_ep":
            v["specdeploy_tensor_parallel_size"] = tp
        members = [Member(f"n{i}", f"10.9.{trial}.{i}", validate_host(f"n{i}", v)) for i in range(size)]
        ranks = resolve(members)
        argvs = [render_host(m.name, m.hv, m.address, ranks[m.name]).argv for m in members]
        nodes = [int(flag(a, "--node-rank") or 0) for a in argvs]
        if engine == "vllm" and layout == "dp_ep":
            starts = sorted(int(flag(a, "--data-parallel-start-rank") or 0) for a in argvs)
            local = int(flag(argvs[0], "--data-parallel-size-local"))
            assert starts == list(range(0, gpus // tp * size, local)) and local == gpus // tp
            assert int(flag(argvs[0], "--data-parallel-size")) == gpus * size // tp
            assert {flag(a, "--data-parallel-address") for a in argvs} == {"10.9.%d.0" % trial}
        else:
            assert nodes == list(range(size))
            lead = {flag(a, "--master-addr") or flag(a, "--dist-init-addr").rsplit(":", 1)[0] for a in argvs}
            assert lead == {"10.9.%d.0" % trial}
        if engine == "vllm":
            assert ["--headless" in a for a in argvs] == [False] + [True] * (size - 1)
        else:
            world = gpus * size
            assert {flag(a, "--tp-size") for a in argvs} == {str(world)}


def _filters():
    from helpers import ansible_filters
    return ansible_filters()


def test_the_ansible_filters_render_the_plans_and_router_the_cli_renders(tmp_path):
    inv = write_inventory(tmp_path, {"g": ({"specdeploy_topology": "dp_ep", "specdeploy_group": "g",
                                            "specdeploy_router": "sglang-router"}, ["b1", "b2"]),
                                     "one": ({"specdeploy_router": "sglang-router"}, ["c1"])})
    loaded, plans, _ = plan(str(inv))
    f = _filters()
    hostvars = loaded.all_vars
    hosts = [h.name for h in loaded.engine_hosts]
    for h, _, p in plans:
        got = f.specdeploy_plan(hostvars[h], h, None, hostvars, hosts)
        assert got["files"] == p.files and got["release"] == p.release_id() and got["rank"] == p.rank
    unit = f.specdeploy_router_unit(hostvars, hosts, 30080, "/opt/r")
    assert "http://127.0.1.1:8000" in unit and "http://127.0.1.3:8000" in unit
    assert "127.0.1.2" not in unit  # the follower is headless: the router never sends it a request


def test_plan_cli_shows_each_rank(tmp_path):
    inv = write_inventory(tmp_path, {"g": ({"specdeploy_topology": "tp", "specdeploy_group": "g"}, ["a1", "a2"])})
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "plan", "-i", str(inv), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    ranks = {h: d["hosts"][h]["rank"] for h in ("a1", "a2")}
    assert ranks["a2"]["rank"] == 1 and ranks["a2"]["leader"] == "a1" and ranks["a1"]["rank"] == 0
    assert d["hosts"]["a1"]["serves"] and not d["hosts"]["a2"]["serves"]
    assert inv_mod.load(inv).group_hosts[1].name == "a2"
