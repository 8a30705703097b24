"""Host paths, the ssh command and the gate's command line are spelled once, in the core; the roles take them
through the filter plugin."""
from __future__ import annotations

import re
import subprocess
import sys

from helpers import REPO

from specdeploy.hostscripts import converged
from specdeploy.hostvars.ssh import ssh_argv, ssh_options
from specdeploy.speculation.gate import command_line
from specdeploy.values.hostpaths import CONFIG_DIR, HOST_PATHS, OPT_DIR, PATH_TEMPLATES, STATE_DIR


def _filters():
    from helpers import ansible_filters
    return vars(ansible_filters())


def test_the_roles_spell_no_host_path():
    hits = subprocess.run(["grep", "-rnE", "/var/lib/specdeploy|/opt/specdeploy", "ansible/"], cwd=REPO,
                          capture_output=True, text=True).stdout.splitlines()
    assert len(hits) <= 2, "host paths spelled in ansible/ (use the specdeploy_path filter):\n" + "\n".join(hits)
    used = set()
    for f in (REPO / "ansible").rglob("*.yml"):
        used |= set(re.findall(r"'(\w+)' \| specdeploy_path", f.read_text()))
    assert used and used <= set(HOST_PATHS) | set(PATH_TEMPLATES), used - set(HOST_PATHS) - set(PATH_TEMPLATES)


def test_the_path_filter_answers_from_the_core_and_refuses_an_unknown_name():
    f = _filters()
    assert f["specdeploy_path"]("state") == STATE_DIR and f["specdeploy_path"]("venv") == f"{OPT_DIR}/venv"
    try:
        f["specdeploy_path"]("nope")
    except Exception as exc:  # AnsibleFilterError
        assert "no host path 'nope'" in str(exc)
    else:
        raise AssertionError("an unknown host path was answered")


def test_the_host_scripts_repeat_the_core_paths():
    """converged runs on hosts with the standard library only, so it repeats these paths; they must agree."""
    assert converged.RECORDS.startswith(STATE_DIR + "/") and converged.LEGACY_STATE.startswith(STATE_DIR + "/")
    assert CONFIG_DIR in converged.FIXED_ROOTS and OPT_DIR in converged.FIXED_ROOTS


def test_one_ssh_command_for_facts_status_and_copies():
    v = {"ansible_host": "10.0.0.5", "ansible_user": "ops", "ansible_port": 2222,
         "ansible_ssh_private_key_file": "/k/id", "ansible_ssh_common_args": "-o StrictHostKeyChecking=no",
         "ansible_ssh_extra_args": "-o LogLevel=ERROR"}
    argv = ssh_argv("gpu-a", v)
    assert argv[0] == "ssh" and argv[-1] == "ops@10.0.0.5"
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k/id"
    assert "StrictHostKeyChecking=no" in argv and "LogLevel=ERROR" in argv and "BatchMode=yes" in argv
    assert ssh_argv("gpu-a", {})[-1] == "gpu-a"
    assert _filters()["specdeploy_ssh"](v).split() == ssh_options(v)  # what the common role's rsync -e gets


def test_the_gate_roles_command_lines_parse(tmp_path):
    """Both measurements' command lines, as the role builds them, are accepted by `specdeploy gate`: an unknown
    option or a missing value would be a usage error (exit 2 with 'No such option' or 'requires an argument')."""
    s = {"address": "127.0.0.1", "port": "9", "engine": "vllm", "concurrency": "1,8", "requests": "16",
         "max_tokens": "8", "k": "3", "margin": "0.1", "api_key_file": ""}
    base = command_line(s, str(tmp_path / "baseline"))
    run = command_line(s, str(tmp_path / "run"), "/nope/report.json")
    assert "--baseline" not in base and run[run.index("--baseline") + 1] == "/nope/report.json"
    assert run[run.index("--k") + 1] == "3" and base[base.index("--requests") + 1] == "16"
    priced = command_line(s, str(tmp_path / "priced"), "/nope/report.json", "/nope/surface.json")
    assert "--surface" not in run and priced[priced.index("--surface") + 1] == "/nope/surface.json"
    for argv in (base, run, priced):
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", *argv], capture_output=True, text=True,
                           timeout=60, cwd=REPO)
        assert r.returncode != 0  # nothing listens on port 9 / the baseline does not exist
        assert "No such option" not in r.stderr and "requires an argument" not in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
