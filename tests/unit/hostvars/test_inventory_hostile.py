"""Inventory files that would hang, exhaust or mislead the readers are refused, by the native reader and by the
Ansible one alike: a FIFO, an oversized file, an alias bomb, a mapping key given twice (Ansible only warns), a
group that contains itself, a file that is not UTF-8, a directory where a file belongs and a file where a directory
belongs. Each is one finding naming the file and the fix, exit 2, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdeploy.values.errors import SpecdeployError
from specdeploy.hostvars.inventory_files import MAX_BYTES, check_text

# an Ansible setting this reader does not take: the inventory is read through Ansible's API instead
READERS = {"native": {}, "ansible": {"ANSIBLE_DUPLICATE_YAML_DICT_KEY": "warn"}}
HOSTS = """all:
  children:
    specdeploy_engines:
      hosts:
        gpu-a:
          ansible_host: 127.0.0.1
"""


def bomb(levels: int = 9) -> str:
    lines = ["    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "all:\n  vars:\n    laughs:\n" + "\n".join("  " + x for x in lines) + "\n" + HOSTS.removeprefix("all:\n")


def plan(inv: Path, reader: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(READERS[reader])
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", "plan", "--json", "-i", str(inv), *extra],
                          capture_output=True, text=True, env=env, timeout=60)


def refused(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == "", r.stderr
    assert all(w in r.stderr for w in words), r.stderr
    assert "Fix:" in r.stderr
    return r.stderr


@pytest.mark.parametrize("reader", READERS)
def test_a_fifo_is_refused_without_blocking(example_inv, tmp_path, reader):
    fifo = tmp_path / "hosts.yml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    refused(plan(fifo, reader), str(fifo), "not a regular file")
    os.mkfifo(example_inv / "group_vars" / "all.yml")
    refused(plan(example_inv, reader), str(example_inv / "group_vars" / "all.yml"), "not a regular file")
    os.mkfifo(example_inv / "more.yml")  # an inventory file in the directory
    refused(plan(example_inv, reader), "more.yml", "not a regular file")
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("reader", READERS)
def test_an_oversized_file_is_refused(example_inv, reader):
    big = example_inv / "group_vars" / "all.yml"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: the size alone refuses it
    refused(plan(example_inv, reader), str(big), "16 MiB")


@pytest.mark.parametrize("reader", READERS)
def test_an_alias_bomb_is_refused_in_well_under_a_second(example_inv, reader):
    (example_inv / "hosts.yml").write_text(bomb())
    assert len(bomb()) < 1024
    t0 = time.monotonic()
    with pytest.raises(SpecdeployError) as exc:
        check_text(example_inv / "hosts.yml", bomb())
    assert time.monotonic() - t0 < 0.5 and "alias" in str(exc.value)
    refused(plan(example_inv, reader), f"{example_inv / 'hosts.yml'}:1", "1,000,000 nodes")
    self_ref = example_inv / "group_vars" / "all.yml"
    self_ref.write_text("loop: &a [1, *a]\n")
    (example_inv / "hosts.yml").write_text(HOSTS)
    refused(plan(example_inv, reader), f"{self_ref}:1", "refers to itself")


def test_aliases_within_the_budget_still_read(example_inv):
    gv = example_inv / "group_vars" / "all.yml"
    gv.write_text("base: &base {a: 1, b: [1, 2]}\nuses: [*base, *base]\n")
    r = plan(example_inv, "native")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("reader", READERS)
def test_a_key_given_twice_is_refused_where_ansible_warns(example_inv, reader):
    hosts = example_inv / "hosts.yml"
    text = hosts.read_text()
    hosts.write_text(text.replace("        gpu-b:\n", "        gpu-a:\n          ansible_host: 10.9.9.9\n"
                                                   "        gpu-b:\n"))
    line = hosts.read_text().splitlines().index("        gpu-a:", 9) + 1
    err = refused(plan(example_inv, reader), f"{hosts}:{line}", "'gpu-a' is given twice", "Ansible warns")
    assert "specdeploy refuses" in err
    hosts.write_text(text)
    gv = example_inv / "group_vars" / "specdeploy_engines.yml"
    gv.write_text(gv.read_text() + "specdeploy_port: 9000\n")
    line = len(gv.read_text().splitlines())
    refused(plan(example_inv, reader), f"{gv}:{line}", "'specdeploy_port' is given twice")
    if reader == "ansible":  # Ansible itself reads the file, keeping the last value, with a warning only
        r = subprocess.run(["ansible-inventory", "-i", str(example_inv), "--host", "gpu-a"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and "duplicate mapping key" in r.stderr.lower() and '"specdeploy_port": 9000' in \
            r.stdout


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("shape,group,fix", [
    ("self", "specdeploy_engines", "remove specdeploy_engines from the children of specdeploy_engines"),
    ("cycle", "specdeploy_engines", "remove specdeploy_engines from the children of racks"),
    ("elsewhere", "a", "remove a from the children of b")])
def test_a_group_that_contains_itself_is_refused(example_inv, reader, shape, group, fix):
    hosts = example_inv / "hosts.yml"
    text = hosts.read_text()
    if shape == "self":
        text = text.replace("    specdeploy_monitoring:\n", "      children:\n        specdeploy_engines: {}\n"
                                                          "    specdeploy_monitoring:\n")
    elif shape == "cycle":
        text = text.replace("    specdeploy_monitoring:\n", "      children:\n        racks:\n          children:\n"
                                                          "            specdeploy_engines: {}\n"
                                                          "    specdeploy_monitoring:\n")
    else:  # across two files of the inventory directory
        text += "    a:\n      children:\n        b: {}\n"
        (example_inv / "more.yml").write_text("all:\n  children:\n    b:\n      children:\n        a: {}\n")
    hosts.write_text(text)
    refused(plan(example_inv, reader), f"group {group} contains itself", fix)


@pytest.mark.parametrize("reader", READERS)
def test_a_file_that_is_not_utf8_is_refused(example_inv, reader):
    hv = example_inv / "host_vars" / "gpu-b" / "specdeploy_nccl.yml"
    hv.write_bytes(hv.read_bytes() + b"note: caf\xe9\n")
    line = hv.read_bytes().count(b"\n")
    refused(plan(example_inv, reader), f"{hv}:{line}", "not UTF-8", "0xe9")


@pytest.mark.parametrize("reader", READERS)
def test_a_directory_or_file_in_the_wrong_place_is_refused(example_inv, tmp_path, reader):
    d = tmp_path / "vars.yml"
    d.mkdir()
    refused(plan(example_inv, reader, "-e", f"@{d}"), str(d), "is a directory where a file is expected")
    gv = example_inv / "group_vars"
    saved = {p.name: p.read_text() for p in gv.iterdir()}
    for p in gv.iterdir():
        p.unlink()
    gv.rmdir()
    gv.write_text("specdeploy_port: 1\n")  # Ansible would skip it silently and read no group variables
    refused(plan(example_inv, reader), str(gv), "is not a directory")
    gv.unlink()
    gv.mkdir()
    for name, content in saved.items():
        (gv / name).write_text(content)
    assert plan(example_inv, reader).returncode == 0
