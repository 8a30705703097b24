"""The converged-state record and check a no-op deploy relies on: the host script run as ansible runs it
(`python3 - check|record` with the file on stdin), and the controller's inputs digest."""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import REPO

from specdeploy.hostscripts import converged

SCRIPT = REPO / "src/specdeploy/hostscripts/converged.py"


def run(action: str, state: Path, digest: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-", action, "--state", str(state), "--digest", digest, *args],
                       stdin=SCRIPT.open(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture
def host(tmp_path) -> tuple[Path, list[str]]:
    root = tmp_path / "etc"
    (root / "sub").mkdir(parents=True)
    (root / "unit.service").write_text("[Service]\nExecStart=/bin/true\n")
    (root / "sub" / "env").write_text("A=1\n")
    weights = tmp_path / "store" / "id1"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "model").symlink_to(weights)
    (root / "venv").mkdir()
    (root / "venv" / "lib.py").write_text("# pip's files are not the deploy's\n")
    return tmp_path, ["--root", str(root), "--skip", str(root / "venv"), "--link", str(tmp_path / "model")]


def test_record_then_check_converges(host):
    d, args = host
    state = d / "state.json"
    assert run("check", state, "D", *args) == {"converged": False,
                                               "reasons": ["no record of a completed deploy on this host"]}
    assert run("record", state, "D", *args)["recorded"]
    assert run("check", state, "D", *args) == {"converged": True, "reasons": []}
    (d / "etc" / "venv" / "lib.py").write_text("changed")  # skipped root: not compared
    assert run("check", state, "D", *args)["converged"]


@pytest.mark.parametrize("drift", ["content", "mode", "new file", "removed", "link", "weights", "digest"])
def test_any_drift_means_the_full_deploy(host, drift):
    d, args = host
    state = d / "state.json"
    run("record", state, "D", *args)
    digest = "D"
    if drift == "content":
        (d / "etc" / "sub" / "env").write_text("A=2\n")
    elif drift == "mode":
        os.chmod(d / "etc" / "sub" / "env", 0o600)
    elif drift == "new file":
        (d / "etc" / "sub" / "other.service").write_text("")
    elif drift == "removed":
        (d / "etc" / "unit.service").unlink()
    elif drift == "link":
        (d / "store" / "id2").mkdir()
        (d / "model").unlink()
        (d / "model").symlink_to(d / "store" / "id2")
    elif drift == "weights":
        (d / "store" / "id1" / "model.safetensors").write_bytes(b"y" * 101)
    else:
        digest = "E"
    out = run("check", state, digest, *args, "--keep")
    assert not out["converged"] and out["reasons"], out
    assert state.exists()  # --keep (--check runs) leaves the record
    assert not run("check", state, digest, *args)["converged"]
    assert not state.exists()  # the full path runs: the stale record is gone until it completes
    assert not run("check", state, "D", *args)["converged"]


def test_health_urls_are_probed(host):
    d, args = host
    state = d / "state.json"
    body = {"text": b"specdeploy_engine_up 1.0\n"}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body["text"])

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    try:
        run("record", state, "D", *args)
        assert run("check", state, "D", *args, "--url", url, "--expect", "specdeploy_engine_up 1.0",
                   "--keep")["converged"]
        body["text"] = b"specdeploy_engine_up 0.0\n"
        out = run("check", state, "D", *args, "--url", url, "--expect", "specdeploy_engine_up 1.0", "--keep")
        assert not out["converged"] and url in out["reasons"][0]
    finally:
        srv.shutdown()


def test_inputs_digest_covers_code_inventory_extra_vars_files_and_weights(tmp_path):
    repo = tmp_path / "repo"
    (repo / "ansible" / "roles").mkdir(parents=True)
    (repo / "ansible" / "deploy.yml").write_text("---\n")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "render.py").write_text("X = 1\n")
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "group_vars" / "all.yml").write_text("specdeploy_port: 8000\n")
    key = tmp_path / "api-key"
    key.write_text("k1")

    def digest(extra=("a=1",), weights=("h model id1",)):
        return converged.inputs_digest(str(repo), str(pkg), [str(inv)], list(extra), [str(key)], list(weights))

    base = digest()
    assert digest() == base
    changes = [lambda: (inv / "group_vars" / "all.yml").write_text("specdeploy_port: 8001\n"),
               lambda: (repo / "ansible" / "deploy.yml").write_text("--- # edited\n"),
               lambda: (pkg / "render.py").write_text("X = 2\n"),
               lambda: key.write_text("k2")]
    seen = {base, digest(extra=("a=2",)), digest(weights=("h model id2",))}
    assert len(seen) == 3
    for change in changes:
        change()
        seen.add(digest())
    assert len(seen) == 3 + len(changes)


def test_check_args_follow_role_defaults_and_inventory_overrides():
    from specdeploy.values.hostpaths import STATE_DIR, expand
    defaults = converged.role_defaults(str(REPO / "ansible" / "roles"), resolve=expand)
    assert defaults["inference_engine_state"] == STATE_DIR  # the roles' path filter, expanded as the filter does
    for names in converged.ROOT_DEFAULTS.values():
        assert all(n in defaults for n in names), names  # a renamed role default fails here
    eng = {"venv": "/opt/specdeploy/venv", "links": ["/models/m"], "exporter_port": 9450, "router_port": 30080}
    args = converged.check_args({"monitoring_prometheus_dir": "/srv/prom"},
                                ["specdeploy_engines", "specdeploy_monitoring"], defaults, eng)
    roots = [args[i + 1] for i, a in enumerate(args) if a == "--root"]
    assert "/srv/prom" in roots and defaults["inference_engine_state"] in roots and "/etc/specdeploy" in roots
    assert "/models/m" in args and "http://127.0.0.1:9450/metrics" in args


def test_two_inventory_hosts_on_one_machine_keep_their_own_records(host):
    """An engine host that is also the monitoring host: both names check and record at once on one filesystem.
    One record for both raced (a check removed a record the other had removed); now each has its own, and their
    records and temporary files are never part of a snapshot."""
    from concurrent.futures import ThreadPoolExecutor
    d, args = host
    records = d / "etc" / "converged"  # inside a managed root, as on a host (/var/lib/specdeploy/converged)
    records.mkdir()
    a, b = (records / Path(converged.state_path(h)).name for h in ("gpu-a", "mon-1"))
    assert a != b and a.name.startswith("gpu-a-") and b.name.startswith("mon-1-")
    assert converged.state_path("../x") != converged.state_path("_.x") and "/" not in Path(
        converged.state_path("../x")).name
    assert "--state" in converged.check_args({}, [], {"inference_engine_state": "/s"}, None, host="gpu-a")

    def both(action: str, digest: str) -> list[dict]:
        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(lambda s: run(action, s, digest, *args, "--skip", str(records)), (a, b)))

    for i in range(5):  # each round: the inputs changed (both checks remove their record), then both record
        assert [r["converged"] for r in both("check", f"D{i}")] == [False, False]
        assert [r["recorded"] for r in both("record", f"D{i}")] == [True, True]
        assert [r["converged"] for r in both("check", f"D{i}")] == [True, True]
    assert sorted(p.name for p in records.iterdir()) == sorted([a.name, b.name])  # no temporary file left


def test_a_file_that_vanishes_during_the_snapshot_is_left_out(tmp_path, monkeypatch):
    (tmp_path / "keep").write_text("k")
    (tmp_path / "gone").write_text("g")
    real = converged._entry

    def entry(p):
        if p.endswith("gone"):
            raise FileNotFoundError(p)
        return real(p)
    monkeypatch.setattr(converged, "_entry", entry)
    out: dict[str, str] = {}
    converged._walk(str(tmp_path), set(), out)
    assert str(tmp_path / "keep") in out and str(tmp_path / "gone") not in out
