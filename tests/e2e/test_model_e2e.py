"""Weights on real sandbox hosts: nothing specdeploy runs may lose or alter a model.

One fleet of two hosts. gpu-a holds its model and drafter (`host` source, the README's "Deploying to real hosts"
path on a copy of inventory/example); gpu-b gets the model from the controller (`controller` source) and the
drafter from a directory standing for shared storage (`shared` source). Bad input stops
before any host change; the README path, a no-change redeploy, an engine switch and a rollback leave every shard
byte-identical; a controller copy killed mid-transfer resumes while the previous copy keeps serving."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import FLEETS, REPO, sandbox_fleet

pytestmark = [pytest.mark.sandbox(fleet="b"), pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
    reason="needs root and systemd-nspawn (CI runs as root; scripts/setup.sh installs systemd-container)")]

A, B = (f"10.231.{FLEETS['b'] + i}.2" for i in range(2))  # this module runs on fleet b
MODEL, DRAFTER = "/models/kimi-k2.5-int4", "/models/kimi-k2.5-eagle3"
B_MODEL, B_DRAFTER = "/srv/models/kimi-k2.5-int4", "/srv/models/kimi-k2.5-eagle3"
SHARED = "/mnt/nfs/kimi-k2.5-eagle3"
CONFIG = json.loads((REPO / "examples/models/kimi-k2.5-int4/config.json").read_text())
KEY = "sk-sandbox-model-e2e"
FAST = ["speculation_gate_concurrency=1,4", "speculation_gate_max_tokens=32"]


def ssh(host: str, cmd: str, check: bool = True) -> str:
    from specdeploy.testing.sandbox import STATE
    r = subprocess.run(["ssh", "-i", str(STATE / "id_ed25519"), "-o", "StrictHostKeyChecking=no", "-o",
                        "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", f"root@{host}", cmd],
                       capture_output=True, text=True, timeout=120, check=False)
    if check and r.returncode:
        raise AssertionError(f"{host}: {cmd}: {r.stderr}")
    return r.stdout


def push(src: Path, host: str, dest: str):
    from specdeploy.testing.sandbox import STATE
    ssh(host, f"mkdir -p {dest}")
    rsh = (f"ssh -i {STATE / 'id_ed25519'} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
           "-o LogLevel=ERROR")
    subprocess.run(["rsync", "-a", "--sparse", "-e", rsh, f"{src}/", f"root@{host}:{dest}/"], check=True,
                   capture_output=True)


def fingerprint(host: str, path: str) -> str:
    """sha256, size, inode and mtime of every file below path (following the path itself if it is a link)."""
    return ssh(host, f"cd {path}/ && find . -type f ! -name '.specdeploy-*' -printf '%p %s %i %T@\\n' | sort && "
                     "find . -type f ! -name '.specdeploy-*' -print0 | sort -z | xargs -0 sha256sum")


def sums(host: str, path: str) -> str:
    return ssh(host, f"cd {path}/ && find . -type f ! -name '.specdeploy-*' -print0 | sort -z | xargs -0 sha256sum")


def local_sums(path: Path) -> str:
    return subprocess.run(f"cd {path}/ && find . -type f ! -name '.specdeploy-*' -print0 | sort -z | xargs -0 "
                          "sha256sum", shell=True, capture_output=True, text=True, check=True).stdout


def play(inv: Path, playbook: str, *extra: str, limit: str | None = None, timeout=1500) -> tuple[int, str]:
    cmd = ["ansible-playbook", "-i", str(inv), str(REPO / "ansible" / playbook)]
    for e in extra:
        cmd += ["-e", e]
    if limit:
        cmd += ["--limit", limit]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout, check=False)
    out = r.stdout + r.stderr
    if r.returncode:  # the failing tasks first: the tail of a long run rarely shows them
        fatal = [b for b in re.split(r"\n(?=TASK \[)", out) if re.search(r"^(fatal|failed):", b, re.MULTILINE)]
        out = "\n".join(b[-1500:] for b in fatal) + "\n...\n" + out
    return r.returncode, out


def ran(out: str, task: str) -> bool:
    """Did any host run (not skip) the task whose name starts with ``task``?"""
    for section in re.split(r"^TASK \[", out, flags=re.MULTILINE)[1:]:
        head, _, body = section.partition("\n")
        if task in head and re.search(r"^(ok|changed): ", body, re.MULTILINE):
            return True
    return False


def chat(host: str, timeout=30) -> str:
    req = urllib.request.Request(f"http://{host}:8000/v1/chat/completions", data=json.dumps({
        "model": "moonshotai/Kimi-K2.5", "max_tokens": 8,
        "messages": [{"role": "user", "content": "One line on speculative decoding."}]}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"})
    return json.load(urllib.request.urlopen(req, timeout=timeout))["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two bare hosts (fleet b), gpu-a seeded with a model and a drafter, and the README's inventory copied and
    edited."""
    with sandbox_fleet("b") as first:
        yield from _seeded(first, tmp_path_factory)


def _seeded(first: int, tmp_path_factory):
    from specdeploy.testing import sandbox
    from specdeploy.testing.fixtures import drafter_config, write_drafter, write_model
    sandbox.down()
    sandbox.up(2, first=first)
    key, _ = sandbox.keypair()
    root = tmp_path_factory.mktemp("readme")
    src = root / "controller"
    write_model(src / "kimi-k2.5-int4", CONFIG, shards=3, random_bytes=4 << 20, hole_bytes=32 << 20, seed=1)
    # as published: generation_config.json names the end-of-turn token the drafter doctor looks for in d2t
    shutil.copy(REPO / "examples/models/kimi-k2.5-int4/generation_config.json", src / "kimi-k2.5-int4")
    write_drafter(src / "kimi-k2.5-eagle3", drafter_config(eagle_config=None))
    push(src / "kimi-k2.5-int4", A, MODEL)
    push(src / "kimi-k2.5-eagle3", A, DRAFTER)
    # README: cp -r inventory/example inventory/prod && $EDITOR inventory/prod/hosts.yml inventory/prod/group_vars/*.yml
    inv = root / "inventory" / "prod"
    shutil.copytree(REPO / "inventory" / "example", inv)
    shutil.copytree(REPO / "examples", root / "examples")  # the config copies, at the path the example names
    (root / "secrets").mkdir()
    (root / "secrets" / "example-api-key").write_text(KEY + "\n")
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
        "specdeploy_engines": {"hosts": {"gpu-a": {"ansible_host": A}, "gpu-b": {"ansible_host": B}}},
        "specdeploy_monitoring": {"hosts": {"mon-1": {"ansible_host": A}}}}}}))
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({  # mon-1 too: a sandbox host reaches no mirror
        "specdeploy_sandbox": True, "ansible_user": "root", "ansible_ssh_private_key_file": str(key),
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"}))
    gv = inv / "group_vars" / "specdeploy_engines.yml"
    gv.write_text(yaml.safe_dump({**yaml.safe_load(gv.read_text()),  # sandbox hosts: no GPUs, the simulator serves
        "specdeploy_sandbox": True, "specdeploy_runtime": "venv", "specdeploy_ready_timeout_s": 120,
        "specdeploy_engine_env": {"SPECDEPLOY_SIM_LOAD_SECONDS": "2", "SPECDEPLOY_SIM_STEP_MS": "5"}}))
    nccl_vars = inv / "host_vars" / "gpu-b" / "specdeploy_nccl.yml"
    nccl_vars.write_text(nccl_vars.read_text() + yaml.safe_dump({
        "specdeploy_model_source": "controller", "specdeploy_model_path": B_MODEL,
        "specdeploy_model_controller_path": str(src / "kimi-k2.5-int4"), "specdeploy_drafter_path": B_DRAFTER,
        "specdeploy_drafter_source": "shared", "specdeploy_drafter_shared_path": SHARED}))
    push(src / "kimi-k2.5-eagle3", B, SHARED)  # stands for an NFS/Lustre mount on gpu-b
    yield {"inv": inv, "src": src, "root": root, "a_model": fingerprint(A, MODEL), "a_drafter": fingerprint(A, DRAFTER)}
    sandbox.down()


def weights_untouched(fleet):
    assert fingerprint(A, MODEL) == fleet["a_model"]
    assert fingerprint(A, DRAFTER) == fleet["a_drafter"]


def test_bad_input_stops_before_any_host_change(fleet, tmp_path):
    """A source lacking a shard, a shard of the wrong size, a truncated shard, a missing index: each stops the deploy
    with the variable and the fix, and neither host gets anything."""
    src = fleet["src"]
    bad = tmp_path / "bad"
    for case in ("missing", "truncated", "noindex", "longer"):
        shutil.copytree(src / "kimi-k2.5-int4", bad / case)
    (bad / "missing" / "model-00002-of-00003.safetensors").unlink()
    os.truncate(bad / "truncated" / "model-00003-of-00003.safetensors", 5 << 20)
    (bad / "noindex" / "model.safetensors.index.json").unlink()
    with open(bad / "longer" / "model-00001-of-00003.safetensors", "ab") as fh:
        fh.write(b"\0" * 512)
    # host source on gpu-a: damaged copies at other paths on the host
    for case in ("missing", "truncated"):
        push(bad / case, A, f"/models/bad-{case}")
    before = {c: fingerprint(A, f"/models/bad-{c}") for c in ("missing", "truncated")}
    for case, words in (("missing", "1 of 3 shards"), ("truncated", "is truncated")):
        rc, out = play(fleet["inv"], "deploy.yml", f"specdeploy_model_path=/models/bad-{case}", limit="gpu-a")
        assert rc != 0 and words in out and "specdeploy_model_path" in out and "Fix:" in out, out[:4000]
        assert fingerprint(A, f"/models/bad-{case}") == before[case]
    # controller source on gpu-b: caught by preflight on the controller
    for case, words in (("noindex", "model.safetensors.index.json: missing"), ("longer", "longer than its header")):
        rc, out = play(fleet["inv"], "deploy.yml", f"specdeploy_model_controller_path={bad / case}", limit="gpu-b")
        assert rc != 0 and words in out and "specdeploy_model_controller_path" in out, out[:4000]
    for h in (A, B):
        assert ssh(h, "ls -d /var/lib/specdeploy /opt/specdeploy /srv/models 2>/dev/null; true").strip() == ""
    weights_untouched(fleet)


def test_readme_path_deploys_without_touching_the_weights(fleet):
    inv = fleet["inv"]
    r = subprocess.run(["specdeploy", "preflight", "-i", str(inv)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "specdeploy_model_controller_path: complete: 3 weight files" in r.stdout
    rc, out = play(inv, "site.yml", *FAST)
    assert rc == 0, out[:6000]
    assert chat(A) and chat(B)
    weights_untouched(fleet)
    # gpu-b: a link into the store beside the target, byte-identical to the controller's copy
    target = ssh(B, f"readlink {B_MODEL}").strip()
    assert re.fullmatch(r"/srv/models/\.kimi-k2\.5-int4\.specdeploy/[0-9a-f]{16}", target), target
    assert sums(B, B_MODEL) == local_sums(fleet["src"] / "kimi-k2.5-int4")
    assert sums(B, B_DRAFTER) == local_sums(fleet["src"] / "kimi-k2.5-eagle3")
    assert ssh(B, f"readlink {B_DRAFTER}").startswith("/srv/models/.kimi-k2.5-eagle3.specdeploy/")
    assert sums(B, SHARED) == local_sums(fleet["src"] / "kimi-k2.5-eagle3")
    # the gate ran (baseline, then speculation): its baseline is never the release rollback goes back to
    base = ssh(A, "cat /var/lib/specdeploy/gate-baseline").strip()
    assert base and ssh(A, "cat /var/lib/specdeploy/previous 2>/dev/null; true").strip() != base


def test_no_change_redeploy_reads_no_weights(fleet):
    t0 = time.monotonic()
    rc, out = play(fleet["inv"], "deploy.yml", *FAST)
    took = time.monotonic() - t0
    assert rc == 0, out[:6000]
    recap = dict(re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", out, re.MULTILINE))
    assert recap == {"gpu-a": "0", "gpu-b": "0", "mon-1": "0"}, out[:4000]
    # the links already point at these content ids: no copy, no verification pass, no hashing
    assert not ran(out, "Rsync into the staging directory") and not ran(out, "Verify on the host, mark complete")
    weights_untouched(fleet)
    print(f"\nno-change redeploy of 2 hosts: {took:.1f} s")


def test_engine_switch_and_rollback_keep_the_weights(fleet):
    inv = fleet["inv"]
    drafter_vllm = ssh(A, "readlink /var/lib/specdeploy/drafter/vllm").strip()
    serving = ssh(A, "cat /var/lib/specdeploy/current").strip()
    rc, out = play(inv, "deploy.yml", "specdeploy_engine=sglang", "specdeploy_engine_version=0.5.23",
                   "specdeploy_spec_gate=false")
    assert rc == 0, out[:6000]
    assert ssh(A, "systemctl is-active specdeploy-sglang").strip() == "active" and chat(A)
    # previous is the release that served before, never the gate's no-drafter baseline
    assert ssh(A, "cat /var/lib/specdeploy/previous").strip() == serving
    assert serving != ssh(A, "cat /var/lib/specdeploy/gate-baseline").strip()
    weights_untouched(fleet)
    rc, out = play(inv, "rollback.yml")
    assert rc == 0, out[:6000]
    assert ssh(A, "cat /var/lib/specdeploy/current").strip() == serving
    for h in (A, B):
        assert ssh(h, "systemctl is-active specdeploy-vllm").strip() == "active" and chat(h)
    assert ssh(A, "readlink /var/lib/specdeploy/drafter/vllm").strip() == drafter_vllm
    weights_untouched(fleet)
    assert sums(B, B_MODEL) == local_sums(fleet["src"] / "kimi-k2.5-int4")


def test_controller_copy_killed_mid_transfer_resumes_while_the_old_copy_serves(fleet):
    from specdeploy.testing.fixtures import write_model
    inv, src = fleet["inv"], fleet["src"] / "kimi-k2.5-int4"
    old = ssh(B, f"readlink {B_MODEL}").strip()
    write_model(src, CONFIG, shards=3, random_bytes=24 << 20, hole_bytes=4 << 20, seed=2)  # new weights
    # 2 MB/s: the 84 MB copy takes about 40 s, so a poll every half second (however slow ssh is on a loaded
    # machine) sees the partial copy pass 16 MB long before it ends.
    cmd = ["ansible-playbook", "-i", str(inv), str(REPO / "ansible" / "deploy.yml"), "--limit", "gpu-b",
           "-e", '{"model_store_rsync_args": ["--bwlimit=2m"]}']
    log = fleet["root"] / "killed-deploy.log"
    with log.open("w") as f:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 900
    partial = "/srv/models/.kimi-k2.5-int4.specdeploy/*.partial"
    while True:
        got = ssh(B, f"du -sb --apparent-size {partial} 2>/dev/null | cut -f1; true").split()
        if got and int(got[0]) > (16 << 20):
            break
        if p.poll() is not None or time.time() > deadline:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"the copy never passed 16 MB (deploy rc {p.wait()}); its output ends:\n"
                        + log.read_text()[-6000:])
        time.sleep(0.5)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(1)
    assert ssh(B, f"readlink {B_MODEL}").strip() == old and chat(B)  # the previous copy keeps serving
    assert ssh(B, f"ls -d {partial}").strip()
    rc, out = play(inv, "deploy.yml", limit="gpu-b")
    assert rc == 0, out[:6000]
    new = ssh(B, f"readlink {B_MODEL}").strip()
    assert new != old and sums(B, B_MODEL) == local_sums(src)
    left = subprocess.run(["pgrep", "-af", "rsync .*kimi-k2.5-int4.specdeploy/"], capture_output=True, text=True)
    assert not left.stdout, f"a copy is still running on the controller: {left.stdout}"
    sent = int(re.search(r"Literal data: ([\d,]+)", out).group(1).replace(",", ""))
    assert sent < 3 * (28 << 20) - (16 << 20), f"the resumed copy sent {sent} bytes again"
    assert sums(B, old).count(".safetensors\n") == 3  # the previous copy is kept
    assert chat(B)
