"""Vaulted inventories read as ansible-playbook reads them: an inline ``!vault`` value and a vault-encrypted vars
file give the same plan, preflight and engine command as the plain inventory, and Ansible itself
(``ansible-inventory``) agrees; the secrets come from --vault-password-file, --vault-id, ANSIBLE_VAULT_PASSWORD_FILE,
ANSIBLE_VAULT_IDENTITY_LIST or ansible.cfg; a missing or wrong secret is a finding naming the file, not a
traceback. ``deploy`` passes the secrets on to ansible-playbook."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, free_port

PASSWORD = "correct horse battery staple"
MODEL_LINE = "specdeploy_served_model_name: moonshotai/Kimi-K2.5\n"
DRAFTER_LINE = "specdeploy_drafter_path: /models/kimi-k2.5-eagle3\n"


def cli(*args, cwd=REPO, env=None) -> subprocess.CompletedProcess:
    import specdeploy
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
    # the tree under test, also from another working directory
    full["PYTHONPATH"] = os.pathsep.join([str(Path(specdeploy.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=full, timeout=180)


def copy_example(root: Path) -> Path:
    """inventory/example under root (its hosts on loopback, so status reaches nothing else)."""
    inv = root / "inventory" / "example"
    shutil.copytree(REPO / "inventory/example", inv)
    (root / "examples").symlink_to(REPO / "examples")
    (root / "secrets").symlink_to(REPO / "secrets")
    hosts = inv / "hosts.yml"
    text = hosts.read_text()
    for addr in ("10.1.230.174", "10.1.230.175", "10.1.230.10"):
        text = text.replace(addr, "127.0.0.1")
    hosts.write_text(text)
    return inv


def vault_cli(*args: str) -> str:
    r = subprocess.run(["ansible-vault", *args], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """{plain, inline, file}: copies of inventory/example; inline vaults the served model name and the drafter path
    in group_vars with encrypt_string, file encrypts host_vars/gpu-b/specdeploy_nccl.yml whole."""
    base = tmp_path_factory.mktemp("vault")
    pw = base / "pw"
    pw.write_text(PASSWORD + "\n")
    out = {"pw": pw, "plain": copy_example(base / "plain")}
    inv = out["inline"] = copy_example(base / "inline")
    gv = inv / "group_vars/specdeploy_engines.yml"
    text = gv.read_text()
    assert MODEL_LINE in text and DRAFTER_LINE in text
    for line, name in ((MODEL_LINE, "specdeploy_served_model_name"), (DRAFTER_LINE, "specdeploy_drafter_path")):
        value = line.split(": ", 1)[1].strip()
        text = text.replace(line, vault_cli("encrypt_string", "--vault-password-file", str(pw), value, "--name",
                                            name))
    gv.write_text(text)
    inv = out["file"] = copy_example(base / "file")
    vault_cli("encrypt", "--vault-password-file", str(pw), str(inv / "host_vars/gpu-b/specdeploy_nccl.yml"))
    assert (inv / "host_vars/gpu-b/specdeploy_nccl.yml").read_text().startswith("$ANSIBLE_VAULT")
    return out


def same(vaulted: Path, plain: Path, text: str) -> str:
    """Output of the vaulted tree with its paths written as the plain tree's."""
    return text.replace(str(vaulted.parents[1]), str(plain.parents[1]))


@pytest.mark.parametrize("kind", ["inline", "file"])
def test_plan_and_preflight_of_a_vaulted_inventory_are_the_plain_ones(trees, kind):
    inv, plain, pw = trees[kind], trees["plain"], trees["pw"]
    want = cli("plan", "--json", "-i", plain)
    got = cli("plan", "--json", "-i", inv, "--vault-password-file", pw)
    assert want.returncode == 0 and got.returncode == 0, got.stderr
    assert same(inv, plain, got.stdout) == want.stdout
    assert "--served-model-name moonshotai/Kimi-K2.5" in got.stdout
    from specdeploy.hostvars.inventory import load
    from specdeploy.hostvars.inventory_ansible import Vault
    hosts = {h.name: h.vars for h in load(inv, vault=Vault.of(password_files=[str(pw)])).engine_hosts}
    assert hosts["gpu-a"]["specdeploy_drafter_path"] == "/models/kimi-k2.5-eagle3"
    assert hosts["gpu-b"]["specdeploy_nccl_env"] == {"NCCL_P2P_LEVEL": "SYS"}
    want = cli("preflight", "--json", "-i", plain)
    got = cli("preflight", "--json", "-i", inv, "--vault-password-file", pw)
    assert got.returncode == want.returncode and "Traceback" not in got.stderr, got.stderr
    assert json.loads(same(inv, plain, got.stdout)) == json.loads(want.stdout)


@pytest.mark.parametrize("kind", ["inline", "file"])
def test_ansible_inventory_reads_the_vaulted_copy_as_the_plain_one(trees, kind):
    from ansible.parsing.vault import VaultLib, VaultSecret
    lib = VaultLib([("default", VaultSecret(PASSWORD.encode()))])

    def listing(inv: Path, *extra) -> dict:
        r = subprocess.run(["ansible-inventory", "-i", str(inv), "--list", *map(str, extra)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr

        def opened(d):  # ansible-inventory prints an inline vaulted value as its ciphertext
            return lib.decrypt(d["__ansible_vault"]).decode() if set(d) == {"__ansible_vault"} else d
        return json.loads(same(inv, trees["plain"], r.stdout), object_hook=opened)
    got = listing(trees[kind], "--vault-password-file", trees["pw"])
    assert got == listing(trees["plain"])
    hv = got["_meta"]["hostvars"]
    assert hv["gpu-b"]["specdeploy_served_model_name"] == "moonshotai/Kimi-K2.5"
    assert hv["gpu-b"]["specdeploy_nccl_env"] == {"NCCL_P2P_LEVEL": "SYS"}


def test_engine_argv_and_status_read_a_vaulted_inventory(trees):
    inv, pw = trees["inline"], trees["pw"]
    r = cli("engine", "argv", "-i", inv, "--host", "gpu-a", "--json", "--vault-id", f"prod@{pw}")
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)["argv"]
    assert argv[argv.index("--served-model-name") + 1] == "moonshotai/Kimi-K2.5"
    port = free_port()  # nothing listens: status reports the hosts unreachable, cleanly
    r = cli("status", "-i", inv, "--json", "--vault-password-file", pw, "--prometheus", f"http://127.0.0.1:{port}",
            "--timeout", "0.5")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "vault" not in r.stderr.lower(), r.stderr
    rows = json.loads(r.stdout)["hosts"]
    assert [row["host"] for row in rows] == ["gpu-a", "gpu-b"] and not any(row["reachable"] for row in rows)
    r = cli("status", "-i", inv, "--json", "--prometheus", f"http://127.0.0.1:{port}", "--timeout", "0.5")
    assert r.returncode == 2 and "cannot be decrypted" in r.stderr and "Traceback" not in r.stderr


def test_secrets_from_the_environment_and_ansible_cfg(trees, tmp_path):
    inv, plain, pw = trees["inline"], trees["plain"], trees["pw"]
    want = cli("plan", "--json", "-i", plain).stdout
    for env in ({"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)}, {"ANSIBLE_VAULT_IDENTITY_LIST": f"prod@{pw}"}):
        r = cli("plan", "--json", "-i", inv, env=env)
        assert r.returncode == 0 and same(inv, plain, r.stdout) == want, (env, r.stderr)
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\nvault_password_file = {pw}\n")
    r = cli("plan", "--json", "-i", inv, cwd=tmp_path)
    assert r.returncode == 0 and same(inv, plain, r.stdout) == want, r.stderr


@pytest.mark.parametrize("kind,where", [("inline", "group_vars/specdeploy_engines.yml:"),
                                        ("file", "host_vars/gpu-b/specdeploy_nccl.yml")])
def test_a_missing_or_wrong_vault_secret_is_a_finding(trees, tmp_path, kind, where):
    inv = trees[kind]
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    for cmd in (["plan", "--json"], ["preflight"], ["engine", "argv", "--host", "gpu-b"]):
        for extra, why in (([], "no vault secret was given"),
                           (["--vault-password-file", wrong], "none of the vault secrets given decrypts it")):
            r = cli(*cmd, "-i", inv, *extra)
            out = r.stdout + r.stderr  # preflight reports a host's inventory errors in its report (exit 1)
            assert r.returncode in ((1, 2) if cmd == ["preflight"] else (2,)), (cmd, extra, out)
            assert "Traceback" not in out and "VaultSecretsContext" not in out
            assert f"{inv}/{where}" in out and why in out and "--vault-password-file" in out
    r = cli("plan", "-i", inv, "--vault-password-file", tmp_path / "nope")
    assert r.returncode == 2 and f"{tmp_path / 'nope'} was not found" in r.stderr and "Traceback" not in r.stderr


def test_a_vaulted_extra_vars_file_is_read_and_redacted(trees, tmp_path):
    from specdeploy.ops.runner import redact
    from specdeploy.hostvars.inventory import parse_extra_vars
    from specdeploy.hostvars.inventory_ansible import Vault
    pw = trees["pw"]
    f = tmp_path / "secret.yml"
    f.write_text("specdeploy_port: 8123\n" + vault_cli("encrypt_string", "--vault-password-file", str(pw),
                                                       "s3cr3t-value", "--name", "specdeploy_engine_env_secret"))
    vaulted: set[str] = set()
    extra = parse_extra_vars([f"@{f}"], Vault.of(password_files=[str(pw)]), vaulted)
    assert extra == {"specdeploy_port": 8123, "specdeploy_engine_env_secret": "s3cr3t-value"}
    assert vaulted == {"specdeploy_engine_env_secret"}
    shown, hidden = redact(extra, vaulted)
    assert shown == {"specdeploy_port": 8123, "specdeploy_engine_env_secret": "<redacted>"}
    assert hidden == {"s3cr3t-value"}
    whole = tmp_path / "whole.yml"
    whole.write_text("specdeploy_port: 8124\n")
    vault_cli("encrypt", "--vault-password-file", str(pw), str(whole))
    vaulted = set()
    assert parse_extra_vars([f"@{whole}"], Vault.of(password_files=[str(pw)]), vaulted) == {"specdeploy_port": 8124}
    assert vaulted == {"specdeploy_port"}
    r = cli("plan", "--json", "-i", trees["plain"], "-e", f"@{whole}")
    assert r.returncode == 2 and str(whole) in r.stderr and "no vault secret was given" in r.stderr
