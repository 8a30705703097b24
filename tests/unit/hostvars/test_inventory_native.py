"""The native inventory reader gives what Ansible gives (InventoryManager + VariableManager + Templar, run here
side by side): every variable of every host, group membership and order, --limit selections; and where it does not
reproduce Ansible exactly, it steps aside and the Ansible path answers."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from specdeploy.hostvars import inventory_native
from specdeploy.testing import sandbox
from specdeploy.values.errors import SpecdeployError
from specdeploy.hostvars.inventory import ansible_host_variables, host_variables
from specdeploy.hostvars.inventory_native import Unsupported

# magic variables Ansible adds that specdeploy never reads (the reader would need Ansible to know them)
ANSIBLE_ONLY = {"ansible_config_file", "ansible_facts", "ansible_playbook_python", "ansible_version"}
GROUPS = ["all", "specdeploy_engines", "specdeploy_monitoring", "specdeploy_routers", "ungrouped"]


def names(hosts) -> list[str]:
    return [h.name for h in hosts]


def assert_same(path: Path, extra: dict | None = None, limits=(), groups=()) -> dict:
    ninv, nvars = inventory_native.read(path, dict(extra or {}))
    ainv, avars = ansible_host_variables(path, dict(extra or {}))
    assert list(nvars) == list(avars)
    for host, want in avars.items():
        assert not isinstance(want, SpecdeployError), want.problems
        want = {k: v for k, v in want.items() if k not in ANSIBLE_ONLY}
        assert nvars[host] == want, host
    for g in [*GROUPS, *groups]:
        assert names(ninv.get_hosts(g)) == names(ainv.get_hosts(g)), g
    for lim in limits:
        assert set(names(ninv.get_hosts(lim))) == set(names(ainv.get_hosts(lim))), lim
    return nvars


def write(root: Path, files: dict[str, object]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
    return root


def test_example_inventories_read_the_same(repo, example_inv):
    v = assert_same(repo / "inventory/example", limits=[
        "gpu-a", "specdeploy_engines", "gpu-a,mon-1", "GPU-A", "gpu-a,,mon-1", "specdeploy_engines:!gpu-b",
        "all,!gpu-a", "gpu-a :mon-1", "!gpu-a,&specdeploy_engines", "gpu-a:gpu-b:!gpu-b", "ungrouped"])
    assert v["gpu-a"]["specdeploy_api_key_file"] == f"{repo}/inventory/example/../../secrets/example-api-key"
    assert v["gpu-b"]["specdeploy_nccl_env"] == {"NCCL_P2P_LEVEL": "SYS"}
    assert_same(repo / "inventory/b200")
    assert_same(example_inv)  # the conftest copy, examples/ through a symlink
    assert_same(repo / "inventory/example", extra={"specdeploy_tensor_parallel_size": 4,
                                                  "specdeploy_nccl_env": {"NCCL_DEBUG": "INFO"}})


def test_sandbox_inventory_reads_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "keypair", lambda: (tmp_path / "id_ed25519", "ssh-ed25519 AAAA test"))
    monkeypatch.setattr(sandbox, "base_image_tag", lambda _: "specdeploy-sandbox-base:test", raising=False)
    hosts = [sandbox.SandboxHost("sd-a", 1), sandbox.SandboxHost("sd-b", 2)]
    for engine, runtime in [("vllm", "docker"), ("sglang", "venv")]:
        inv = sandbox.write_inventory(hosts, tmp_path / f"{engine}-{runtime}", engine, runtime)
        v = assert_same(inv, limits=["sd-a", "sd-b"])
        assert v["sd-a"]["ansible_user"] == "root" and v["sd-b"]["ansible_host"] == hosts[1].address


def test_readme_inventory_of_the_model_e2e_reads_the_same(repo, tmp_path):
    # cp -r inventory/example inventory/prod; group_vars/all.yml for every host; host_vars appended
    import shutil
    inv = tmp_path / "inventory" / "prod"
    shutil.copytree(repo / "inventory/example", inv)
    (tmp_path / "examples").symlink_to(repo / "examples")
    write(inv, {"hosts.yml": {"all": {"children": {
        "specdeploy_engines": {"hosts": {"gpu-a": {"ansible_host": "10.231.1.2"},
                                         "gpu-b": {"ansible_host": "10.231.2.2"}}},
        "specdeploy_monitoring": {"hosts": {"mon-1": {"ansible_host": "10.231.1.2"}}}}}},
        "group_vars/all.yml": {"specdeploy_sandbox": True, "ansible_user": "root",
                               "ansible_python_interpreter": "/usr/bin/python3"}})
    gv = inv / "group_vars/specdeploy_engines.yml"
    gv.write_text(yaml.safe_dump({**yaml.safe_load(gv.read_text()), "specdeploy_runtime": "venv",
                                  "specdeploy_engine_env": {"A": "2"}}))
    hv = inv / "host_vars/gpu-b/specdeploy_nccl.yml"
    hv.write_text(yaml.safe_dump({**yaml.safe_load(hv.read_text()), "specdeploy_model_source": "controller"}))
    assert_same(inv)


TRICKY = {
    "hosts.yml": """
all:
  vars: {level: all-inline, specdeploy_port: 1000, ansible_user: alluser}
  hosts:
    lonely: {ansible_host: 10.0.0.10}
  children:
    specdeploy_engines:
      vars: {level: engines-inline, specdeploy_port: 2000, tp: 8, ratio: 0.5}
      hosts:
        gpu-0: {level: host-inline, ansible_ssh_common_args: "-o X={{ inventory_hostname }}"}
      children:
        rack1:
          vars: {level: rack1-inline, specdeploy_tensor_parallel_size: 4}
          children:
            rack1a:
              vars: {level: rack1a-inline}
              hosts:
                gpu-1: {ansible_host: 10.0.0.1, ansible_port: 2222}
        rack2:
          vars: {level: rack2-inline, ansible_group_priority: 50}
          hosts:
            gpu-2: {ansible_host: 10.0.0.2}
            gpu-3:
    fast:
      vars: {level: fast-inline, ansible_group_priority: 10, specdeploy_port: 3000, who: fast}
      hosts:
        gpu-2: {ansible_user: fastuser}
        gpu-3:
    slow:
      vars: {level: slow-inline, specdeploy_port: 4000, who: slow}
      hosts:
        gpu-3: {}
    specdeploy_monitoring:
      hosts: {mon-1.example.org: {ansible_host: 10.0.0.9}}
    specdeploy_routers:
      hosts:
        gpu-0: {ansible_port: 22}
""",
    "group_vars/all.yml": {"level": "all-file", "specdeploy_max_model_len": 1,
                           "model": "m-{{ inventory_hostname_short }}"},
    "group_vars/specdeploy_engines/10-base.yml": {"specdeploy_max_model_len": 2, "specdeploy_engine": "vllm",
                                                  "specdeploy_api_key_file": "{{ inventory_dir }}/key",
                                                  "specdeploy_model_path": "/models/{{ inventory_hostname }}",
                                                  "specdeploy_served_model_name": "{{ model }}",
                                                  "specdeploy_tensor_parallel_size": "{{ tp }}",
                                                  "specdeploy_gpu_memory_utilization": "{{ ratio }}",
                                                  "specdeploy_engine_env": {"PORT": "p{{ tp }}", "N": ["{{ model }}"]}},
    "group_vars/specdeploy_engines/20-override.yaml": {"specdeploy_max_model_len": 3},
    "group_vars/specdeploy_engines/sub/x.json": '{"specdeploy_spec_num_tokens": 5, "level": "engines-file"}',
    "group_vars/specdeploy_engines/.hidden.yml": {"specdeploy_spec_num_tokens": 99},
    "group_vars/specdeploy_engines/backup.yml~": {"specdeploy_spec_num_tokens": 98},
    "group_vars/specdeploy_engines/notes.txt": {"specdeploy_spec_num_tokens": 97},
    "group_vars/rack1": {"level": "rack1-file"},
    "group_vars/rack2.yml": {"specdeploy_port": 6000},
    "group_vars/rack2.yaml": {"specdeploy_port": 6001},  # Ansible reads only the first of .yml, .yaml
    "group_vars/fast.yml": {"who": "fast-file", "ansible_group_priority": 0},  # a var, not the group's priority
    "group_vars/slow.yaml": {"who": "slow-file"},
    "group_vars/ungrouped.yml": {"level": "ungrouped-file"},
    "host_vars/gpu-1.yml": {"specdeploy_port": 5000, "level": "gpu-1-file"},
    "host_vars/gpu-2/a.yml": {"level": "gpu-2-a"},
    "host_vars/gpu-2/b.yml": {"level": "gpu-2-b", "specdeploy_spec_enabled": False},
    "host_vars/gpu-0.json": '{"specdeploy_hardware": "b200_nvl8", "inventory_dir": "/elsewhere"}',
}
LIMITS = ["gpu-1", "rack1", "specdeploy_engines,!rack2", "specdeploy_engines:&fast", "fast:slow", "!fast", "&fast",
          "nosuch", "gpu-2,gpu-0", " gpu-1 , rack2 ", "mon-1.example.org", "all:!specdeploy_engines", "lonely"]


def test_tricky_inventory_reads_the_same(tmp_path):
    inv = write(tmp_path / "inv", TRICKY)
    v = assert_same(inv, limits=LIMITS, groups=["rack1", "rack1a", "rack2", "fast", "slow"])
    # the cases are what they claim to be
    assert v["gpu-1"]["level"] == "gpu-1-file" and v["gpu-1"]["specdeploy_port"] == 5000
    assert v["gpu-2"]["level"] == "gpu-2-b" and v["gpu-2"]["specdeploy_port"] == 6000  # rack2 deeper than fast
    assert v["gpu-3"]["who"] == "fast-file"  # fast's priority 10 beats slow's 1 at the same depth
    assert v["gpu-0"]["specdeploy_tensor_parallel_size"] == 8 and v["gpu-0"]["specdeploy_max_model_len"] == 3
    assert v["gpu-0"]["specdeploy_served_model_name"] == "m-gpu-0" and v["gpu-0"]["ansible_port"] == 22
    assert v["gpu-0"]["specdeploy_api_key_file"] == "/elsewhere/key"  # host_vars win over inventory_dir
    assert v["lonely"]["level"] == "ungrouped-file"


TEMPLATE_FORMS = """
tp: 8
f: 0.5
flag: true
lst: [1, "{{ tp }}"]
d: {a: "{{ tp }}"}
s: "8000"
sl: "[1, 2]"
sb: "True"
specdeploy_a: " {{ tp }}"
specdeploy_b: "{{ tp }}{{ tp }}"
specdeploy_c: "{{ flag }}"
specdeploy_d: "{{ lst }}"
specdeploy_e: "{{ d }}"
specdeploy_f: "x{{ f }}"
specdeploy_g: "{{ s }}"
specdeploy_h: "{{ sl }}"
specdeploy_i: "{{ sb }}"
specdeploy_k: "a\\n{{ s }}\\nb"
specdeploy_l: "{{tp}}"
specdeploy_m: ["{{ tp }}", "{{ s }}", {n: "{{ f }}"}]
specdeploy_n: "no template }}"
"""


def test_template_forms_render_as_ansible_renders_them(tmp_path):
    inv = write(tmp_path / "inv", {"hosts.yml": {"specdeploy_engines": {"hosts": {"h1": None}}},
                                   "group_vars/specdeploy_engines.yml": TEMPLATE_FORMS})
    v = assert_same(inv)["h1"]
    assert v["specdeploy_a"] == " 8" and v["specdeploy_c"] is True and v["specdeploy_g"] == "8000"


def test_extra_vars_win(tmp_path):
    inv = write(tmp_path / "inv", TRICKY)
    v = assert_same(inv, extra={"specdeploy_port": 9999, "level": "extra", "tp": 2,
                                "specdeploy_engine_env": {"X": "1"}})
    assert v["gpu-1"]["specdeploy_port"] == 9999 and v["gpu-1"]["specdeploy_tensor_parallel_size"] == 2


def test_file_and_multi_file_sources(tmp_path):
    files = {"hosts.yml": {"all": {"children": {"specdeploy_engines": {"hosts": {"h1": {"a": 1}}}}}},
             "group_vars/specdeploy_engines.yml": {"specdeploy_port": 7, "where": "{{ inventory_file }}"},
             "group_vars/all.yml": {"specdeploy_where": "{{ where }}"}}
    inv = write(tmp_path / "one", files)
    assert_same(inv / "hosts.yml")
    multi = write(tmp_path / "multi", {**files, "README.md": "# not an inventory\n",
                                       "20-more.yaml": {"specdeploy_engines": {"hosts": {"h1": {"a": 2}, "h2": None}},
                                                        "specdeploy_routers": {"hosts": {"h2": {}}}}})
    v = assert_same(multi, limits=["h1", "specdeploy_routers"])
    # files in name order: 20-more.yaml first (it names inventory_file), hosts.yml's vars last
    assert v["h1"]["a"] == 1 and v["h1"]["specdeploy_where"] == str(multi / "20-more.yaml")


def fallback_cases(tmp_path: Path) -> dict[str, Path]:
    gv = "group_vars/specdeploy_engines.yml"
    base = {gv: {"specdeploy_port": 8000}}
    engines = {"specdeploy_engines": {"hosts": {"gpu-a": {"ansible_host": "10.0.0.1"}}}}
    yml = {"hosts.yml": {"all": {"children": engines}}}
    cases = {
        "ini": {**base, "hosts": "[specdeploy_engines]\ngpu-a ansible_host=10.0.0.1\n"},
        "range": {**base, "hosts.yml": {"specdeploy_engines": {"hosts": {"gpu-[01:03]": {}}}}},
        "port-in-name": {**base, "hosts.yml": {"specdeploy_engines": {"hosts": {"gpu-a:2222": {}}}}},
        "vault-file": {**yml, gv: "$ANSIBLE_VAULT;1.1;AES256\n6162\n"},
        "vault-tag": {**yml, gv: "specdeploy_port: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n"},
        "filter": {**yml, gv: {"specdeploy_served_model_name": "{{ inventory_hostname | upper }}"}},
        "trailing-newline": {**yml, gv: "specdeploy_served_model_name: |\n  {{ inventory_hostname }}\n"},
        "undefined": {**yml, gv: {"specdeploy_served_model_name": "{{ nosuch }}"}},
        "plugin": {**yml, "zz-constructed.yml": {"plugin": "ansible.builtin.constructed", "groups": {"big": "true"}}},
        "malformed": {**yml, gv: "specdeploy_port: [8000\n  oops: : here\n"},
        "script": {**base, "inv.yml": "#!/bin/sh\necho '{\"specdeploy_engines\": {\"hosts\": [\"gpu-a\"]}, "
                                      "\"_meta\": {\"hostvars\": {}}}'\n"},
    }
    out = {}
    for name, files in cases.items():
        out[name] = write(tmp_path / name, files)
    os.chmod(out["script"] / "inv.yml", 0o755)
    return out


def outcome(fn, path, extra=None):
    try:
        _, v = fn(path, extra)
    except SpecdeployError as exc:
        return ("error", [p.line() for p in exc.problems])
    return {h: (["error", [p.line() for p in x.problems]] if isinstance(x, SpecdeployError)
                else {k: y for k, y in x.items() if k not in ANSIBLE_ONLY}) for h, x in v.items()}


@pytest.mark.parametrize("case", ["ini", "range", "port-in-name", "vault-file", "vault-tag", "filter", "undefined",
                                  "trailing-newline",
                                  "plugin", "malformed", "script"])
def test_each_fallback_trigger_falls_back_to_ansible(case, tmp_path):
    path = fallback_cases(tmp_path)[case]
    with pytest.raises(Unsupported):
        inventory_native.read(path, {})
    got = outcome(host_variables, path)
    assert got == outcome(ansible_host_variables, path)
    if case == "filter":
        assert got["gpu-a"]["specdeploy_served_model_name"] == "GPU-A"
    if case == "malformed":
        assert got[0] == "error" and "group_vars/specdeploy_engines.yml" in got[1][0]


def test_settings_and_extra_templates_fall_back(tmp_path, monkeypatch, repo):
    example = repo / "inventory/example"
    with pytest.raises(Unsupported, match="-e values with templates"):
        inventory_native.read(example, {"specdeploy_port": "{{ x }}"})
    assert outcome(host_variables, example, {"specdeploy_served_model_name": "{{ x }}"}) == \
        outcome(ansible_host_variables, example, {"specdeploy_served_model_name": "{{ x }}"})
    monkeypatch.setenv("ANSIBLE_HASH_BEHAVIOUR", "merge")
    with pytest.raises(Unsupported, match="ANSIBLE_HASH_BEHAVIOUR"):
        inventory_native.read(example, {})
    monkeypatch.delenv("ANSIBLE_HASH_BEHAVIOUR")
    monkeypatch.chdir(tmp_path)
    inventory_native.read(example, {})  # no ansible.cfg here: native
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 5\nhash_behaviour = merge\n")
    with pytest.raises(Unsupported, match="ansible.cfg"):
        inventory_native.read(example, {})
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 5\n[ssh_connection]\npipelining = True\n")
    inventory_native.read(example, {})
    (tmp_path / "group_vars").mkdir()  # playbook-adjacent vars
    with pytest.raises(Unsupported, match="playbook-adjacent"):
        inventory_native.read(example, {})


@pytest.mark.parametrize("env, native", [
    ({"ANSIBLE_CONNECTION_PLUGINS": "/x", "ANSIBLE_SSH_RETRIES": "3", "ANSIBLE_GATHERING": "smart"}, True),
    ({"ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml", "ANSIBLE_BECOME_USER": "root"}, True),
    ({"ANSIBLE_VARS_ENABLED": "host_group_vars,community.general.x"}, False),
    ({"ANSIBLE_CACHE_PLUGIN": "jsonfile"}, False),  # cached facts are variables too
    ({"ANSIBLE_INVENTORY_IGNORE": ".yml"}, False),
    ({"ANSIBLE_NO_SUCH_SETTING_HERE": "1"}, False)])  # not a setting of this release: not trusted
def test_only_settings_that_change_variables_send_the_reader_to_ansible(monkeypatch, repo, tmp_path, env, native):
    """The installed ansible-core's own settings and builtin plugin options, as generated into the table
    (hostvars.ansible_settings): connection, callback and become settings keep the native reader; inventory,
    vars-plugin and fact-cache settings, and names the table does not hold, do not."""
    monkeypatch.chdir(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if native:  # and what it reads is what Ansible reads under the same settings
        inventory_native.read(repo / "inventory/example", {})
        assert outcome(host_variables, repo / "inventory/example") == \
            outcome(ansible_host_variables, repo / "inventory/example")
    else:
        with pytest.raises(Unsupported, match=sorted(env)[0]):
            inventory_native.read(repo / "inventory/example", {})


def test_ansible_cfg_sections_are_read_key_by_key(monkeypatch, repo, tmp_path):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nforks = 50\n[inventory]\ninventory_unparsed_warning = False\n"
                   "[callback_tree]\ndirectory = /tmp/t\n")
    inventory_native.read(repo / "inventory/example", {})
    cfg.write_text("[defaults]\nforks = 50\n[inventory]\nenable_plugins = yaml, ini\n")
    with pytest.raises(Unsupported, match="enable_plugins"):
        inventory_native.read(repo / "inventory/example", {})


def test_the_repository_ansible_cfg_keeps_the_native_reader(repo, monkeypatch):
    monkeypatch.chdir(repo)
    inventory_native.read(repo / "inventory/example", {})


@pytest.mark.parametrize("limit", ["gpu-*", "~gpu-[ab]", "specdeploy_engines[0]", "gpu-a:22", "localhost"])
def test_limit_patterns_it_does_not_read_go_to_ansible(limit, repo):
    ninv, _ = inventory_native.read(repo / "inventory/example", {})
    ainv, _ = ansible_host_variables(repo / "inventory/example")
    assert inventory_native.split_pattern(limit) is None
    assert names(ninv.get_hosts(limit)) == names(ainv.get_hosts(limit))


def test_ignored_extensions_match_ansible():
    import ansible.constants as C
    assert list(inventory_native.IGNORED_EXTS) == list(C.INVENTORY_IGNORE_EXTS)
    assert list(inventory_native.VARS_EXTS[1:]) == list(C.YAML_FILENAME_EXTENSIONS)
    assert tuple(C.LOCALHOST) == inventory_native.LOCALHOST
    assert [os.path.expanduser(p) for p in inventory_native.LEGACY_VARS_PLUGIN_DIRS] == C.DEFAULT_VARS_PLUGIN_PATH
    assert C.VARIABLE_PRECEDENCE == ["all_inventory", "groups_inventory", "all_plugins_inventory", "all_plugins_play",
                                     "groups_plugins_inventory", "groups_plugins_play"]


def test_executable_bit_is_a_script_to_ansible(tmp_path):
    inv = write(tmp_path / "inv", {"hosts.yml": {"specdeploy_engines": {"hosts": {"a": {}}}}})
    os.chmod(inv / "hosts.yml", os.stat(inv / "hosts.yml").st_mode | stat.S_IXUSR)
    with pytest.raises(Unsupported):
        inventory_native.read(inv, {})
