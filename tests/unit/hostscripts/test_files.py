"""The host's directories and marks in one call (hostscripts/files.py), run as the roles run it: the script on the
stdin of a plain python3."""
from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

from specdeploy.hostscripts import files

ME = pwd.getpwuid(os.getuid()).pw_name


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-", *args], input=Path(files.__file__).read_text(), capture_output=True,
                          text=True, timeout=60)


def test_directories_are_made_then_left_alone_and_drift_is_put_back(tmp_path):
    a, b = tmp_path / "etc" / "specdeploy", tmp_path / "secrets"
    specs = [f"{a}:0755:{ME}", f"{b}:0700:{ME}"]
    r = run("dirs", *specs)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"changed": [str(a), str(b)]}
    assert stat.S_IMODE(a.stat().st_mode) == 0o755 and stat.S_IMODE(b.stat().st_mode) == 0o700
    assert json.loads(run("dirs", *specs).stdout) == {"changed": []}
    b.chmod(0o755)  # edited by hand
    r = run("dirs", "--check", *specs)
    assert json.loads(r.stdout) == {"changed": [str(b)]} and stat.S_IMODE(b.stat().st_mode) == 0o755
    assert json.loads(run("dirs", *specs).stdout) == {"changed": [str(b)]}
    assert stat.S_IMODE(b.stat().st_mode) == 0o700


def test_a_link_to_a_directory_is_followed_as_the_file_module_follows_it(tmp_path):
    (tmp_path / "big-disk").mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(tmp_path / "big-disk")
    r = run("dirs", f"{tmp_path / 'state'}:0755:{ME}")
    assert r.returncode == 0 and json.loads(r.stdout) == {"changed": [str(tmp_path / "state")]}, r.stderr
    assert (tmp_path / "state").is_symlink() and stat.S_IMODE((tmp_path / "big-disk").stat().st_mode) == 0o755


def test_check_changes_nothing_on_a_bare_host(tmp_path):
    r = run("dirs", "--check", f"{tmp_path / 'x' / 'y'}:0755:{ME}")
    assert json.loads(r.stdout) == {"changed": [str(tmp_path / "x" / "y")]}
    assert not (tmp_path / "x").exists()


def test_a_file_where_a_directory_belongs_is_named_and_nothing_after_it_changes(tmp_path):
    (tmp_path / "state").write_text("user data\n")
    r = run("dirs", f"{tmp_path / 'state'}:0755:{ME}", f"{tmp_path / 'later'}:0755:{ME}")
    assert r.returncode == 1 and f"{tmp_path / 'state'} is there and is not a directory" in r.stderr
    assert "Traceback" not in r.stderr
    assert (tmp_path / "state").read_text() == "user data\n" and not (tmp_path / "later").exists()


def test_a_relative_path_or_an_unknown_owner_is_refused(tmp_path):
    assert run("dirs", "relative/dir:0755:root").returncode == 1
    r = run("dirs", f"{tmp_path / 'd'}:0755:no-such-user-here")
    assert r.returncode == 1 and "no-such-user-here" in r.stderr and not (tmp_path / "d").exists()


def test_marks_are_read_together_absent_ones_empty_and_each_bounded(tmp_path):
    (tmp_path / "current").write_text("r-abc\n")
    (tmp_path / "big").write_text("x" * (files.MAX_READ * 2))
    r = run("read", str(tmp_path / "current"), str(tmp_path / "previous"), str(tmp_path / "big"))
    got = json.loads(r.stdout)
    assert got[str(tmp_path / "current")] == "r-abc\n" and got[str(tmp_path / "previous")] == ""
    assert len(got[str(tmp_path / "big")]) == files.MAX_READ
