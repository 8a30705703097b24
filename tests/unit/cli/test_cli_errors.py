"""Bad input to the CLI ends in a finding that names the file or field and a fix, a non-zero exit, and no
traceback; ``-e`` takes every form ansible-playbook takes."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from helpers import REPO
from specdeploy.values.errors import SpecdeployError
from specdeploy.hostvars.inventory import parse_extra_vars

EXAMPLE = str(REPO / "inventory/example")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_extra_vars_forms_like_ansible_playbook(tmp_path):
    (tmp_path / "v.json").write_text('{"specdeploy_router": {"kind": "x"}, "specdeploy_port": 9001}')
    got = parse_extra_vars(["specdeploy_port=8001 specdeploy_spec_enabled=false",
                            '{"specdeploy_engine_env": {"A": "1 2"}}',
                            f"@{tmp_path / 'v.json'}", "specdeploy_attention_backend='TRITON MLA'"])
    assert got == {"specdeploy_port": 9001, "specdeploy_spec_enabled": False,
                   "specdeploy_engine_env": {"A": "1 2"}, "specdeploy_router": {"kind": "x"},
                   "specdeploy_attention_backend": "TRITON MLA"}


@pytest.mark.parametrize("item, words", [
    ("novalue", ["'novalue' is not KEY=VALUE"]),
    ("{not: [closed", ["not valid YAML/JSON"]),
    ("[1, 2]", ["not a mapping"]),
    ("a='unbalanced", ["balance the quotes"]),
])
def test_extra_vars_bad_forms_are_findings(item, words):
    with pytest.raises(SpecdeployError) as exc:
        parse_extra_vars([item])
    text = " ".join(p.line() for p in exc.value.problems)
    assert all(w in text for w in words), text


def _bad_inventory(tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(EXAMPLE, inv)
    with open(inv / "group_vars/specdeploy_engines.yml", "a") as f:
        f.write("specdeploy_port: [8000\n  oops: : here\n")
    return inv


def test_plan_json_extra_vars_reach_the_render():
    r = cli("plan", "-i", EXAMPLE, "-e", '{"specdeploy_port": 8123}', "--json")
    assert r.returncode == 0, r.stderr
    assert all(h["ports"]["engine"] == 8123 for h in json.loads(r.stdout)["hosts"].values())


@pytest.mark.parametrize("case", ["binary-extra-vars", "unwritable-out", "argspec-role", "defaults-role",
                                  "malformed-group-vars-plan", "malformed-group-vars-preflight"])
def test_bad_input_is_a_clean_error(case, tmp_path):
    binary = tmp_path / "vars.yml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    bad = str(_bad_inventory(tmp_path))
    args, want = {
        "binary-extra-vars": (["plan", "-i", EXAMPLE, "-e", f"@{binary}"], [str(binary), "not UTF-8"]),
        "unwritable-out": (["plan", "-i", EXAMPLE, "--out", "/proc/specdeploy-x"], ["--out", "/proc/specdeploy-x"]),
        "argspec-role": (["schema", "argspec", "nosuch"], ["unknown role 'nosuch'", "model_store"]),
        "defaults-role": (["schema", "defaults", "nosuch"], ["unknown role 'nosuch'"]),
        "malformed-group-vars-plan": (["plan", "-i", bad],
                                      ["group_vars/specdeploy_engines.yml", "Fix:"]),
        "malformed-group-vars-preflight": (["preflight", "-i", bad],
                                           ["group_vars/specdeploy_engines.yml", "Fix:"]),
    }[case]
    r = cli(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout
    assert all(w in r.stderr for w in want), r.stderr
    assert len(r.stderr.splitlines()) <= 3, r.stderr


MODEL = str(REPO / "examples/models/kimi-k2.5-int4")


@pytest.mark.parametrize("args, want", [
    (["gate", "--url", "http://127.0.0.1:1", "--baseline", "{binary}"], ["--baseline", "not UTF-8"]),
    (["gate", "--url", "http://127.0.0.1:1", "--baseline", "{wrong_shape}"], ["--baseline", "not a gate report"]),
    (["gate", "--url", "http://127.0.0.1:1", "--api-key-file", "/nonexistent/key"], ["--api-key-file"]),
    (["gate", "--url", "notaurl"], ["--url", "not an http(s) URL"]),
    (["exporter", "--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--listen", "127.0.0.1:99999"],
     ["--listen", "outside 1-65535"]),
    (["exporter", "--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--listen", "256.1.1.1:9450"],
     ["--listen", "not an IP address"]),
    (["exporter", "--engine", "vllm", "--engine-url", "http://127.0.0.1:1", "--listen", "192.0.2.1:9450"],
     ["--listen", "cannot listen on 192.0.2.1:9450"]),
    (["nccl", "tune", "--model", "/nonexistent/model"], ["--model", "does not exist"]),
    (["nccl", "tune", "--model", "{binary}"], ["--model", "not UTF-8"]),
    (["nccl", "topo", "--matrix", "/nonexistent/topo.txt"], ["--matrix", "does not exist"]),
    (["nccl", "topo", "--matrix", "{binary}"], ["--matrix", "not UTF-8"]),
    (["simulate", "--engine", "vllm", "--version", "0.16.0", "--", "vllm", "serve", MODEL,
      "--speculative-config", "{bad"], ["simulate"]),
    (["simulate", "--engine", "vllm", "--version", "0.16.0", "--", "vllm", "serve", MODEL, "--port", "99999"],
     ["simulate"]),
])
def test_command_values_are_checked(args, want, tmp_path):
    binary = tmp_path / "binary.json"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    wrong = tmp_path / "report.json"
    wrong.write_text('{"levels_by_concurrency": 5}')
    r = cli(*[a.replace("{binary}", str(binary)).replace("{wrong_shape}", str(wrong)) for a in args])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert all(w in r.stderr for w in want), r.stderr
