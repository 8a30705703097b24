"""Commands that write a whole --out directory never delete what they did not write (specdeploy.plan.outdir)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.values.errors import SpecdeployError
from specdeploy.plan.outdir import MARKER, atomic_output_dir


def snapshot(root: Path) -> dict:
    """Every path under ``root`` with its bytes (None for directories)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", *args], capture_output=True, text=True)


@pytest.fixture
def drafter(repo, tmp_path):
    from specdeploy.testing.fixtures import drafter_config, write_drafter
    return write_drafter(tmp_path / "work" / "drafter", drafter_config(eagle_aux_hidden_state_layer_ids=None))


@pytest.fixture
def target(repo):
    return repo / "examples/models/kimi-k2.5-int4"


def convert_cli(drafter, target, out):
    return cli("drafter", "convert", str(drafter), "--target", str(target), "--engine", "sglang",
               "--engine-version", "0.5.11", "--out", str(out))


def test_convert_into_the_drafters_parent_is_refused_and_siblings_survive(drafter, target):
    parent = drafter.parent
    (parent / "notes.txt").write_text("keep me")
    (parent / "other-model").mkdir()
    (parent / "other-model" / "w.bin").write_bytes(b"\x00" * 10)
    before = snapshot(parent)
    r = convert_cli(drafter, target, parent)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--out" in r.stderr and "remove" in r.stderr and "new --out" in r.stderr
    assert snapshot(parent) == before


def test_convert_refuses_an_existing_directory_it_did_not_write_byte_identical(drafter, target, tmp_path):
    out = tmp_path / "precious"
    (out / "sub").mkdir(parents=True)
    (out / "data.json").write_text('{"x": 1}')
    (out / "sub" / "f").write_bytes(b"abc")
    before = snapshot(out)
    r = convert_cli(drafter, target, out)
    assert r.returncode != 0 and f"{MARKER}" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious", "work"]  # no temp directory left


def test_convert_refuses_out_equal_to_the_input_or_containing_it(drafter, target, tmp_path):
    before = snapshot(tmp_path)
    for out in (drafter, drafter.parent, tmp_path):
        r = convert_cli(drafter, target, out)
        assert r.returncode != 0 and "input directory" in r.stderr, r.stderr
    assert snapshot(tmp_path) == before


def test_convert_rerun_replaces_its_own_output_and_keeps_siblings(drafter, target, tmp_path):
    out = tmp_path / "conv"
    (tmp_path / "sibling").write_text("s")
    assert convert_cli(drafter, target, out).returncode == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["command"] == "drafter convert" and "config.json" in marker["files"]
    r = convert_cli(drafter, target, out)  # its own output, as it wrote it: replaced
    assert r.returncode == 0, r.stderr
    assert (out / "config.json").is_file()
    assert (tmp_path / "sibling").read_text() == "s"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv", "sibling", "work"]


def test_convert_rerun_refuses_an_output_to_which_files_were_added_byte_identical(drafter, target, tmp_path):
    """specdeploy deletes nothing it did not write: a file added to its earlier output stops the rerun, named."""
    out = tmp_path / "conv"
    assert convert_cli(drafter, target, out).returncode == 0
    (out / "notes.txt").write_text("mine")
    (out / "extra").mkdir()
    (out / "extra" / "w.bin").write_bytes(b"\x01" * 5)
    before = snapshot(out)
    r = convert_cli(drafter, target, out)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "notes.txt" in r.stderr and "extra/" in r.stderr and "does not delete" in r.stderr, r.stderr
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv", "work"]


def test_an_output_marked_before_manifests_is_still_replaced(drafter, target, tmp_path):
    """An output whose marker names the command but lists no files (written before manifests) is the command's
    own: replaced as before."""
    out = tmp_path / "conv"
    assert convert_cli(drafter, target, out).returncode == 0
    (out / MARKER).write_text(json.dumps({"command": "drafter convert"}))
    (out / "stale-file").write_text("from an older run")
    assert convert_cli(drafter, target, out).returncode == 0
    assert not (out / "stale-file").exists()


def test_convert_replaces_an_unmarked_conversion_from_before(drafter, target, tmp_path):
    out = tmp_path / "old"
    assert convert_cli(drafter, target, out).returncode == 0
    (out / MARKER).unlink()  # as written before outputs were marked: the conversion record is there
    assert convert_cli(drafter, target, out).returncode == 0
    assert (out / MARKER).is_file()


def test_an_output_of_another_command_is_refused(tmp_path):
    out = tmp_path / "o"
    with atomic_output_dir(out, "engine standin") as d:
        (d / "x").write_text("1")
    with pytest.raises(SpecdeployError) as ei:
        with atomic_output_dir(out, "drafter convert"):
            pass
    assert ei.value.problems[0].subject == "--out"
    assert (out / "x").read_text() == "1"


def test_a_failure_while_writing_leaves_nothing_and_the_old_output_in_place(tmp_path):
    out = tmp_path / "o"
    with atomic_output_dir(out, "wheelhouse") as d:
        (d / "v").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out, "wheelhouse") as d:
            (d / "v").write_text("2")
            raise RuntimeError("boom")
    assert (out / "v").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    # a file, a symlink and a filesystem root are never an output directory
    (tmp_path / "f").write_text("f")
    (tmp_path / "l").symlink_to(out)
    for bad in (tmp_path / "f", tmp_path / "l", Path("/")):
        with pytest.raises(SpecdeployError):
            with atomic_output_dir(bad, "wheelhouse"):
                pass
    assert (tmp_path / "f").read_text() == "f" and (out / "v").read_text() == "1"


def test_failed_standin_leaves_the_directory_as_it_was(tmp_path, monkeypatch):
    from specdeploy.plan import images
    from specdeploy.engines import upstream

    def offline(engine, version):
        raise upstream.UpstreamError("no package index (test)")
    monkeypatch.setattr(upstream, "source", offline)
    # a previous stand-in context (unmarked, as written before) and a non-output directory
    prev = tmp_path / "standin"
    (prev / "engine-src").mkdir(parents=True)
    (prev / "STAMP").write_text("vllm-0.1.0-old\n")
    before = snapshot(tmp_path)
    with pytest.raises(upstream.UpstreamError):
        images.standin_context("vllm", "0.16.0", prev)
    assert snapshot(tmp_path) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep").write_text("k")
    with pytest.raises(SpecdeployError) as ei:
        images.standin_context("vllm", "0.16.0", other)
    assert "--out" == ei.value.problems[0].subject
    assert (other / "keep").read_text() == "k" and sorted(p.name for p in tmp_path.iterdir()) == ["other", "standin"]


def test_standin_cli_refuses_a_non_output_directory(tmp_path):
    (tmp_path / "keep").write_text("k")
    r = cli("engine", "standin", "--engine", "vllm", "--version", "0.16.0", "--out", str(tmp_path))
    assert r.returncode == 2 and "ERROR --out" in r.stderr and "Traceback" not in r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]


def test_standin_replaces_its_own_output(tmp_path, monkeypatch):
    from specdeploy.plan import images
    from specdeploy.engines import upstream
    src = tmp_path / "src"
    (src / "vllm").mkdir(parents=True)
    (src / "vllm" / "__init__.py").write_text("# v\n")
    monkeypatch.setattr(upstream, "source", lambda engine, version: src)
    out = tmp_path / "ctx"
    s1 = images.standin_context("vllm", "0.16.0", out)
    (out / "STAMP").write_text("stale\n")  # forces a rebuild over the previous output
    assert images.standin_context("vllm", "0.16.0", out) == s1
    assert (out / "STAMP").read_text().strip() == s1 and (out / "Dockerfile").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx", "src"]


def test_wheelhouse_refuses_a_non_output_directory(tmp_path):
    (tmp_path / "mine.whl").write_text("not yours")
    r = cli("wheelhouse", "--out", str(tmp_path))
    assert r.returncode == 2 and "ERROR --out" in r.stderr
    assert (tmp_path / "mine.whl").read_text() == "not yours"
