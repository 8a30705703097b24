"""The simulated fleet host answers module calls as the real modules do: changed only when its state changed, the
converged check the host script's own comparison, readiness and the journal from the faults the world sets."""
from __future__ import annotations

import json

from specdeploy.testing.fleethost import FleetHost, sha1
from specdeploy.testing.fleethost_commands import answer


def call(host: FleetHost, module: str, **args):
    with host.session():
        return host.call(module, args)


def copy(host: FleetHost, dest: str, content: str, mode: str = "0644"):
    with host.session():
        host.s["tmp"]["/root/.ansible/tmp/x/.source"] = content
        return host.call("ansible.legacy.copy", {"dest": dest, "src": "/root/.ansible/tmp/x/.source", "mode": mode})


def test_files_change_once_and_read_back(tmp_path):
    h = FleetHost(tmp_path, "gpu-0001")
    assert copy(h, "/etc/specdeploy/a.env", "A=1\n")["changed"]
    assert not copy(h, "/etc/specdeploy/a.env", "A=1\n")["changed"]  # the same content: no change
    assert copy(h, "/etc/specdeploy/a.env", "A=1\n", "0600")["changed"]  # its mode: a change
    st = call(h, "ansible.legacy.stat", path="/etc/specdeploy/a.env")["stat"]
    assert st["exists"] and st["checksum"] == sha1("A=1\n") and st["mode"] == "0600"
    assert call(h, "ansible.legacy.file", path="/var/lib/x", state="directory", mode="0755")["changed"]
    assert not call(h, "ansible.legacy.file", path="/var/lib/x", state="directory", mode="0755")["changed"]
    assert call(h, "ansible.legacy.slurp", src="/etc/specdeploy/a.env")["content"] == "QT0xCg=="
    assert call(h, "ansible.legacy.slurp", src="/nope").get("failed")
    assert call(h, "ansible.legacy.no_such_module").get("failed")  # never a silent success


def test_units_restart_and_a_fault_crashes_the_release_that_holds_its_text(tmp_path):
    (tmp_path / "faults.json").write_text(json.dumps({"gpu-0001": {"crash_when": "--bad-flag"}}))
    h = FleetHost(tmp_path, "gpu-0001")
    unit = "specdeploy-vllm.service"
    copy(h, f"/etc/systemd/system/{unit}", "[Service]\n")
    copy(h, "/etc/specdeploy/specdeploy-vllm.argv", "vllm serve /m --good\n")
    r = call(h, "ansible.legacy.systemd_service", name=unit, state="started", enabled=True, daemon_reload=True)
    assert r["changed"] and r["status"]["ActiveState"] == "active"
    assert not call(h, "ansible.legacy.systemd_service", name=unit, state="started", enabled=True)["changed"]
    with h.session():
        rc, out, _, _ = answer(h, ["/opt/specdeploy/venv/bin/specdeploy", "ready", "--unit", unit, "--json"], "",
                               False)
    assert rc == 0 and json.loads(out)["status"] == "ready"
    copy(h, "/etc/specdeploy/specdeploy-vllm.argv", "vllm serve /m --bad-flag\n")
    call(h, "ansible.legacy.systemd_service", name=unit, state="restarted")
    with h.session():
        rc, out, _, _ = answer(h, ["/opt/specdeploy/venv/bin/specdeploy", "ready", "--unit", unit, "--json"], "",
                               False)
        _, journal, _, _ = answer(h, ["journalctl", "-u", unit, "-o", "cat"], "", False)
    assert rc == 1 and json.loads(out)["status"] == "crashed"
    from specdeploy.triage import triage_lines
    assert "image_token_index" in triage_lines(journal.splitlines()).root_cause  # the engine's own crash log


def test_converged_check_is_the_scripts_comparison(tmp_path):
    from pathlib import Path

    from specdeploy.hostscripts import converged
    script = Path(converged.__file__).read_text()
    h = FleetHost(tmp_path, "gpu-0001")
    copy(h, "/etc/specdeploy/x.env", "A=1\n")
    args = ["--state", "/var/lib/specdeploy/converged/gpu-0001.json", "--digest", "d1", "--root", "/etc/specdeploy"]

    def run(action, *more):
        with h.session():
            rc, out, _, _ = answer(h, ["/usr/bin/python3", "-", action, *args, *more], script, False)
        assert rc == 0
        return json.loads(out)
    assert not run("check")["converged"]  # no record yet
    assert run("record")["recorded"]
    assert run("check")["converged"]
    copy(h, "/etc/specdeploy/x.env", "A=2\n")  # a managed file changed behind the deploy's back
    got = run("check")
    assert not got["converged"] and any("/etc/specdeploy/x.env" in r for r in got["reasons"])


def test_unknown_commands_fail_loudly(tmp_path):
    h = FleetHost(tmp_path, "gpu-0001")
    with h.session():
        rc, _, err, _ = answer(h, ["curl", "http://example.com"], "", False)
    assert rc == 127 and "no simulated answer" in err
