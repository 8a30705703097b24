"""The simulator plays each rank of a serving group from the rank flags the adapters render: the leader serves
only once every rank has joined, the other ranks serve no HTTP, and a rank that goes away takes the group down
(the leader exits with the engine's error, at once or, as vLLM, at the step that needs the lost rank; the
others exit when the leader goes)."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import free_port, sim_argv, wait_http
from specdeploy.engines import get_adapter
from specdeploy.engines.base import SimRank
from specdeploy.values.peerhttp import PeerError
from specdeploy.values.topology import Rank

VERSIONS = {"vllm": "0.16.0", "sglang": "0.5.23"}


def _ranks(layout: str, port: int) -> list[Rank]:
    return [Rank(layout=layout, group="g", index=i, hosts=("h1", "h2"), leader_address="127.0.0.1",
                 address="127.0.0.1", port=port, gpus=8, tp_per_dp=1) for i in range(2)]


def _start(engine: str, rank: Rank, http_port: int, **env) -> subprocess.Popen:
    adapter = get_adapter(engine, VERSIONS[engine])
    flags, _ = adapter.layout_args(None, rank)
    e = {**os.environ, "SPECDEPLOY_SIM_LOAD_SECONDS": "0.5", "SPECDEPLOY_SIM_STEP_MS": "2",
         "SPECDEPLOY_SIM_GROUP_TIMEOUT": "30", **env}
    return subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", engine, "--version",
                             VERSIONS[engine], "--"] + sim_argv(engine, "127.0.0.1", http_port) + flags,
                            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _open(port: int) -> bool:
    import socket
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def chat(url: str) -> dict:
    import json
    from specdeploy.values import peerhttp
    body = json.dumps({"model": "kimi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    return peerhttp.json_object(url + "/v1/chat/completions", 10, headers={"content-type": "application/json"},
                                body=body)


def _exit_within(p: subprocess.Popen, seconds: float) -> tuple[int, str]:
    try:
        p.wait(seconds)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"the rank still runs {seconds} s later")
    return p.returncode, p.stdout.read() + p.stderr.read()


@pytest.mark.parametrize("engine,layout", [("vllm", "tp"), ("vllm", "dp_ep"), ("sglang", "tp"),
                                           ("sglang", "dp_ep")])
def test_the_leader_serves_once_the_group_joined_and_a_lost_follower_takes_it_down(engine, layout):
    lead_rank, follow_rank = _ranks(layout, free_port())
    adapter = get_adapter(engine, VERSIONS[engine])
    assert adapter.simulation().rank(_parse(engine, lead_rank)) == SimRank(0, 2, "127.0.0.1", lead_rank.port, True)
    lead_http, follow_http = free_port(), free_port()
    leader = _start(engine, lead_rank, lead_http)
    follower = None
    try:
        time.sleep(2.5)  # loaded, but alone: no API server yet
        assert leader.poll() is None and not _open(lead_http)
        follower = _start(engine, follow_rank, follow_http)
        wait_http(f"http://127.0.0.1:{lead_http}/health", timeout=30)
        time.sleep(1)
        assert follower.poll() is None and not _open(follow_http)  # headless: the leader serves the group
        follower.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        behaviour = adapter.simulation()
        if behaviour.lost_rank_noticed == "next-step":  # vLLM: healthy until a step needs the lost rank
            time.sleep(2)
            assert leader.poll() is None
            wait_http(f"http://127.0.0.1:{lead_http}/health", timeout=5)
            with pytest.raises(PeerError, match="HTTP 500"):
                chat(f"http://127.0.0.1:{lead_http}")
        rc, out = _exit_within(leader, 10)
        assert rc == behaviour.lost_exit_code and time.monotonic() - t0 < 15
        assert "Connection closed by peer [127.0.0.1]" in out, out[-800:]
    finally:
        for p in (leader, follower):
            if p is not None and p.poll() is None:
                p.kill()


def _parse(engine, rank):
    from specdeploy.testing.simulator import parse_argv
    flags, _ = get_adapter(engine, VERSIONS[engine]).layout_args(None, rank)
    return parse_argv(engine, VERSIONS[engine], sim_argv(engine, "127.0.0.1", 1) + flags)


def test_the_other_ranks_stop_when_the_leader_goes_and_wait_for_a_late_leader():
    lead_rank, follow_rank = _ranks("tp", free_port())
    follower = _start("vllm", follow_rank, free_port())  # first, as the deploy starts them
    leader = None
    try:
        time.sleep(2)
        assert follower.poll() is None  # still trying to reach the leader
        lead_http = free_port()
        leader = _start("vllm", lead_rank, lead_http)
        wait_http(f"http://127.0.0.1:{lead_http}/health", timeout=30)
        leader.send_signal(signal.SIGKILL)
        rc, out = _exit_within(follower, 10)
        assert rc != 0 and "leader at 127.0.0.1" in out and "went away" in out, out[-600:]
    finally:
        for p in (leader, follower):
            if p is not None and p.poll() is None:
                p.kill()


def test_a_rank_that_never_joins_fails_the_leader_after_the_timeout():
    lead_rank, _ = _ranks("tp", free_port())
    leader = _start("vllm", lead_rank, free_port(), SPECDEPLOY_SIM_GROUP_TIMEOUT="2")
    rc, out = _exit_within(leader, 20)
    assert rc != 0 and "ranks 1 of the serving group did not join within 2 s" in out


def test_follower_flags_parse_as_the_release_parses_them():
    """Every rank flag the adapters render is a flag of the pinned release (the recorded facts), with the
    values the simulator reads back as the same rank."""
    for engine in VERSIONS:
        for layout in ("tp", "dp_ep"):
            lead, follow = _ranks(layout, 29777)
            got = get_adapter(engine, VERSIONS[engine]).simulation().rank(_parse(engine, follow))
            assert got == dataclasses.replace(got, index=1, size=2, address="127.0.0.1", port=29777, serves=False)


def _post(url: str, body: dict, timeout: float = 30):
    import json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_prefill_and_decode_instances_hand_the_kv_over_by_room():
    """The request shape sglang-router 0.3.2's PD mode sends (read off the real router): the same body to a
    prefill and a decode instance, with bootstrap_host, bootstrap_port (the prefill's) and bootstrap_room."""
    import json
    import threading
    import urllib.request
    boot = free_port()
    rank = lambda role: Rank(layout="pd", group="g", index=0, hosts=(role,), leader_address="127.0.0.1",  # noqa: E731
                             address="127.0.0.1", port=29501, gpus=8, role=role, pd_port=boot, transfer="nixl")
    pp, dp = free_port(), free_port()
    pre, dec = _start("sglang", rank("prefill"), pp), _start("sglang", rank("decode"), dp)
    try:
        for port in (pp, dp):
            wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
        info = json.load(urllib.request.urlopen(f"http://127.0.0.1:{pp}/server_info", timeout=5))
        assert info["disaggregation_mode"] == "prefill"
        body = {"model": "kimi", "messages": [{"role": "user", "content": "one two three four"}],
                "max_completion_tokens": 5, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot,
                "bootstrap_room": 12345}
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("decode", _post(f"http://127.0.0.1:{dp}/v1/chat/"
                                                                             "completions", body)))
        t.start()  # the decode side waits for the room; the prefill side offers it
        time.sleep(0.5)
        assert _post(f"http://127.0.0.1:{pp}/v1/chat/completions", body)[0] == 200
        t.join(30)
        code, ans = got["decode"]
        assert code == 200 and len(ans["choices"][0]["message"]["content"].split()) == 5
        metrics = {p: urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read().decode()
                   for p in (pp, dp)}
        assert "sglang:prompt_tokens_total" in metrics[pp]
        # the router's health checks of a decode instance compute no prompt there either
        def decode_prompts():
            page = urllib.request.urlopen(f"http://127.0.0.1:{dp}/metrics", timeout=5).read().decode()
            return sum(float(x.rsplit(" ", 1)[1]) for x in page.splitlines()
                       if x.startswith("sglang:prompt_tokens_total"))
        seen = decode_prompts()
        for _ in range(3):
            assert urllib.request.urlopen(f"http://127.0.0.1:{dp}/health", timeout=10).status == 200
        assert decode_prompts() == seen
        # without the router's room the instance refuses; a room no prefill offers fails the transfer
        assert _post(f"http://127.0.0.1:{dp}/v1/chat/completions", {**body, "bootstrap_room": None})[0] == 400
    finally:
        for p in (pre, dec):
            p.kill()


def test_a_decode_whose_prefill_never_offers_the_room_fails_the_request():
    boot = free_port()
    dp = free_port()
    r = Rank(layout="pd", group="g", index=0, hosts=("d",), leader_address="127.0.0.1", address="127.0.0.1",
             port=29501, gpus=8, role="decode", pd_port=boot, transfer="nixl")
    dec = _start("sglang", r, dp, SPECDEPLOY_SIM_PD_TIMEOUT="1")
    try:
        wait_http(f"http://127.0.0.1:{dp}/health", timeout=30)
        code, ans = _post(f"http://127.0.0.1:{dp}/v1/chat/completions", {
            "model": "kimi", "messages": [{"role": "user", "content": "x"}], "bootstrap_host": "127.0.0.1",
            "bootstrap_port": boot, "bootstrap_room": 7})
        assert code == 500 and "KV transfer for room 7" in ans["error"]["message"]
    finally:
        dec.kill()
