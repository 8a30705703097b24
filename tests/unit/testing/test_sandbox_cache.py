"""The sandbox's caches are keyed by their inputs, built beside their final place, locked, and cleaned up on
failure: what a machine kept from older code is rebuilt, never reused (no root or hosts needed, except where
marked)."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from specdeploy.values.errors import SpecdeployError
from specdeploy.testing import cache, sandbox


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "STATE", tmp_path / "state")
    monkeypatch.setattr(sandbox, "CACHE", tmp_path / "cache")
    return tmp_path / "state"


def _doctor(drafter: Path, target: Path):
    from specdeploy.drafter import check
    return check(drafter, target, "vllm", "0.16.0")


def _seed_old_artifacts(state: Path):
    """What the code before content keys left behind: a target with config.json only, a drafter whose d2t holds
    the end-of-turn token but not the document EOS."""
    from specdeploy.testing.fixtures import drafter_config, write_drafter, write_model
    cfg = json.loads((sandbox._example_model() / "config.json").read_text())
    write_model(state / "artifacts" / sandbox.ARTIFACT_MODEL, cfg, shards=1)
    write_drafter(state / "artifacts" / sandbox.ARTIFACT_DRAFTER, drafter_config(eagle_config=None))


def test_artifacts_from_older_code_are_rebuilt_and_pass_the_doctor(state):
    _seed_old_artifacts(state)
    model = state / "artifacts" / sandbox.ARTIFACT_MODEL
    assert not (model / "tokenizer_config.json").exists()
    stale = _doctor(state / "artifacts" / sandbox.ARTIFACT_DRAFTER, model)
    # without the tokenizer files the doctor cannot tell the turn end, and says so (older rules refused the deploy)
    assert any(f.severity in ("error", "warning") and f.subject == "d2t" for f in stale.findings)

    drafter = sandbox.artifacts()
    assert cache.key_of(state / "artifacts") == sandbox.artifacts_key()
    for name in ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                 "model.safetensors.index.json"):
        assert (model / name).is_file(), name
    tc = json.loads((model / "tokenizer_config.json").read_text())
    assert "<|im_end|>" in tc["chat_template"] and tc["added_tokens_decoder"]["163586"]["content"] == "<|im_end|>"
    rep = _doctor(drafter, model)
    # the target-class finding is the one the vLLM 0.16 patch set answers (preflight weighs it with the patches)
    assert not [f for f in rep.findings if f.severity == "error" and f.subject != "target"], rep.findings
    assert not [f for f in rep.findings if f.subject == "d2t" and f.severity == "warning"], rep.findings
    assert len(list(model.glob("model-*.safetensors"))) == 3  # the old single-shard model is gone


def test_artifacts_with_the_right_key_are_reused_and_a_changed_input_rebuilds_them(state, monkeypatch):
    sandbox.artifacts()
    shard = next((state / "artifacts" / sandbox.ARTIFACT_MODEL).glob("model-*.safetensors"))
    ino = shard.stat().st_ino
    sandbox.artifacts()
    assert shard.stat().st_ino == ino  # reused
    monkeypatch.setattr(sandbox, "artifacts_key", lambda: "other-inputs")
    sandbox.artifacts()
    assert shard.stat().st_ino != ino and cache.key_of(state / "artifacts") == "other-inputs"
    assert not list(state.glob(".artifacts.*"))  # the old entry and the build directory are gone


def test_a_failed_build_leaves_the_old_entry_and_no_partial_directory(tmp_path):
    final = tmp_path / "entry"
    cache.build_entry(final, "k1", lambda d: (d / "a").write_text("one"), tmp_path / "lock", "test build")

    def broken(d: Path):
        (d / "a").write_text("half")
        raise RuntimeError("killed halfway")

    with pytest.raises(RuntimeError):
        cache.build_entry(final, "k2", broken, tmp_path / "lock", "test build")
    assert (final / "a").read_text() == "one" and cache.key_of(final) == "k1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry", "lock"]


def test_an_entry_without_a_key_is_never_taken_as_complete(tmp_path):
    final = tmp_path / "entry"
    final.mkdir()
    (final / "a").write_text("left by someone")
    calls = []
    cache.build_entry(final, "k", lambda d: calls.append((d / "a").write_text("built")), tmp_path / "lock", "t")
    assert calls and (final / "a").read_text() == "built"


def _slow_build(final: str, lock: str, log: str):
    def build(d: Path):
        with open(log, "a") as f:
            f.write(f"start {os.getpid()}\n")
        time.sleep(1.0)
        (d / "x").write_text("done")
        with open(log, "a") as f:
            f.write(f"end {os.getpid()}\n")
    cache.build_entry(Path(final), "same-key", build, Path(lock), "test build")


def test_two_builds_at_once_wait_for_each_other_and_build_once(tmp_path):
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    ps = [ctx.Process(target=_slow_build, args=(str(tmp_path / "e"), str(tmp_path / "lock"), str(log)))
          for _ in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(30)
    assert [p.exitcode for p in ps] == [0, 0]
    lines = log.read_text().split()
    assert lines.count("start") == 1 and lines.count("end") == 1  # the second found the first one's entry
    assert (tmp_path / "e" / "x").read_text() == "done"


def test_the_lock_says_it_waits(tmp_path):
    """A second holder (another process, as a second `sandbox up` is) waits, says so, and gets the lock when the
    first lets go."""
    import sys
    code = ("import sys; from pathlib import Path; from specdeploy.testing import cache\n"
            "with cache.locked(Path(sys.argv[1]), 'sandbox up/down', progress=lambda m: print(m, flush=True)):\n"
            "    print('got it', flush=True)\n")
    with cache.locked(tmp_path / "l", "sandbox up/down"):
        p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "l")], stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        time.sleep(0.5)
        assert p.poll() is None  # still waiting while we hold it
    rest = p.communicate(timeout=10)[0]
    assert "waiting for another sandbox up/down" in first and rest.strip() == "got it"


def test_a_host_another_state_directory_runs_is_refused(state, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "HOSTS_RUN", tmp_path / "run")
    (tmp_path / "run").mkdir()
    h = sandbox.SandboxHost("sdhost1", 1)
    (tmp_path / "run" / "sdhost1.json").write_text(json.dumps({"state": "/elsewhere", "pid": os.getpid()}))
    with pytest.raises(SpecdeployError) as e:
        sandbox._check_owner(h)
    f = e.value.problems[0]
    assert f.subject == "sdhost1" and "/elsewhere" in f.message and "sandbox down" in f.fix
    (tmp_path / "run" / "sdhost1.json").write_text(json.dumps({"state": "/elsewhere", "pid": 2 ** 22 + 7}))
    sandbox._check_owner(h)  # its process is gone: the name is free


def test_the_rootfs_is_keyed_by_its_packages_and_files(monkeypatch):
    k = sandbox.rootfs_key()
    monkeypatch.setattr(sandbox, "PACKAGES", sandbox.PACKAGES + ["vim"])
    assert sandbox.rootfs_key() != k
    monkeypatch.setattr(sandbox, "PACKAGES", sandbox.PACKAGES[:-1])
    monkeypatch.setattr(sandbox, "SSHD_CONFIG", sandbox.SSHD_CONFIG + "X11Forwarding no\n")
    assert sandbox.rootfs_key() != k
    assert sandbox.rootfs_path().name.startswith("rootfs-bookworm-")


def test_a_stale_rootfs_is_replaced_and_pruned(state, monkeypatch):
    """rootfs() with debootstrap played by a function: an old unkeyed rootfs is not reused, the new one is built
    under its key, and the old one is removed once no host uses it."""
    cache_dir = sandbox.CACHE
    old = cache_dir / "rootfs-bookworm"
    (old / "etc").mkdir(parents=True)
    (old / ".specdeploy-rootfs").write_text("old package list layout=2\n")
    runs = []

    def fake_run(cmd, check=True, **kw):
        runs.append(cmd[0])
        if cmd[0] == "debootstrap":
            root = Path(cmd[-2])
            for d in ("etc/ssh/sshd_config.d", "etc/systemd/system", "lib/systemd/system"):
                (root / d).mkdir(parents=True, exist_ok=True)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(sandbox, "_run", fake_run)
    root = sandbox.rootfs()
    assert runs == ["debootstrap"] and root == sandbox.rootfs_path()
    assert cache.key_of(root) == sandbox.rootfs_key()
    assert (root / "etc/systemd/system/specdeploy-sandbox-cgroups.service").is_file()
    assert not old.exists()
    sandbox.rootfs()
    assert runs == ["debootstrap"]  # now cached


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
def test_a_failed_build_unmounts_what_it_mounted(tmp_path):
    def build(d: Path):
        (d / "proc").mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(d / "proc")], check=True)
        raise RuntimeError("debootstrap failed")

    with pytest.raises(RuntimeError):
        cache.build_entry(tmp_path / "rootfs", "k", build, tmp_path / "lock", "test build")
    assert not cache.mounts_under(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
def test_remove_tree_never_walks_into_a_mount(tmp_path):
    d = tmp_path / "cache" / "x"
    (d / "proc").mkdir(parents=True)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("user data")
    subprocess.run(["mount", "--bind", str(keep), str(d / "proc")], check=True)
    try:
        cache.remove_tree(tmp_path / "cache")  # unmounts first, then removes
    finally:
        subprocess.run(["umount", "-l", str(d / "proc")], capture_output=True)
    assert (keep / "precious").read_text() == "user data" and not (tmp_path / "cache").exists()
    shutil.rmtree(keep)


def test_remove_tree_removes_a_link_and_never_what_it_points_to(tmp_path):
    target = tmp_path / "user-data"
    target.mkdir()
    (target / "keep").write_text("theirs")
    link = tmp_path / "entry"
    link.symlink_to(target)
    cache.remove_tree(link)
    assert not link.exists() and not link.is_symlink() and (target / "keep").read_text() == "theirs"


def test_down_leaves_what_it_did_not_make_and_hosts_another_state_runs(state, tmp_path, monkeypatch):
    """down in a state directory: a host another state runs keeps its network, an artifacts directory without
    the sandbox's key and a key pair it did not generate stay; its own host directory and artifacts go."""
    calls = []
    monkeypatch.setattr(sandbox, "_require_root", lambda: None)
    monkeypatch.setattr(sandbox, "_run", lambda cmd, check=True, **kw: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 1, "", ""))
    monkeypatch.setattr(sandbox, "SANDBOX_LOCK", tmp_path / "lock")
    monkeypatch.setattr(sandbox, "HOSTS_RUN", tmp_path / "run")
    (tmp_path / "run").mkdir()
    state.mkdir()
    (state / "hosts.json").write_text(json.dumps([{"name": "sdhost1", "index": 1}, {"name": "sdhost2", "index": 2}]))
    for n in ("sdhost1", "sdhost2"):
        (state / "hosts" / n).mkdir(parents=True)
    (tmp_path / "run" / "sdhost2.json").write_text(json.dumps({"state": "/elsewhere", "pid": os.getpid()}))
    (state / "artifacts").mkdir()
    (state / "artifacts" / "mine").write_text("a user's file")
    (state / "id_ed25519.pub").write_text("ssh-ed25519 AAAA someone@laptop\n")
    sandbox.down()
    assert not (state / "hosts" / "sdhost1").exists() and (state / "hosts" / "sdhost2").is_dir()
    assert not any("sdh2" in c or "sd-sdhost2" in c for c in calls)  # the other state's network is untouched
    assert (state / "artifacts" / "mine").read_text() == "a user's file"
    assert (state / "id_ed25519.pub").is_file()
    sandbox.artifacts()
    sandbox.down()
    assert not (state / "artifacts").exists()  # what artifacts() wrote carries its key, and goes


def test_an_entry_is_readable_by_others(tmp_path):
    """mkdtemp makes 0700 directories; a cache entry is read by other users too (a sandbox host's service user runs
    the cached real-engine venv), so it is 0755, and an older 0700 entry is opened when it is reused."""
    import os

    from specdeploy.testing import cache
    final = tmp_path / "entry"
    cache.build_entry(final, "k1", lambda d: (d / "f").write_text("x"), tmp_path / "lock", "test build")
    assert final.stat().st_mode & 0o777 == 0o755
    os.chmod(final, 0o700)
    built = []
    cache.build_entry(final, "k1", lambda d: built.append(d), tmp_path / "lock", "test build")
    assert not built and final.stat().st_mode & 0o777 == 0o755 and (final / "f").read_text() == "x"
