"""Checkpoint verification (headers, index, manifest), the verified resumable copy and the atomic switch."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from specdeploy.hostscripts import staging
from specdeploy.ops import copy as opscopy
from specdeploy.testing.fixtures import write_model

CONFIG = json.loads((REPO / "examples/models/kimi-k2.5-int4/config.json").read_text())
SCRIPT = REPO / "src/specdeploy/hostscripts/staging.py"


@pytest.fixture
def model(tmp_path) -> Path:
    return write_model(tmp_path / "src" / "kimi", CONFIG, shards=3, random_bytes=256 << 10, hole_bytes=8 << 20)


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()
            and not p.name.startswith(".specdeploy")}


def messages(res) -> str:
    return "\n".join(p.line() for p in res.problems)


def test_complete_checkpoint_verifies(model):
    res = staging.verify(model)
    assert res.ok, messages(res)
    assert res.files == 3 and res.hashed == 0
    assert res.bytes == sum((model / f"model-0000{i}-of-00003.safetensors").stat().st_size for i in (1, 2, 3))


@pytest.mark.parametrize("damage, words", [
    ("missing_shard", ["1 of 3 shards", "model-00002-of-00003.safetensors", "missing"]),
    ("truncated", ["truncated", "header implies"]),
    ("longer", ["longer than its header"]),
    ("missing_index", ["model.safetensors.index.json", "missing", "3 shard files"]),
    ("missing_config", ["config.json is missing"]),
    ("foreign_index", ["lacks 2 tensors", "different checkpoints"]),
    ("cut_in_header", ["truncated inside"]),
])
def test_damaged_checkpoints_name_the_variable_and_the_fix(model, damage, words):
    shard = model / "model-00002-of-00003.safetensors"
    if damage == "missing_shard":
        shard.unlink()
    elif damage == "truncated":
        os.truncate(shard, shard.stat().st_size - 4096)
    elif damage == "longer":
        with open(shard, "ab") as fh:
            fh.write(b"x")
    elif damage == "missing_index":
        (model / staging.INDEX).unlink()
    elif damage == "missing_config":
        (model / "config.json").unlink()
    elif damage == "foreign_index":
        idx = json.loads((model / staging.INDEX).read_text())
        idx["weight_map"] = {k.replace("layers.2.", "layers.9."): v for k, v in idx["weight_map"].items()}
        (model / staging.INDEX).write_text(json.dumps(idx))
    elif damage == "cut_in_header":
        os.truncate(shard, 20)
    res = staging.verify(model, "specdeploy_model_shared_path")
    assert not res.ok
    text = messages(res)
    assert all(p.subject == "specdeploy_model_shared_path" for p in res.problems)
    for w in words:
        assert w in text, text
    assert "Fix:" in text


def test_manifest_hashes_once_then_trusts_the_stamp(model, tmp_path):
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in sorted(model.iterdir())]
    (model / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    stamp = tmp_path / "stamp.json"
    first = staging.verify(model, manifest="SHA256SUMS", stamp=stamp, write_stamp=True)
    assert first.ok, messages(first)
    assert first.hashed == 5  # config, index, 3 shards
    again = staging.verify(model, manifest="SHA256SUMS", stamp=stamp, write_stamp=True)
    assert again.ok and again.hashed == 0
    # one flipped byte inside the random tensor: same size, header fine, sha256 differs
    shard = model / "model-00001-of-00003.safetensors"
    with open(shard, "r+b") as fh:
        fh.seek(shard.stat().st_size - (8 << 20) - 100)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))
    bad = staging.verify(model, manifest="SHA256SUMS", stamp=stamp)
    assert not bad.ok and bad.hashed == 1
    assert "specdeploy_model_sha256_manifest" in messages(bad) and "differs from the manifest" in messages(bad)


def test_copy_is_byte_identical_sparse_and_verified(model, tmp_path):
    dst = tmp_path / "dst"
    out = staging.copy_tree(model, dst, jobs=2)
    assert out["copied"] == 5
    assert digests(dst) == digests(model)
    shard = dst / "model-00001-of-00003.safetensors"
    assert shard.stat().st_blocks * 512 < 2 << 20  # the 8 MiB hole stayed a hole
    assert shard.stat().st_mtime_ns == (model / shard.name).stat().st_mtime_ns
    again = staging.copy_tree(model, dst, jobs=2)
    assert again["copied"] == 0 and again["skipped"] == 5


def test_copy_resumes_after_a_kill(tmp_path):
    src = write_model(tmp_path / "big", CONFIG, shards=4, random_bytes=48 << 20, hole_bytes=1 << 20, seed=3)
    link = tmp_path / "local" / "kimi"
    link.parent.mkdir()
    progress = tmp_path / "progress.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    # 40 MB/s: the ~200 MB copy takes ~5 s, so the kill lands mid-copy however fast or loaded the machine is
    p = subprocess.Popen([sys.executable, str(SCRIPT), "stage", str(src), str(link), "--jobs", "1",
                          "--max-rate-mbps", "40", "--progress-file", str(progress)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline:
        if progress.is_file() and json.loads(progress.read_text())["bytes"] > (60 << 20):
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    partial = staging.store_of(link) / f"{staging.tree_id(src)}.partial"
    assert partial.is_dir() and not link.exists()
    done_before = json.loads((partial / staging.JOURNAL).read_text()) if (partial / staging.JOURNAL).is_file() else {}
    assert len(done_before) < 6
    out = staging.stage(src, link, jobs=2)
    assert out["changed"] and out["skipped"] == len(done_before)
    assert digests(link) == digests(src)
    assert staging.verify(link).ok


def test_stage_switches_atomically_and_keeps_the_previous_copy(model, tmp_path, monkeypatch):
    link = tmp_path / "models" / "kimi"
    link.parent.mkdir()
    first = staging.stage(model, link)
    assert first["changed"] and link.is_symlink()
    # no change: nothing is read
    monkeypatch.setattr(staging, "_copy_file", lambda *a, **k: pytest.fail("copied on a no-change stage"))
    monkeypatch.setattr(staging, "_sha256", lambda *a, **k: pytest.fail("hashed on a no-change stage"))
    assert staging.stage(model, link) == {"changed": False, "id": first["id"], "target": first["target"]}
    monkeypatch.undo()
    # a new config: the shards are hard-linked from the previous copy, not copied again
    (model / "generation_config.json").write_text('{"max_new_tokens": 16}')
    second = staging.stage(model, link)
    assert second["previous"] == first["target"] and second["copied"] == 1 and second["linked"] == 5
    assert Path(first["target"]).is_dir() and staging.verify(first["target"]).ok
    assert os.readlink(link) == second["target"] and digests(link) == digests(model)


def test_stage_never_replaces_a_directory_of_weights(model, tmp_path):
    link = tmp_path / "models" / "kimi"
    write_model(link, CONFIG, shards=2, random_bytes=4096, hole_bytes=4096, seed=9)
    before = digests(link)
    with pytest.raises(staging.SwitchError, match="specdeploy_model_source: host"):
        staging.stage(model, link)
    assert digests(link) == before and not link.is_symlink()


def test_script_runs_on_a_bare_python_and_exits_cleanly(model, tmp_path):
    (model / "model-00003-of-00003.safetensors").unlink()
    r = subprocess.run([sys.executable, "-I", str(SCRIPT), "verify", str(model), "--variable",
                        "specdeploy_drafter_path"], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    assert r.stdout.startswith("ERROR specdeploy_drafter_path: 1 of 3 shards")
    r = subprocess.run([sys.executable, "-I", str(SCRIPT), "verify", str(tmp_path / "nope")], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 1 and "is not a directory" in r.stdout


BASE = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0",
        "specdeploy_hardware": "rtx_pro_6000_pcie", "specdeploy_model_path": "/models/kimi"}


def errors(variables: dict, base: Path | None = None) -> list:
    from specdeploy.checks.preflight import preflight_host
    return [f for f in preflight_host("gpu-x", {**BASE, **variables}, base).findings if f.severity == "error"]


def test_preflight_refuses_an_incomplete_controller_source(model):
    ok = {"specdeploy_model_source": "controller", "specdeploy_model_controller_path": str(model)}
    assert errors(ok) == []
    (model / "model-00003-of-00003.safetensors").unlink()
    errs = errors(ok)
    assert [e.subject for e in errs] == ["specdeploy_model_controller_path"]
    assert "1 of 3 shards" in errs[0].message and errs[0].fix


def test_preflight_errors_on_missing_paths_and_old_names(tmp_path):
    errs = errors({"specdeploy_model_config_copy": str(tmp_path / "nope")})
    assert [e.subject for e in errs] == ["specdeploy_model_config_copy"] and "no config.json" in errs[0].message
    errs = errors({"specdeploy_model_source": "shared"})
    assert [e.subject for e in errs] == ["specdeploy_model_shared_path"]
    errs = errors({"specdeploy_spec_enabled": True, "specdeploy_drafter_path": "/models/d",
                   "specdeploy_drafter_source": "controller"})
    assert [e.subject for e in errs] == ["specdeploy_drafter_controller_path"]
    errs = errors({"specdeploy_model_local_path": "/x"})
    assert errs[0].subject == "specdeploy_model_local_path" and "specdeploy_model_config_copy" in errs[0].fix


def test_a_third_copy_prunes_the_first_and_keeps_the_previous_and_partials(model, tmp_path):
    link = tmp_path / "models" / "kimi"
    link.parent.mkdir()
    first = staging.stage(model, link)
    (model / "generation_config.json").write_text('{"max_new_tokens": 1}')
    second = staging.stage(model, link)
    assert second["pruned"] == [] and Path(first["target"]).is_dir()  # the previous copy stays
    stale = staging.store_of(link) / "0123456789abcdef.partial"  # an interrupted copy: a rerun resumes it
    stale.mkdir()
    (model / "generation_config.json").write_text('{"max_new_tokens": 2}')
    third = staging.stage(model, link)
    assert third["pruned"] == [first["target"]] and not Path(first["target"]).exists()
    assert third["previous"] == second["target"] and staging.verify(second["target"]).ok
    assert stale.is_dir() and digests(link) == digests(model)
    assert sorted(p.name for p in staging.store_of(link).iterdir()) == sorted(
        [Path(second["target"]).name, Path(third["target"]).name, stale.name])


def _alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except OSError:
        return False


def test_controller_copy_stops_the_copy_an_interrupted_run_left_going(tmp_path):
    """Stopping a play leaves its copy running (Ansible's workers run in sessions of their own): the next copy to
    the same destination stops that one first, and only that one."""
    log = tmp_path / "stage.log"
    script = [sys.executable, "-m", "specdeploy.ops.copy", "--log", str(log), "--"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    dest = "root@10.0.0.9:/srv/models/.m.specdeploy/x.partial/"
    first = subprocess.Popen(script + ["sh", "-c", "printf '  1,024  10%%   1.00MB/s    0:00:09\\r'; exec sleep 60",
                                       dest], env=env, start_new_session=True)
    pidfile = log.with_name(log.name + ".pid")
    deadline = time.time() + 20
    while not pidfile.exists() and time.time() < deadline:
        time.sleep(0.05)
    orphan = json.loads(pidfile.read_text())["pid"]
    first.kill()  # the wrapper dies as a killed worker would; its copy goes on
    first.wait()
    assert _alive(orphan)
    bystander = subprocess.Popen(["sleep", "60"])  # same command, not recorded: must survive
    try:
        # another destination (another fleet's host of the same name): its copy is not this one's to stop
        r = subprocess.run(script + ["sh", "-c", "true", "root@10.9.9.9:/srv/x/"], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and "stopped" not in r.stdout and _alive(orphan)
        pidfile.write_text(json.dumps({"pid": orphan, "start": opscopy._start_time(orphan), "dest": dest}))
        r = subprocess.run(script + ["sh", "-c", "echo 'Literal data: 5 bytes'; echo '  99  100%  2.00MB/s  0:00:00'",
                                     dest], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert f"stopped the copy (pid {orphan})" in r.stdout and "Literal data: 5 bytes" in r.stdout
        assert "100%" not in r.stdout  # progress goes to the log only
        assert not _alive(orphan) and _alive(bystander.pid)
        assert not pidfile.exists()
        # a recorded pid that now names another process (its start time differs): left alone
        pidfile.write_text(json.dumps({"pid": bystander.pid, "start": "1", "dest": dest}))
        r = subprocess.run(script + ["sh", "-c", "exit 3", dest], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 3 and "stopped" not in r.stdout and _alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_controller_copy_never_leaves_its_copy_unrecorded(tmp_path):
    """When the wrapper cannot keep its record (here the record's place is a directory), it stops its copy
    instead of leaving it running where no later run would find it."""
    log = tmp_path / "stage.log"
    (tmp_path / "stage.log.pid.tmp").mkdir()
    marker = tmp_path / "still-running"
    r = subprocess.run([sys.executable, "-m", "specdeploy.ops.copy", "--log", str(log), "--", "sh", "-c",
                        f"sleep 3; touch {marker}", "dest"], env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    time.sleep(4)
    assert not marker.exists()


def test_controller_copy_without_a_command_is_a_clean_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdeploy.ops.copy", "--log", str(tmp_path / "l")],
                       env=dict(os.environ, PYTHONPATH=str(REPO / "src")), capture_output=True, text=True)
    assert r.returncode == 2 and "Fix:" in r.stderr and "Traceback" not in r.stderr
