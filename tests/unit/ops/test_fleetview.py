"""The operator's view of a fleet: the live view of a deploy and `specdeploy status` fit one screen however many
hosts there are, and status answers for every host within its deadline with a bounded number of requests in
flight (bench/fleet_scale.py measures it at 1,024 hosts)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import yaml

from specdeploy.ops.fleetview import deploy_summary, status_summary
from specdeploy.ops.runner import HostRow
from specdeploy.testing import fleetsim
from specdeploy.values.hostranges import compact


def test_host_names_as_ansible_ranges():
    names = [f"gpu-{i:04d}" for i in range(1024)]
    assert compact(names) == "gpu-[0000:1023]"
    assert compact(names[:3] + names[5:9] + ["mon-1", "x"]) == "gpu-[0000:0002], gpu-[0005:0008], mon-1, x"
    many = [f"gpu-{i:04d}" for i in range(0, 40, 2)]
    assert compact(many, limit=3) == "gpu-0000, gpu-0002, gpu-0004 and 17 more"


def _rows(n: int, now: float):
    rows = []
    for i in range(n):
        r = HostRow(f"gpu-{i:04d}", started=now - 300, phase_since=now - 10)
        if i < 600:
            r.phase, r.result, r.changed = "ready", "ok", 12
        elif i < 900:
            r.phase, r.phase_since = "load", now - 60 - i  # the later, the longer in the load
        elif i < 1010:
            r.phase = "waiting"
        else:
            r.phase, r.result, r.failed_task = "rollback", "failed", "Fail the deploy"
            r.triage = {"root_cause": "AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'",
                        "fix": "patch set vllm-kimi-image-token"} if i % 2 else None
            r.message = "specdeploy-vllm.service is not ready: timeout after 3600 s"
        rows.append(r)
    return rows


def test_the_live_view_of_a_thousand_hosts_fits_one_screen():
    from rich.console import Console

    from specdeploy.cli.frontdoor import _fleet_view
    now = time.time()
    rows = _rows(1024, now)
    s = deploy_summary(rows, now)
    assert dict(s["phases"]) == {"waiting": 110, "load": 300} and dict(s["results"]) == {"ok": 600, "failed": 14}
    causes = {g["cause"]: g for g in s["failures"]["groups"]}
    assert causes["AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'"]["hosts"] == 7
    assert causes["Fail the deploy: specdeploy-vllm.service is not ready: timeout after 3600 s"]["names"] == \
        "gpu-1010, gpu-1012, gpu-1014, gpu-1016, gpu-1018, gpu-1020 and 1 more"
    assert [r["host"] for r in s["slowest"]][:2] == ["gpu-0899", "gpu-0898"]  # longest in their phase first

    class FakeRun:
        started = now - 300
    run = FakeRun()
    run.rows = {r.host: r for r in rows}
    c = Console(width=160, record=True)
    c.print(_fleet_view(run, "specdeploy deploy - inventory/fleet"))
    text = c.export_text()
    assert len(text.splitlines()) <= 30, text  # one screen, not 1,024 rows
    assert "waiting 110" in text and "load 300" in text and "ok 600" in text and "failed 14" in text
    assert "image_token_index" in text and "gpu-0899" in text


def test_status_answers_for_every_host_of_a_fleet_within_its_deadline(tmp_path):
    """300 simulated hosts behind one exporter server: most serve release r1, 20 already r2, some hang past the
    timeout, some answer garbage, some have their engine down. Every host gets its row within the deadline, no
    more requests are in flight than --concurrency, and the text view is a summary per state and release."""
    n = 300
    inv, state = tmp_path / "inv", tmp_path / "state"
    behaviour = {fleetsim.address(i): "r2" for i in range(20)}
    behaviour.update({fleetsim.address(i): "slow" for i in range(40, 46)})
    behaviour.update({fleetsim.address(i): "garbage" for i in range(50, 53)})
    behaviour.update({fleetsim.address(i): "down" for i in range(60, 64)})
    with fleetsim.Exporters(behaviour, slow_s=8) as ex:
        fleetsim.write_inventory(inv, state, n, extra_group_vars={"specdeploy_exporter_port": ex.port},
                                 monitoring=False)
        (inv / "hosts.yml").write_text((inv / "hosts.yml").read_text().replace(
            "specdeploy_engines:", "specdeploy_monitoring: {hosts: {}}\n    specdeploy_engines:", 1))
        args = [sys.executable, "-m", "specdeploy.cli", "status", "-i", str(inv), "--timeout", "2",
                "--concurrency", "32", "--deadline", "6", "--prometheus", "http://127.0.0.1:9"]
        t0 = time.monotonic()
        r = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=120)
        wall = time.monotonic() - t0
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        st = json.loads(r.stdout)
        rows = {h["host"]: h for h in st["hosts"]}
        assert len(rows) == n
        assert ex.peak <= 32, ex.peak
        assert wall < 6 + 6, wall  # the deadline, plus the CLI's start-up and the inventory
        assert all("within 2 s" in rows[f"gpu-{i:04d}"]["error"] for i in range(40, 46))
        assert all(rows[f"gpu-{i:04d}"].get("up") is False for i in range(60, 64))
        s = st["summary"]
        assert s["states"]["up"] == n - 6 - 3 - 4
        assert [(x["release"], x["hosts"]) for x in s["releases"]] == [("r1", n - 20 - 13), ("r2", 20)]
        shown = subprocess.run(args, capture_output=True, text=True, timeout=120).stdout
    assert len(shown.splitlines()) <= 30, shown
    assert "r2" in shown and "gpu-[0000:0019]" in shown and "gpu-[0040:0045]" in shown


def test_a_summary_of_a_broken_serving_group_and_of_nothing():
    st = {"hosts": [{"host": "a", "reachable": True, "up": True, "group": "g", "release": "x"},
                    {"host": "b", "reachable": True, "up": False, "group": "g", "error": "rank lost: gone",
                     "group_state": "rank lost"}], "time": 0, "prometheus": None}
    s = status_summary(st)
    assert s["groups"] == 1 and s["groups_broken"] == [{"group": "g", "states": {"up": 1, "rank lost": 1}}]
    assert status_summary({"hosts": [], "time": 0, "prometheus": None})["hosts"] == 0
    assert yaml.safe_dump(s)  # plain data (the --json summary)
