"""What a deploy restarts when its engine attaches to a weight-cache daemon (deploy/weights.py, called by the
inference_engine role through filters): the daemon only for new weights (a full load), everything else only the
engine; a rollback to other weights restarts the daemon first and says what it costs."""
from __future__ import annotations

import json

import pytest

from specdeploy.deploy import weights as W
from specdeploy.deploy.filters import FILTERS

PLAN = {"engine": "vllm", "weight_cache": {"unit": "specdeploy-vllm-weights.service", "key": "k1"},
        "weight_cache_why": "vLLM 0.32.0 serves this checkpoint"}
NO_CACHE = {"engine": "vllm", "weight_cache": None,
            "weight_cache_why": "vLLM 0.16.0 has no weight-cache daemon (the first vLLM release with one is 0.30.0)"}


def test_the_role_reaches_every_decision_through_a_filter():
    for name in ("specdeploy_restarts", "specdeploy_group_daemon_restart", "specdeploy_rollback_restarts",
                 "specdeploy_weight_cache_record", "specdeploy_weight_cache_root", "specdeploy_page_cache_text",
                 "specdeploy_attach_text", "specdeploy_gate_baseline_overrides"):
        assert callable(FILTERS[name])


@pytest.mark.parametrize("why,engine_changes,state,key,switched,daemon,engine", [
    # the gate's two runs, a regate, a canary, k bands, a flag change: a new engine release, the daemon as it was
    ("engine only", True, "active", "k1", False, False, True),
    ("nothing changed", False, "active", "k1", False, False, False),
    ("new weights, quantization, layout or release", True, "active", "k0", False, True, True),
    ("new weights while the engine's release is unchanged", False, "active", "k0", False, True, True),
    ("a staged checkpoint switched in at the same path", False, "active", "k1", True, True, True),
    ("no daemon runs (a first deploy, a killed daemon)", False, "failed", "k1", False, True, True),
    ("a daemon whose weights were never recorded", True, "active", "", False, True, True),
])
def test_what_restarts(why, engine_changes, state, key, switched, daemon, engine):
    r = W.restarts(PLAN, engine_changes, state, key, switched)
    assert (r["daemon"], r["engine"], r["full_load"]) == (daemon, engine, daemon), why
    assert ("full load" in r["text"]) == daemon, r["text"]


def test_without_a_daemon_every_engine_restart_is_a_full_load():
    r = W.restarts(NO_CACHE, True, "inactive", "", False)
    assert r == {"daemon": False, "engine": True, "full_load": True,
                 "text": "the engine restarts: a full load from disk (" + NO_CACHE["weight_cache_why"] + ")"}
    assert W.restarts(NO_CACHE, "false", "", "", "no")["engine"] is False  # Ansible's strings read as booleans


def test_a_serving_groups_daemons_restart_together():
    hv = {"a": {"inference_engine_daemon_restart_self": False}, "b": {"inference_engine_daemon_restart_self": "true"}}
    assert W.group_daemon_restart(["a", "b"], hv) is True
    hv["b"]["inference_engine_daemon_restart_self"] = False
    assert W.group_daemon_restart(["a", "b"], hv) is False
    assert W.group_daemon_restart(["a", "c"], hv) is True  # c did not decide: counts as restarting


def test_rollback_to_other_weights_restarts_the_daemon_first_and_says_what_it_costs():
    other = {**PLAN, "weight_cache": {**PLAN["weight_cache"], "key": "k0"}}
    r = W.rollback_restarts(other, "active", "k1", 1834.2)
    assert r["daemon"] and not r["stop_daemon"]
    assert "restarts first, a full load (the last full load here took 30 min 34 s)" in r["text"]
    same = W.rollback_restarts(PLAN, "active", "k1", 1834.2)
    assert not same["daemon"] and "attaches to the running" in same["text"]
    down = W.rollback_restarts(PLAN, "failed", "k1", None)
    assert down["daemon"] and "took" not in down["text"]
    # back to a release without a daemon: the running one stops first (its weights would not fit beside the load)
    r = W.rollback_restarts(NO_CACHE, "active", "k1", 10)
    assert r == {"daemon": False, "stop_daemon": True, "text": "the release loads from disk (a full load); the "
                 "running weight-cache daemon stops first to free its GPU memory"}


def test_the_record_the_exporter_reads():
    daemon_log = "\n".join(["Weight cache target daemon rank 0 loaded model (70.12 GiB allocated, 71.0 GiB reserved)",
                            "Weight cache target daemon rank 1 loaded model (70.15 GiB allocated, 71.0 GiB reserved)"])
    engine_log = "(Worker_TP0 pid=1) INFO [ipc_loader.py:285] Mapped 1283 tensors from the weight cache daemon"
    rec = W.record("vllm", PLAN, {"status": "ready", "elapsed_s": 1834.24}, {"status": "ready", "elapsed_s": 41.46},
                   daemon_log, engine_log, {}, now=100.0)
    assert rec["daemon"] == {"load_s": 1834.2, "since": 100.0, "memory_gib_per_rank": 70.15,
                             "memory_source": "the daemon's log"}
    assert rec["engine"] == {"ready_s": 41.5, "since": 100.0, "attached": True, "disk_fallback": False}
    assert W.attach_text(rec) == "attached in 41 s; the daemon's last full load took 30 min 34 s, 70.15 GiB per GPU"
    # an engine-only restart keeps the daemon's figures
    again = W.record("vllm", PLAN, None, {"status": "ready", "elapsed_s": 12.0}, "", engine_log, rec, now=200.0)
    assert again["daemon"] == rec["daemon"] and again["engine"]["ready_s"] == 12.0
    # SGLang's own fall back to a disk load (no socket file)
    fb = W.record("sglang", PLAN, None, {"status": "ready", "elapsed_s": 1700.0}, "",
                  "[IpcModelLoader] Weight cache not available or config mismatch, falling back to disk load", {})
    assert fb["engine"]["disk_fallback"] and not fb["engine"]["attached"]
    assert "fell back to a disk load" in W.attach_text(fb)


def test_a_daemon_that_went_down_is_the_root_cause():
    engine_t = {"outcome": "killed", "root_cause": "specdeploy-vllm.service: Unit is bound to inactive unit "
                "specdeploy-vllm-weights.service. Stopping, too.", "fix": "x"}
    daemon_t = {"outcome": "failed", "root_cause": "UnsupportedQuantForIPCError: layer ...", "fix": "set off"}
    got = W.weight_cache_root(PLAN, {"ActiveState": "failed", "Result": "signal", "ExecMainStatus": "9"},
                              daemon_t, engine_t)
    assert got["root_cause"].startswith("the weight-cache daemon specdeploy-vllm-weights.service is failed "
                                        "(Result=signal, ExecMainStatus=9), and the engine bound to it cannot serve: "
                                        "UnsupportedQuantForIPCError")
    assert got["fix"] == "set off"
    assert W.weight_cache_root(PLAN, {"ActiveState": "active"}, daemon_t, engine_t) == engine_t
    assert W.weight_cache_root(NO_CACHE, {"ActiveState": "failed"}, daemon_t, engine_t) == engine_t
    killed = W.weight_cache_root(PLAN, {"ActiveState": "failed"}, {}, engine_t)
    assert "its log names no cause" in killed["root_cause"] and "journalctl -u" in killed["fix"]


def test_page_cache_answers_in_a_line():
    gib = 1 << 30
    fits = {"fits": True, "bytes": 600 * gib, "available": 1800 * gib, "margin": 200 * gib,
            "read_bytes": 600 * gib, "seconds": 310.0, "mb_per_s": 2078.4, "complete": True}
    assert W.page_cache_text(json.dumps(fits)) == ("warmed 600.0 GiB of 600.0 GiB in 310.0 s (2078.4 MB/s): the "
                                                   "engine's load reads memory")
    no = {"fits": False, "bytes": 600 * gib, "available": 500 * gib, "margin": 100 * gib}
    assert "do not fit in the host's available memory (500.0 GiB)" in W.page_cache_text(json.dumps(no))
    assert W.page_cache_text('{"error": "x is not a directory"}') == "not warmed: x is not a directory"
    assert W.page_cache_text("garbage").startswith("no answer")
