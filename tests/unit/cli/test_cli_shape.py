"""The CLI as its users meet it: commands grouped by audience, the old names still working (deployed units call
them), help on every option, one spelling per option across commands, and `specdeploy --version`."""
import subprocess
import sys

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.cli.groups import DEV, HOST, PANELS

# Options that mean one thing, spelled one way: a dest -> the flags every command that takes it gives it.
SAME_MEANING = {"engine_version": {"new_version", "engine_version"}}


def _walk(cmd, path=()):
    """(path, command, hidden) for every leaf command."""
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _walk(sub, path + (name,))
    else:
        yield path, cmd


def _options(cmd):
    return [p for p in cmd.params if getattr(p, "param_type_name", "") == "option"]


ROOT = get_command(app)
LEAVES = list(_walk(ROOT))


def test_every_visible_option_has_help():
    missing = [(" ".join(path), p.opts) for path, cmd in LEAVES for p in _options(cmd)
               if not p.hidden and not (p.help or "").strip()]
    assert not missing, missing


def test_one_spelling_per_option_across_commands():
    spellings: dict[str, set] = {}
    for path, cmd in LEAVES:
        for p in _options(cmd):
            if p.hidden:
                continue
            dest = next((k for k, names in SAME_MEANING.items() if p.name in names), p.name)
            spellings.setdefault(dest, set()).add(tuple(sorted(p.opts)))
    twice = {k: v for k, v in spellings.items() if len(v) > 1}
    assert not twice, twice
    assert ("--engine-version",) in spellings["engine_version"]


def test_commands_are_listed_by_audience_and_the_host_and_dev_ones_moved_under_their_groups():
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    for panel in set(PANELS.values()) | {"On a host, in the sandbox and for development"}:
        assert panel in r.output
    visible = {name for name, c in ROOT.commands.items() if not getattr(c, "hidden", False)}
    assert visible == set(PANELS) | {"host", "dev"}
    assert set(ROOT.commands["host"].commands) == set(HOST)
    assert set(ROOT.commands["dev"].commands) == set(DEV)


@pytest.mark.parametrize("argv", [
    ["exporter", "--help"], ["host", "exporter", "--help"], ["ready", "--help"], ["host", "ready", "--help"],
    ["simulate", "--help"], ["dev", "simulate", "--help"], ["sandbox", "--help"], ["dev", "sandbox", "--help"],
    ["engine", "image", "--help"], ["dev", "engine", "image", "--help"], ["wheelhouse", "--help"],
    ["patch", "--help"], ["schema", "docs"],
])
def test_old_names_keep_working_beside_the_new_ones(argv):
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output


def test_the_old_version_spelling_still_reaches_the_command():
    new = CliRunner().invoke(app, ["engine", "image", "--engine", "vllm", "--engine-version", "0.16.0", "--field",
                                   "tag"])
    old = CliRunner().invoke(app, ["engine", "image", "--engine", "vllm", "--version", "0.16.0", "--field", "tag"])
    assert new.exit_code == 0 and new.output == old.output
    both = CliRunner().invoke(app, ["engine", "image", "--engine", "vllm", "--version", "0.16.0",
                                    "--engine-version", "0.17.1"])
    assert both.exit_code == 2 and "given twice" in both.output


def test_version():
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("specdeploy ") and "vLLM 0.16.0-" in r.stdout
