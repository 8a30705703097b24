"""A serving group moves as one unit: its mates, its start waves, rolling batches that keep it whole, and the
Ansible filters the deploy uses for them (the follower serves no HTTP: no exporter, no scrape target)."""
from __future__ import annotations

import random

import pytest
import yaml

from specdeploy.hostvars import inventory as inv_mod
from specdeploy.plan import plan
from specdeploy.plan.render.prometheus import render_prometheus
from specdeploy.topology import batch_problems, inventory_ranks, mates, serial_problems, start_order

from test_groups import _filters, write_inventory  # noqa: E402  (same directory)

TP = {"specdeploy_topology": "tp", "specdeploy_dist_interface": "ib0"}


def _inv(tmp_path, layout="tp", n_groups=2, size=2, singles=1):
    groups = {f"g{i}": ({**TP, "specdeploy_topology": layout, "specdeploy_group": f"g{i}"},
                        [f"g{i}h{j}" for j in range(size)]) for i in range(n_groups)}
    if singles:
        groups["solo"] = ({}, [f"s{j}" for j in range(singles)])
    return write_inventory(tmp_path, groups)


def _ranks(path):
    return inventory_ranks(inv_mod.load(str(path)))


def test_mates_and_start_waves(tmp_path):
    ranks = _ranks(_inv(tmp_path))
    assert mates("g0h1", ranks) == ["g0h0", "g0h1"] and mates("s0", ranks) == ["s0"]
    hosts = ["g0h0", "g0h1", "g1h0", "g1h1", "s0"]
    assert start_order(hosts, ranks) == [["g0h1", "g1h1"], ["g0h0", "g1h0", "s0"]]


@pytest.mark.parametrize("size", [2, 3, 4])
def test_every_batch_that_splits_a_group_is_refused_and_whole_ones_pass(tmp_path, size):
    ranks = _ranks(_inv(tmp_path, size=size))
    order = [h for g in ("g0", "g1") for h in (f"{g}h{j}" for j in range(size))] + ["s0"]
    rng = random.Random(size)
    for _ in range(200):  # random batches: refused exactly when some group is neither all in nor all out
        batch = [h for h in order if rng.random() < 0.5]
        split = any(0 < sum(f"{g}h{j}" in batch for j in range(size)) < size for g in ("g0", "g1"))
        found = batch_problems(batch, ranks)
        assert bool(found) == split, batch
        for f in found:
            assert f.subject == "specdeploy_serial" and "one unit" in f.message and str(size) in f.fix
    assert serial_problems(size, order, ranks) == []
    assert serial_problems(str(size * 2), order, ranks) == []
    assert serial_problems("100%", order, ranks) == []
    bad = serial_problems(1, order, ranks)
    assert bad and {f.host for f in bad} == {"g0h0", "g1h0"}


def test_the_deploy_filters_give_the_group_and_skip_the_followers_scrape_targets(tmp_path):
    path = _inv(tmp_path)
    loaded = inv_mod.load(str(path))
    f = _filters()
    hv, hosts = loaded.all_vars, [h.name for h in loaded.engine_hosts]
    lead, follow, solo = (f.specdeploy_group(hv, h, hosts) for h in ("g0h0", "g0h1", "s0"))
    assert lead["serves"] and not follow["serves"] and solo["serves"]
    assert follow["leader"] == "g0h0" and follow["leader_url"] == "http://127.0.1.1:8000"
    assert follow["wave"] == 0 and lead["wave"] == 1 and solo["mates"] == ["s0"] and not solo["multi_host"]
    assert f.specdeploy_batch_problems(hv, hosts, ["g0h0", "s0"])
    assert f.specdeploy_batch_problems(hv, hosts, ["g0h0", "g0h1"]) == []
    targets = f.specdeploy_targets(hv, hosts)
    cfg = yaml.safe_load(render_prometheus(targets))
    jobs = {j["job_name"]: [t["targets"][0] for t in j["static_configs"]] for j in cfg["scrape_configs"]}
    followers = {"127.0.1.2:8000", "127.0.1.4:8000"}
    assert not followers & set(jobs["specdeploy_engine"]) and "127.0.1.1:8000" in jobs["specdeploy_engine"]
    assert len(jobs["node"]) == 5  # every host still has its node exporter scraped
    # every target is labelled with its serving group (a host that serves alone is its own), so the dashboard
    # aggregates per group and a headless rank's GPUs show under its group
    labels = {j["job_name"]: {t["labels"]["host"]: t["labels"]["group"] for t in j["static_configs"]}
              for j in cfg["scrape_configs"]}
    assert labels["dcgm"]["g0h1"] == labels["dcgm"]["g0h0"] == labels["specdeploy_exporter"]["g0h0"]
    assert labels["specdeploy_exporter"]["s0"] == "s0" and labels["dcgm"]["g0h0"] != labels["dcgm"]["g1h0"]
    _, plans, _ = plan(str(path))
    p = {h: pl for h, _, pl in plans}
    assert "/etc/systemd/system/specdeploy-exporter.service" not in p["g0h1"].files
    assert "/etc/systemd/system/specdeploy-exporter.service" in p["g0h0"].files and p["g0h1"].exporter_unit is None


def test_group_root_prefers_the_rank_that_says_why():
    from specdeploy.triage import group_root, triage_lines
    lead = triage_lines(["(EngineCore_DP0 pid=1) ERROR 12-03 08:54:24 [core.py:825] RuntimeError: Connection closed "
                         "by peer [10.0.0.2 (rank 1)]"]).to_dict()
    follow = triage_lines(["Traceback (most recent call last):", '  File "x.py", line 1, in load_model',
                           "AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'"]).to_dict()
    assert group_root([("a", lead), ("b", follow)])[0] == "b"
    assert group_root([("a", lead), ("b", {"root_cause": None})])[0] == "a"  # only the lost-peer line: still said
    assert group_root([("a", {}), ("b", {"root_cause": None})]) is None


def test_batch_sizes_follow_ansibles_serial():
    from specdeploy.topology import batch_sizes
    assert batch_sizes("100%", 5) == [5] and batch_sizes(2, 5) == [2, 2, 1] and batch_sizes("30%", 10) == [3] * 3 + [1]
    assert batch_sizes("1%", 10) == [1] * 10  # rounded down, at least one
    assert batch_sizes([1, "50%"], 9) == [1, 4, 4]  # a list: the last value repeats
    assert batch_sizes("x%", 4) is None


def test_rolling_batches_start_with_one_group_and_never_cut_one(tmp_path):
    from specdeploy.topology import batch_sizes, rolling_batches
    ranks = _ranks(_inv(tmp_path, n_groups=6, size=3, singles=7))
    order = [f"g{i}h{j}" for i in range(6) for j in range(3)] + [f"s{j}" for j in range(7)]
    sizes = rolling_batches(order, ranks, 10)
    assert sum(sizes) == len(order) and sizes[0] == 3  # the canary: the first group, whole
    start = 0
    for n in sizes:
        assert batch_problems(order[start:start + n], ranks) == []
        start += n
    assert serial_problems(sizes, order, ranks) == [] and batch_sizes(sizes, len(order)) == sizes
    assert rolling_batches([f"s{j}" for j in range(7)], ranks, 30) == [1, 2, 2, 2]  # singles: one host first


def test_the_rollout_filter_rolls_a_fleet_within_its_budget_and_names_disagreeing_hosts(tmp_path):
    path = _inv(tmp_path, n_groups=2, size=2, singles=20)
    loaded = inv_mod.load(str(path))
    f = _filters()
    hv, hosts = loaded.all_vars, [h.name for h in loaded.engine_hosts]
    got = f.specdeploy_rollout(hv, hosts, hosts)
    assert got["rolling"] and got["max_fail_percentage"] == 10 and got["serial"][0] == 2 and not got["problems"]
    assert sum(got["serial"]) == len(hosts) == sum(got["batches"])
    small = f.specdeploy_rollout(hv, hosts, hosts[:3])  # a --limit of three hosts of a 24-host fleet still rolls
    assert small["rolling"] and sum(small["batches"]) == 3
    few = {h: {**v, "specdeploy_rolling_from_hosts": 100} for h, v in hv.items()}
    assert f.specdeploy_rollout(few, hosts, hosts) == {"serial": "100%", "max_fail_percentage": 100, "problems": [],
                                                        "batches": [len(hosts)], "rolling": False}
    odd = {h: ({**v, "specdeploy_max_fail_percentage": 30} if h == "s5" else v) for h, v in hv.items()}
    lines = f.specdeploy_rollout(odd, hosts, hosts)["problems"]
    assert len(lines) == 1 and lines[0].startswith("s5: specdeploy_max_fail_percentage is 30")
    cut = {h: {**v, "specdeploy_serial": 1} for h, v in hv.items()}
    assert any("one unit" in p for p in f.specdeploy_rollout(cut, hosts, hosts)["problems"])


class _Counting(dict):
    """hostvars that counts which hosts' variables were read."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read = []

    def __getitem__(self, k):
        self.read.append(k)
        return super().__getitem__(k)


def test_a_hosts_rank_reads_only_its_mates_once_the_deploy_knows_the_groups(tmp_path):
    """The per-host filters (plan, probe, converged check) resolve a rank from the host's mates in the run's
    deploy_groups, not from every engine host: linear over a fleet, and the same rank."""
    path = _inv(tmp_path, n_groups=3, size=2, singles=4)
    loaded = inv_mod.load(str(path))
    f = _filters()
    hosts = [h.name for h in loaded.engine_hosts]
    groups = f.specdeploy_groups(loaded.all_vars, hosts)
    plain_plan = f.specdeploy_plan(loaded.all_vars["g1h1"], "g1h1", None, loaded.all_vars, hosts)
    counting = _Counting(loaded.all_vars)
    mine = {**loaded.all_vars["g1h1"], "deploy_groups": groups}
    got = f.specdeploy_plan(mine, "g1h1", None, counting, hosts)
    assert got == plain_plan and set(counting.read) == {"g1h0"}  # its one mate, not the other nine hosts
    walk = _Counting(loaded.all_vars)
    f.specdeploy_plan(loaded.all_vars["g1h1"], "g1h1", None, walk, hosts)
    assert len(set(walk.read)) == len(hosts) - 1  # without deploy_groups: every other host (the old way)


def test_a_pd_instances_plan_in_the_deploy_checks_its_whole_group(tmp_path):
    """A pd group's instances move alone (each its own mates) but the group is checked whole: with the run's
    deploy_groups each instance's plan still sees the group's prefill and decode hosts (an instance that saw only
    itself was refused for lacking the other role) and equals the plan without them."""
    pd = {"specdeploy_topology": "pd", "specdeploy_group": "pd1", "specdeploy_router": "sglang-router"}
    path = write_inventory(tmp_path, {"pre": ({**pd, "specdeploy_pd_role": "prefill"}, ["p1"]),
                                      "dec": ({**pd, "specdeploy_pd_role": "decode"}, ["d1", "d2"])},
                           {"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.23"})
    loaded = inv_mod.load(str(path))
    f = _filters()
    hosts = [h.name for h in loaded.engine_hosts]
    groups = f.specdeploy_groups(loaded.all_vars, hosts)
    assert [groups[h]["mates"] for h in hosts] == [[h] for h in hosts]
    assert all(groups[h]["members"] == ["p1", "d1", "d2"] for h in hosts)
    for h in hosts:
        counting = _Counting(loaded.all_vars)
        got = f.specdeploy_plan({**loaded.all_vars[h], "deploy_groups": groups}, h, None, counting, hosts)
        assert got == f.specdeploy_plan(loaded.all_vars[h], h, None, loaded.all_vars, hosts)
        assert set(counting.read) == set(hosts) - {h}
