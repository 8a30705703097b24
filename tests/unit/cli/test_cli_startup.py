"""The command line imports only what a command needs: loading the CLI pulls in no heavy library, and preflight
on the example inventory loads the schema but neither Ansible (a static YAML inventory is read natively) nor the
libraries of other commands (checked in a fresh interpreter each)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO

# Libraries no command needs before it runs, and that preflight on a config-only drafter does not need at all.
HEAVY = ["numpy", "matplotlib", "paramiko", "ansible_runner", "grafana_foundation_sdk", "prometheus_client",
         "safetensors", "jinja2", "pydantic", "ansible", "rich.live", "rich.table"]
NOT_FOR_PREFLIGHT = ["numpy", "matplotlib", "paramiko", "ansible_runner", "grafana_foundation_sdk",
                     "prometheus_client", "safetensors", "rich.live", "rich.table", "ansible", "jinja2"]


def modules_after(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    r = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                       cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return set(json.loads(r.stdout.splitlines()[-1]))


def loaded(mods: set[str], names: list[str]) -> list[str]:
    return [n for n in names if n in mods]


def test_importing_the_cli_loads_no_heavy_library():
    mods = modules_after("import specdeploy.cli")
    assert "typer" in mods and "specdeploy.cli" in mods  # the check sees the imports it is about
    assert loaded(mods, HEAVY) == []


def test_preflight_loads_the_schema_but_not_ansible_nor_other_commands_libraries():
    mods = modules_after(
        "import os, runpy, sys\n"
        "sys.argv = ['specdeploy', 'preflight', '-i', 'inventory/example']\n"
        "stdout, sys.stdout = sys.stdout, open(os.devnull, 'w')\n"
        "try:\n"
        "    runpy.run_module('specdeploy.cli', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "sys.stdout = stdout\n")
    assert {"pydantic", "specdeploy.checks.preflight", "specdeploy.hostvars.inventory_native"} <= mods
    assert loaded(mods, NOT_FOR_PREFLIGHT) == []
