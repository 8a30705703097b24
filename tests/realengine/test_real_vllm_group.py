"""A serving group run by the real vLLM 0.32.0 CPU build: two ranks of a ``tp`` group on this machine's loopback,
each started from the command line ``specdeploy plan`` renders for its rank (``realrun.group``: a custom hardware
profile of one device per host, so TP 2 spans the two ranks), a tiny DeepSeek-V3-shaped MoE target with its
EAGLE-3 drafter. Then the simulator plays the same two rank lines and answers the same questions:

- the leader does not serve until its follower has joined the rendezvous;
- once it has, the leader passes readiness (health, then a real chat completion) and speculates; the follower,
  which serves no HTTP, passes the readiness the role gives it: its own unit alive and the leader's health;
- a follower killed while the group serves: the leader goes on answering /health with 200 (vLLM watches only its
  local workers), fails the next request with 500 when the step's collective finds the peer gone, and exits 0;
  triage of the leader's journal names the broken rendezvous, and ``group_root`` over both journals names the
  follower.

A second layout, ``dp_ep``, is not run here: the CPU build's communicator has no ``all_gatherv`` (the
expert-parallel all-to-all needs it), so that group passes /health and dies at its first step with a bare
``NotImplementedError``; test_real_vllm_ranks.py checks its rank lines against the real parser instead.
"""
from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

import pytest

from specdeploy.checks.readiness import wait
from specdeploy.triage import group_root, triage_lines
from specdeploy.triage.signatures import RENDEZVOUS
from specdeploy.testing import realrun, tinymodels

pytestmark = pytest.mark.realengine

VERSION = "0.32.0"
# where each engine is once its leader waits on the rendezvous (vLLM: the worker's distributed init; the simulator:
# its rendezvous port open)
WAITING = {"real": "world_size=2 rank=0", "sim": "waiting for the other ranks"}


def health(url: str) -> object:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (ConnectionError, urllib.error.URLError, TimeoutError):
        return "refused"


def simulated(eng: realrun.Engine) -> realrun.Engine:
    """The same rank line (the venv's ``vllm serve ...``), played by `specdeploy simulate` for the same release."""
    argv = [sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", "vllm", "--version", VERSION, "--",
            "vllm", *eng.argv[1:]]
    env = {**eng.env, "PYTHONPATH": ":".join(p for p in sys.path if p), "SPECDEPLOY_SIM_LOAD_SECONDS": "2"}
    return realrun.Engine(argv, env, eng.url, eng.served, eng.logdir.with_name(eng.logdir.name + "-sim"), eng.unit)


def observe(kind: str, lead: realrun.Engine, follow: realrun.Engine) -> dict:
    """Start the leader alone, then its follower; serve; kill the follower; what each step showed."""
    out: dict = {}
    lead.start()
    end = time.time() + 300
    while time.time() < end and lead._reap() is None and WAITING[kind] not in lead.log.read_text(errors="replace"):
        time.sleep(0.5)
    # the leader waits on the rendezvous: alive, no API server, for as long as the follower is missing
    seen = set()
    for _ in range(10):
        seen.add(health(lead.url))
        time.sleep(0.5)
    out["alone"] = (lead._reap(), seen)
    follow.start()
    until = time.time() + 400
    out["leader"] = lead.wait_ready(400).status
    # the follower's readiness as the role runs it: its own unit, the leader's health
    out["follower"] = wait(follow.unit, lead.url + "/health", until, poll_s=0.5, state_file=follow.logdir / "r.json",
                           read_state=follow.unit_state, journal=follow.journal_tail).status
    out["answer"] = lead.chat(max_tokens=16)["choices"][0]["message"]["content"]
    out["drafts"] = sum(float(line.rsplit(" ", 1)[1]) for line in lead.metrics().splitlines()
                        if line.startswith("vllm:spec_decode_num_drafts_total{"))
    follow.kill()
    time.sleep(5)
    out["after_kill"] = (lead._reap(), health(lead.url))
    try:
        lead.chat(max_tokens=8, deadline=120)
        out["next_request"] = 200
    except Exception as exc:  # peerhttp.PeerError: the status the engine answered
        out["next_request"] = str(exc).rsplit(" ", 1)[-1]
    out["rc"] = lead.wait_exit(90)
    lead.stop(30)
    follow.stop(30)
    lead_t, follow_t = (triage_lines(e.journal()).to_dict() for e in (lead, follow))
    out["lead_triage"], out["follow_triage"] = lead_t, follow_t
    out["root"] = group_root([("leader", lead_t), ("follower", follow_t)])
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    realrun.tiny_cache_from_env()
    logs = tmp_path_factory.mktemp("real-group")
    g = realrun.group(tinymodels.target("deepseek_v3"), tinymodels.drafter("deepseek_v3", "good"), "tp")
    (h0, (hv, r0)), (h1, (_, r1)) = g.items()

    def engines():
        lead = realrun.launch(hv, logs / "leader", r0, h0, start=False)
        return lead, realrun.launch(hv, logs / "follower", r1, h1, start=False)
    real = observe("real", *engines())
    sim = observe("sim", *(simulated(e) for e in engines()))
    return real, sim


def test_the_rank_lines_are_a_tp_group_of_two():
    g = realrun.group(tinymodels.target("deepseek_v3"), tinymodels.drafter("deepseek_v3", "good"), "tp")
    (h0, (hv, r0)), (h1, (_, r1)) = g.items()
    lead, follow = (realrun.command(hv, r, h)[0] for h, r in ((h0, r0), (h1, r1)))
    for argv in (lead, follow):
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and argv[argv.index("--nnodes") + 1] == "2"
    assert "--headless" in follow and "--headless" not in lead
    assert follow[follow.index("--node-rank") + 1] == "1"


@pytest.mark.parametrize("kind", ["real", "sim"])
def test_the_leader_waits_for_its_follower_then_the_group_serves_and_speculates(both, kind):
    got = both[0] if kind == "real" else both[1]
    assert got["alone"] == (None, {"refused"}), got["alone"]
    assert got["leader"] == "ready" and got["follower"] == "ready", got
    assert got["answer"] and got["drafts"] > 0, got


@pytest.mark.parametrize("kind", ["real", "sim"])
def test_a_lost_follower_fails_the_next_request_and_the_leader_exits(both, kind):
    got = both[0] if kind == "real" else both[1]
    assert got["after_kill"] == (None, 200), got["after_kill"]  # nothing notices until the next step
    assert got["next_request"] == "500", got
    assert got["rc"] == 0, got  # vLLM's API server shuts down cleanly after EngineDeadError
    assert got["lead_triage"]["outcome"] == "failed" and RENDEZVOUS.search(got["lead_triage"]["root_cause"]), got
    assert got["follow_triage"]["outcome"] == "killed", got["follow_triage"]
    assert got["root"][0] == "follower", got["root"]


def test_the_simulator_plays_the_group_as_the_engine_does(both):
    real, sim = both
    keys = ("alone", "leader", "follower", "after_kill", "next_request", "rc")
    assert {k: real[k] for k in keys} == {k: sim[k] for k in keys}
    assert real["lead_triage"]["outcome"] == sim["lead_triage"]["outcome"]
    assert real["root"][0] == sim["root"][0]
