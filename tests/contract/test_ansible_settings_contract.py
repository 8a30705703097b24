"""The native inventory reader trusts an Ansible setting only as the installed ansible-core defines it: the committed
table (hostvars/ansible_settings.json) is what its own files give today, and every setting of the release is
classified, so an upgrade that adds or renames one fails here until the table is regenerated and read."""
import json

from specdeploy.hostvars import ansible_settings as A


def test_the_committed_table_is_the_installed_releases_and_classifies_every_setting():
    committed = json.loads(A.TABLE.read_text())
    t = A.installed()
    assert committed == t, "run python -m specdeploy.hostvars.ansible_settings and review the new settings"
    assert A.VARIABLE_SETTINGS <= set(t["settings"]), A.VARIABLE_SETTINGS - set(t["settings"])
    assert not set(t["harmless_env"]) & set(t["variable_env"])
    # the reader's known hazards are classified as such, from the release's own definitions
    for name in ("ANSIBLE_HASH_BEHAVIOUR", "ANSIBLE_PRECEDENCE", "ANSIBLE_VARS_ENABLED", "ANSIBLE_INVENTORY_ENABLED",
                 "ANSIBLE_YAML_FILENAME_EXT", "ANSIBLE_VARS_PLUGIN_STAGE", "ANSIBLE_JINJA2_NATIVE"):
        assert name in t["variable_env"], name
    for name in ("ANSIBLE_SSH_ARGS", "ANSIBLE_PIPELINING", "ANSIBLE_FORKS", "ANSIBLE_CONNECTION_PLUGINS"):
        assert name in t["harmless_env"], name
