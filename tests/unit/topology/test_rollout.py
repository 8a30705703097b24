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
