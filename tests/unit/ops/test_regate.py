"""`specdeploy regate`: the alerts that ask for a re-gate, read from a Prometheus alerts API (a loopback server
answering as Prometheus does, and as a broken peer might), the choice of hosts (inventory, cooldown, one per host),
the deploy it runs per host, its state file, and its errors."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specdeploy.ops.regate import Alert, choose, deploy_argv, firing, read_state, regate
from specdeploy.values.errors import SpecdeployError
from specdeploy.values.peerhttp import PeerError


def _alert(host, state="firing", action="regate", name="SpecdeploySpeculationBelowBreakeven"):
    labels = {"alertname": name, "host": host, "severity": "warning"}
    if action:
        labels["specdeploy_action"] = action
    return {"labels": labels, "state": state, "activeAt": "2026-12-02T04:00:00Z", "value": "7.6e-01"}


ANSWER = {"status": "success", "data": {"alerts": [
    _alert("gpu-a"), _alert("gpu-b", state="pending"),
    _alert("gpu-c", action=None, name="SpecdeployLowAcceptanceLength"),
    _alert("gpu-a", name="SpecdeploySpeculationBelowBreakeven"), _alert("elsewhere"), {"labels": "x"}, 7]}}


@pytest.fixture
def prom():
    box = {"body": json.dumps(ANSWER).encode(), "ctype": "application/json"}

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", box["ctype"])
            self.send_header("content-length", str(len(box["body"])))
            self.end_headers()
            self.wfile.write(box["body"])

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", box
    srv.shutdown()


def test_only_firing_regate_alerts_count(prom):
    url, _ = prom
    got = firing(url)
    assert [a.host for a in got] == ["gpu-a", "gpu-a", "elsewhere"]
    assert got[0].name == "SpecdeploySpeculationBelowBreakeven" and got[0].value == "7.6e-01"


@pytest.mark.parametrize("body", [b"<html>502</html>", b'{"status": "error"}', b'{"status": "success", "data": 3}',
                                  b"\x00\xff\x00", b"[1, 2]"])
def test_an_answer_that_is_not_prometheus_alerts_is_a_peer_error(prom, body):
    url, box = prom
    box["body"] = body
    with pytest.raises(PeerError):
        firing(url)


def test_choose_one_per_host_of_the_inventory_outside_the_cooldown():
    alerts = [Alert("gpu-a", "X", "", ""), Alert("gpu-a", "Y", "", ""), Alert("10.0.0.2", "X", "", ""),
              Alert("gpu-c", "X", "", ""), Alert("nowhere", "X", "", "")]
    hosts = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"}
    todo, skipped = choose(alerts, hosts, {"gpu-c": {"at": 1000.0}}, now=1500.0, cooldown_s=3600)
    assert [(a.host, a.name) for a in todo] == [("gpu-a", "X"), ("gpu-b", "X")]  # the address label maps too
    assert dict(skipped) == {"gpu-c": "re-gated 500 s ago (cooldown 3600 s)",
                             "nowhere": "not an engine host of this inventory"}
    todo, _ = choose(alerts, hosts, {"gpu-c": {"at": 1000.0}}, now=5000.0, cooldown_s=3600)
    assert "gpu-c" in [a.host for a in todo]


def test_a_pass_runs_the_gated_deploy_per_host_and_records_it(prom, tmp_path):
    url, _ = prom
    state = tmp_path / "state" / "regate.json"
    ran = []

    def run(argv, timeout):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0 if "gpu-a" in argv else 1)
    said = []
    out = regate("inv", url, {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}, state, 3600, run=run, say=said.append)
    assert ran == [deploy_argv("inv", "gpu-a")]
    assert ran[0][-6:] == ["--limit", "gpu-a", "-e", "specdeploy_spec_gate=true", "-e", "speculation_gate_force=true"]
    assert {d["host"]: d["action"] for d in out} == {"gpu-a": "regated", "elsewhere": "skipped"}
    rec = read_state(state)
    assert rec["gpu-a"]["rc"] == 0 and rec["gpu-a"]["alert"] == "SpecdeploySpeculationBelowBreakeven"
    # a second pass within the cooldown leaves it alone; a dry run runs nothing
    out = regate("inv", url, {"gpu-a": "10.0.0.1"}, state, 3600, run=run, say=said.append)
    assert len(ran) == 1 and out[0]["why"].startswith("re-gated")
    out = regate("inv", url, {"gpu-a": "10.0.0.1"}, tmp_path / "other.json", 3600, dry_run=True, run=run,
                 say=said.append)
    assert len(ran) == 1 and out == [{"host": "elsewhere", "action": "skipped",
                                      "why": "not an engine host of this inventory"},
                                     {"host": "gpu-a", "action": "would-regate",
                                      "alert": "SpecdeploySpeculationBelowBreakeven"}]


@pytest.mark.parametrize("content", ["not json", "[]", '{"gpu-a": 3}', '{"gpu-a": {"at": "yesterday"}}'])
def test_a_bad_state_file_is_a_finding(tmp_path, content):
    f = tmp_path / "s.json"
    f.write_text(content)
    with pytest.raises(SpecdeployError) as e:
        read_state(f)
    assert e.value.problems[0].subject == "--state"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", "regate", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_errors_name_the_option_and_change_nothing(example_inv, tmp_path, prom):
    url, box = prom
    bad = tmp_path / "state.json"
    bad.write_text("{")
    r = _cli("-i", str(example_inv), "--prometheus", url, "--state", str(bad))
    assert r.returncode == 2 and "--state" in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert bad.read_text() == "{"
    r = _cli("-i", str(example_inv), "--prometheus", "http://127.0.0.1:9", "--state", str(tmp_path / "n.json"))
    assert r.returncode == 2 and "--prometheus" in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert not (tmp_path / "n.json").exists()
    r = _cli("-i", str(example_inv), "--prometheus", url, "--cooldown", "nan", "--state", str(tmp_path / "n.json"))
    assert r.returncode == 2 and "--cooldown" in r.stderr + r.stdout
    # the example inventory's hosts are not those of the alerts: nothing runs, and it says so
    box["body"] = json.dumps({"status": "success", "data": {"alerts": [_alert("elsewhere")]}}).encode()
    r = _cli("-i", str(example_inv), "--prometheus", url, "--state", str(tmp_path / "n.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hosts"] == [{"host": "elsewhere", "action": "skipped",
                                             "why": "not an engine host of this inventory"}]
    assert not Path(tmp_path / "n.json").exists()
