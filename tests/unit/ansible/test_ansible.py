"""Every playbook passes --syntax-check and the roles pass ansible-lint at the production profile."""
import re
import shutil
import subprocess

import pytest

from helpers import REPO

PLAYBOOKS = sorted(p.name for p in (REPO / "ansible").glob("*.yml"))


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_syntax_check(playbook):
    r = subprocess.run(["ansible-playbook", "-i", "inventory/example", "--syntax-check", f"ansible/{playbook}"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_required_playbook_exists():
    assert {"site.yml", "provision.yml", "build.yml", "deploy.yml", "rollback.yml", "verify.yml"} <= set(PLAYBOOKS)


def test_ansible_lint_production_profile(tmp_path):
    """Run on a copy of the Ansible tree: ansible-lint keeps its cache in the project directory (.ansible/), and
    the suite writes nothing into the repository."""
    for name in ("ansible", "templates"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("ansible.cfg", ".ansible-lint"):
        shutil.copy2(REPO / name, tmp_path / name)
    r = subprocess.run(["ansible-lint", "--profile", "production", "ansible/"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


def test_every_role_has_argument_specs_defaults_and_tasks():
    for role in (REPO / "ansible/roles").iterdir():
        for part in ("meta/argument_specs.yml", "tasks/main.yml"):
            assert (role / part).is_file(), f"{role.name} lacks {part}"
        assert any((role / "defaults").rglob("*.yml")), f"{role.name} lacks defaults"


def test_handlers_do_something_and_one_reloads_systemd():
    """No handler that is only a message; one systemd reload, which every role notifies by its listen topic."""
    import yaml
    reloads = []
    for f in sorted((REPO / "ansible/roles").glob("*/handlers/main.yml")):
        for h in yaml.safe_load(f.read_text()) or []:
            assert "ansible.builtin.debug" not in h, f"{f}: handler {h['name']!r} only prints a message"
            svc = h.get("ansible.builtin.systemd_service") or {}
            if svc == {"daemon_reload": True}:
                reloads.append((f.parent.parent.name, h.get("listen")))
    assert reloads == [("common", "specdeploy systemd reload")], reloads
    notified = set()
    for f in (REPO / "ansible").rglob("*.yml"):
        notified |= set(re.findall(r"notify: (.+)", f.read_text()))
    assert "Reload systemd" not in notified and "specdeploy systemd reload" in notified
