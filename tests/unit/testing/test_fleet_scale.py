"""bench/fleet_scale.py's deploy phase: the bracketed order centres every size's runs on one moment (so a drift in
the machine's speed that is linear in time moves every size alike), and a deploy that did not pass, lost a host or
changed something on its no-op redeploy fails the report."""
from __future__ import annotations

import statistics

import pytest
from helpers import bench_module


@pytest.mark.parametrize("sizes", [[64, 256], [256, 8, 64], [8, 64, 256, 1024], [64]])
def test_every_size_centres_on_the_middle_of_the_run(sizes):
    order = bench_module("fleet_scale").bracketed(sizes)
    assert sorted(set(order)) == sorted(sizes) and order[len(order) // 2] == max(sizes)
    middle = (len(order) - 1) / 2
    for n in sizes:
        assert statistics.fmean(i for i, m in enumerate(order) if m == n) == middle, (n, order)


def _run(n, first_cpu, changed=0, rc=0, recap=None):
    part = {"rc": rc, "wall_s": first_cpu / 2, "cpu_s": first_cpu, "changed": 7 * n, "failed_hosts": [],
            "hosts_in_recap": n if recap is None else recap}
    return {"hosts": n, "started": "00:00:00", "first": part,
            "noop": {**part, "rc": 0, "hosts_in_recap": n, "changed": changed, "cpu_s": n, "wall_s": 1.0}}


def test_a_size_is_the_mean_of_its_runs_and_a_linear_drift_leaves_the_exponent_alone():
    m = bench_module("fleet_scale")
    # per-host cost 7 CPU-s at every size, on a machine that gets 10% slower with each run
    order = m.bracketed([64, 256])
    runs = [_run(n, 7 * n * (1 + 0.1 * i)) for i, n in enumerate(order)]
    summary = m.deploy_summary(runs)
    assert summary[64]["first"]["runs_cpu_s"] == [7 * 64, 7 * 64 * 1.2]
    assert summary[64]["first"]["cpu_s_per_host"] == pytest.approx(7 * 1.1)
    assert summary[256]["first"]["cpu_s_per_host"] == pytest.approx(7 * 1.1)
    assert m.fit({n: d["first"]["cpu_s"] for n, d in summary.items()}) == pytest.approx(1.0)
    # run in order (64 then 256), the same drift reads as growth
    assert m.fit({64: 7 * 64, 256: 7 * 256 * 1.1}) > 1.06
    assert m.deploy_errors(summary) == []


def test_a_failed_deploy_a_lost_host_or_a_change_on_the_noop_is_an_error():
    m = bench_module("fleet_scale")
    errs = m.deploy_errors(m.deploy_summary([_run(8, 50, rc=2), _run(64, 400, recap=63), _run(64, 400, changed=1)]))
    assert errs == ["8 hosts, first deploy: rc [2], hosts in recap [8]",
                    "64 hosts, first deploy: rc [0, 0], hosts in recap [63, 64]",
                    "64 hosts: the no-op redeploy changed [0, 1]"]
