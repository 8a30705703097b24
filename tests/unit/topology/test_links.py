"""Which ranks are joined to their leader, from the kernel's connection tables: the parser on /proc/net/tcp and
tcp6 lines (IPv4, IPv6, IPv4-mapped), this machine's own tables with a real connection, and the exporter's gauge
over a group the simulator plays (a follower killed: its connection gone, the gauge 0, ``specdeploy status``
marking the rank lost and its leader's group broken)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from helpers import free_port, sim_argv, stop, wait_http
from specdeploy.engines import get_adapter
from specdeploy.topology import links
from specdeploy.values.topology import Rank

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7339 0100007F:A4F2 01 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:7339 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0201E70A:7339 0202E70A:C350 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0000000000000000
   3: 0201E70A:1F90 0302E70A:C351 01 00000000:00000000 00:00000000 00000000     0        0 3 1
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 0000000000000000FFFF00000201E70A:7339 0000000000000000FFFF00000402E70A:D431 01 00000000:00000000 00:00000000
   1: 000080FE00000000FF000000010000FD:7339 000080FE00000000FF000000020000FD:D432 01 00000000:00000000 00:00000000
"""


def test_established_peers_on_the_rendezvous_port_only():
    # 0x7339 = 29497: established from 127.0.0.1 and (IPv4-mapped) 10.231.2.4 and fe80::ff:fd00:2; listening,
    # TIME_WAIT and another port are not
    got = links.established_peers(0x7339, [TCP, TCP6])
    assert got == {"127.0.0.1", "10.231.2.4", "fe80::ff:fd00:2"}, got
    assert links.established_peers(0x1F90, [TCP]) == {"10.231.2.3"}
    assert links.established_peers(1, ["garbage\nnot a table\n", ""]) == set()


def test_joined_resolves_each_rank_and_says_unknown_when_it_cannot():
    state = links.joined(0x7339, {"a": "10.231.2.4", "b": "10.231.2.9", "c": "[::ffff:10.231.2.4]",
                                  "d": "no-such-host.invalid"}, [TCP, TCP6])
    assert state == {"a": True, "b": False, "c": True, "d": None}
    assert links.joined(1, {"a": "10.0.0.1"}, None) == {"a": None}


def test_this_machines_tables_show_a_real_connection_and_its_end():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        c = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        assert links.joined(port, {"peer": "127.0.0.1"}, links.read_tables()) == {"peer": True}
        c.close()
        conn.close()
        time.sleep(0.2)
        assert links.joined(port, {"peer": "127.0.0.1"}, links.read_tables()) == {"peer": False}


def _rank_proc(rank: Rank, http_port: int) -> subprocess.Popen:
    flags, _ = get_adapter("vllm", "0.16.0").layout_args(None, rank)
    env = {**os.environ, "SPECDEPLOY_SIM_LOAD_SECONDS": "0.5", "SPECDEPLOY_SIM_STEP_MS": "2",
           "SPECDEPLOY_SIM_GROUP_TIMEOUT": "30"}
    return subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", "vllm", "--version",
                             "0.16.0", "--"] + sim_argv("vllm", "127.0.0.1", http_port) + flags, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_the_leaders_exporter_and_status_see_a_follower_go_away(tmp_path):
    """The follower is on this machine, so its connection comes from 127.0.0.1 (the simulated leader opens none to
    itself); in a group of hosts each rank's address is its own."""
    from specdeploy.ops.fleet import Target
    from specdeploy.ops.status import fleet_status
    port, http, xp = free_port(), free_port(), free_port()
    lead_r, follow_r = (Rank(layout="tp", group="g", index=i, hosts=("lead", "follow"), leader_address="127.0.0.1",
                             address="127.0.0.1", port=port, gpus=8, addresses=("127.0.0.1", "127.0.0.1"))
                        for i in range(2))
    leader, follower = _rank_proc(lead_r, http), _rank_proc(follow_r, free_port())
    exporter = None
    try:
        wait_http(f"http://127.0.0.1:{http}/health", timeout=30)
        exporter = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "exporter", "--engine", "vllm",
                                     "--engine-url", f"http://127.0.0.1:{http}", "--listen", f"127.0.0.1:{xp}",
                                     "--group-port", str(port), "--group-rank", "follow=127.0.0.1"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{xp}/metrics", timeout=30)
        hosts = [Target("lead", "127.0.0.1", "vllm", http, xp, "specdeploy-vllm.service", [], "g", 0, "lead"),
                 Target("follow", "127.0.0.1", "vllm", 8000, 9450, "specdeploy-vllm.service", [], "g", 1, "lead")]
        rows = {r["host"]: r for r in fleet_status(hosts, [], timeout=2.0)["hosts"]}
        assert rows["follow"]["joined"] is True and rows["follow"]["up"] and not rows["follow"].get("error")
        assert not rows["lead"].get("error"), rows["lead"]
        follower.send_signal(signal.SIGKILL)
        follower.wait(10)
        time.sleep(1.5)  # past the exporter's one-second cache
        rows = {r["host"]: r for r in fleet_status(hosts, [], timeout=2.0)["hosts"]}
        assert rows["follow"]["joined"] is False and rows["follow"]["up"] is False, rows["follow"]
        assert rows["follow"]["group_state"] == "rank lost" and "went away" in rows["follow"]["error"]
        assert rows["lead"]["group_state"] == "group broken" and "follow" in rows["lead"]["error"], rows["lead"]
        assert rows["lead"]["up"]  # the leader's engine still answers: that is the trap
        import urllib.request
        page = urllib.request.urlopen(f"http://127.0.0.1:{xp}/metrics", timeout=5).read().decode()
        assert 'specdeploy_group_rank_joined{rank="1",rank_host="follow"} 0.0' in page
    finally:
        stop(exporter, follower, leader)


def test_the_exporter_refuses_half_a_group():
    from typer.testing import CliRunner

    from specdeploy.cli.app import app
    for args, words in ((["--group-port", "29501"], "--group-port"), (["--group-rank", "a=1.2.3.4"], "--group-port"),
                        (["--group-port", "0", "--group-rank", "a=1.2.3.4"], "not a TCP port"),
                        (["--group-port", "29501", "--group-rank", "a"], "not HOST=ADDRESS")):
        r = CliRunner().invoke(app, ["exporter", "--engine", "vllm", "--engine-url", "http://127.0.0.1:1",
                                     "--listen", "127.0.0.1:9", *args])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, (args, r.output)
