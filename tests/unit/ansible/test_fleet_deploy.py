"""The real playbooks' controller side against a simulated fleet (testing/fleetsim.py, docs/fleet.md): the same
plays, filters, serving-group logic and serial batches as a real deploy, every host answered by the test-only
connection plugin from its own state. The sizes (8 to 1,024 hosts) are bench/fleet_scale.py's; here a few hosts
show the behaviour: a first deploy, a no-op redeploy with changed=0, and a rolling deploy in which hosts fail."""
from __future__ import annotations

import re
import shutil

import pytest
import yaml

from specdeploy.testing import fleetsim

# the simulated hosts count module calls from workers forked from an unfrozen controller heap
PROBE = {fleetsim.FREEZE_PROBE: "1"}

ROLLING = {"specdeploy_rolling_from_hosts": 4, "specdeploy_rolling_batch_percent": 34,
           "specdeploy_max_fail_percentage": 50}
# one worker runs the module, so the six-host first deploy is made once
pytestmark = pytest.mark.xdist_group("fleetsim")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """Six simulated hosts after a first deploy, rolling in batches [1, 2, 2, 1] (a canary, then a third of the
    fleet per batch, half of a batch may fail)."""
    base = tmp_path_factory.mktemp("fleet")
    inv, state = base / "inv", base / "state"
    fleetsim.write_inventory(inv, state, 6, extra_group_vars=ROLLING)
    first = fleetsim.playbook(inv, state, log=base / "first.log", timeout=900, env_extra=PROBE)
    return base, first


def test_a_first_deploy_then_a_noop_redeploy_changes_nothing(deployed):
    base, first = deployed
    names = fleetsim.host_names(6)
    assert first.rc == 0, first.output[-3000:]
    assert sorted(first.recap) == sorted(names + ["mon-1"]) and not first.failed_hosts
    assert all(first.recap[h]["changed"] > 0 for h in names)
    assert len(re.findall(r"TASK \[A batch moves whole serving groups", first.output)) == 4  # [1, 2, 2, 1]
    serving = {h: fleetsim.serving_release(base / "state", h) for h in names}
    assert all(serving.values()), serving
    # every module call ran in a worker forked from a frozen controller heap (specdeploy.deploy.forking)
    calls = {h: fleetsim.host_state(base / "state", h) for h in names}
    assert all(c["calls"] > 10 and "unfrozen_module_calls" not in c for c in calls.values()), \
        {h: (c["calls"], c.get("unfrozen_module_calls")) for h, c in calls.items()}
    again = fleetsim.playbook(base / "inv", base / "state", timeout=600)
    assert again.rc == 0 and again.changed == 0, again.output[-3000:]
    assert sorted(again.recap) == sorted(names + ["mon-1"])
    assert {h: fleetsim.serving_release(base / "state", h) for h in names} == serving


def test_a_rolling_deploy_stops_within_its_failure_budget_and_names_each_root_cause(deployed, tmp_path):
    base, first = deployed
    assert first.rc == 0
    shutil.copytree(base / "inv", tmp_path / "inv")
    shutil.copytree(base / "state", tmp_path / "state")
    inv, state = tmp_path / "inv", tmp_path / "state"
    names = fleetsim.host_names(6)
    before = {h: fleetsim.serving_release(state, h) for h in names}
    untouched = _served(fleetsim.host_state(state, "gpu-0005"))
    gv = inv / "group_vars/specdeploy_engines.yml"
    d = yaml.safe_load(gv.read_text())
    d["specdeploy_spec_num_tokens"] = 4  # a new release on every host
    gv.write_text(yaml.safe_dump(d))
    bad = ["gpu-0001", "gpu-0003", "gpu-0004"]  # batch 2: one of two fails (50%, within); batch 3: both (100%)
    fleetsim.set_faults(state, {h: {"crash_when": '"num_speculative_tokens":4'} for h in bad})
    run = fleetsim.playbook(inv, state, timeout=900)
    assert run.rc != 0
    assert sorted(run.failed_hosts) == bad
    after = {h: fleetsim.serving_release(state, h) for h in names}
    # the canary and the healthy host of batch 2 serve the new release; every failed host rolled back to its
    # previous one; the last batch never started (the budget was spent in batch 3) and serves what it served
    assert after["gpu-0000"] not in ("", before["gpu-0000"]) and after["gpu-0002"] not in ("", before["gpu-0002"])
    for h in bad + ["gpu-0005"]:
        assert after[h] == before[h], (h, before[h], after[h])
    # the read-only checks ran there (the converged check dropped its stale record); nothing it serves changed
    assert _served(fleetsim.host_state(state, "gpu-0005")) == untouched
    assert "NO MORE HOSTS LEFT" in run.output
    for h in bad:  # each failed host's root cause: the triage of its own journal
        assert re.search(rf"did not become ready on {h}:\\nAttributeError: 'KimiK25Config' object has no attribute "
                         r"'image_token_index'", run.output), h
        assert f"Rolled back to release {before[h]}" in run.output.replace("\\n", " ")


def _served(s: dict) -> dict:
    """What a host serves: its files (but the converged record), units, images and packages."""
    from specdeploy.hostscripts.converged import RECORDS
    return {"files": {p: e for p, e in s["files"].items() if not p.startswith(RECORDS)},
            **{k: s[k] for k in ("units", "images", "packages")}}


def _batch_leads(output: str) -> list[str]:
    """The first host of each rolling batch: the host each batch's once-per-batch check ran on."""
    return re.findall(r"TASK \[Does this batch move whole serving groups[^\n]*\n(?:[^\n]*\n)*?ok: \[([^\]]+)\]",
                      output)


def test_workers_fork_from_a_frozen_controller_heap_unless_it_is_switched_off(tmp_path):
    """The callback beside the playbooks freezes the controller's objects before each task's workers fork, so a
    worker's garbage collections leave the fleet-sized heap it inherited alone; SPECDEPLOY_FORK_FREEZE=0 (the
    bench's control arm) forks them from a heap left as it is, and the simulated hosts see the difference."""
    runs = {}
    for arm, env in (("off", {"SPECDEPLOY_FORK_FREEZE": "0", **PROBE}), ("on", PROBE)):
        inv, state = tmp_path / arm / "inv", tmp_path / arm / "state"
        fleetsim.write_inventory(inv, state, 2)
        runs[arm] = fleetsim.playbook(inv, state, tags="deploy_preflight", timeout=600, env_extra=env)
        assert runs[arm].rc == 0, runs[arm].output[-3000:]
        runs[arm] = [fleetsim.host_state(state, h) for h in fleetsim.host_names(2)]
    assert all(s["calls"] >= 2 and s.get("unfrozen_module_calls", 0) >= 2 for s in runs["off"]), runs["off"]
    assert all(s["calls"] >= 2 and "unfrozen_module_calls" not in s for s in runs["on"]), runs["on"]


def test_rolling_batches_of_a_fleet_keep_serving_groups_whole(tmp_path):
    """16 hosts in serving groups of two; the checks and each batch's own check run (--tags deploy_preflight):
    one group first, then a fifth of the fleet per batch, each batch ending at the end of a group. A serial
    that would cut a group stops the deploy before anything changes, naming the group."""
    inv, state = tmp_path / "inv", tmp_path / "state"
    fleetsim.write_inventory(inv, state, 16, group_size=2, extra_group_vars={"specdeploy_rolling_from_hosts": 8,
                                                                              "specdeploy_rolling_batch_percent": 20})
    run = fleetsim.playbook(inv, state, tags="deploy_preflight", timeout=600)
    assert run.rc == 0, run.output[-3000:]
    # [2, 4, 4, 4, 2]: 20% of 16 is 3 hosts, extended to the end of the group
    assert _batch_leads(run.output) == [f"gpu-{i:04d}" for i in [0, 2, 6, 10, 14]]
    cut = fleetsim.playbook(inv, state, tags="deploy_preflight", extra=["specdeploy_serial=3"], timeout=600)
    assert cut.rc != 0
    assert "this batch holds gpu-0002 of serving group group-0001 but not gpu-0003" in cut.output
    assert not _batch_leads(cut.output)  # stopped in the preflight play: no batch started
