"""The callback that keeps the controller's heap out of its workers' garbage collections
(specdeploy.deploy.forking): what it freezes, when it collects, its switch, and the names it drops after the
forget task."""
from __future__ import annotations

import ast
import gc
import json
import os
import subprocess
import sys
import weakref

import pytest

from helpers import REPO
from specdeploy.deploy import forking


class _Cycle:
    def __init__(self):
        self.me = self


@pytest.fixture(autouse=True)
def _thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_task_start_freezes_and_a_play_start_collects_then_freezes_again():
    cb = forking.CallbackModule()
    assert cb.on
    kept = _Cycle()
    cb.v2_playbook_on_task_start(None, False)
    frozen = gc.get_freeze_count()
    assert frozen > 0 and cb.freezes == 1
    garbage = _Cycle()
    gone = weakref.ref(garbage)
    del garbage
    cb.v2_playbook_on_task_start(None, False)  # frozen garbage is kept: only a play start (or a batch) collects it
    gc.collect()
    assert gone() is not None
    cb.v2_playbook_on_play_start(None)
    assert gone() is None and cb.collections == 1
    assert gc.get_freeze_count() > 0 and kept.me is kept
    cb.v2_playbook_on_handler_task_start(None)
    assert cb.freezes == 3
    cb.v2_playbook_on_stats(None)
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("False", False), (" no ", False),
                                       ("1", True), ("", True), ("yes", True)])
def test_the_switch(value, on, monkeypatch):
    monkeypatch.setenv(forking.SWITCH, value)
    assert forking.enabled(os.environ) is on
    cb = forking.CallbackModule()
    cb.v2_playbook_on_task_start(None, False)
    cb.v2_playbook_on_play_start(None)
    assert (gc.get_freeze_count() > 0) is on and (cb.freezes, cb.collections) == ((1, 1) if on else (0, 0))


@pytest.mark.parametrize("switch, loads", [("1", False), ("0", True)])
def test_a_task_start_loads_the_filter_and_test_plugins_so_a_worker_forked_after_loads_none(switch, loads,
                                                                                            monkeypatch):
    """Ansible templates a task's arguments in the worker; a worker forked after the task start finds every filter
    and test plugin loaded, and reads no plugin file to template one."""
    from ansible.plugins import loader
    for jinja_loader in (loader.filter_loader, loader.test_loader):  # as a fresh ansible-playbook has them
        monkeypatch.setattr(jinja_loader, "_cached_non_collection_wrappers", {})
        monkeypatch.setattr(jinja_loader, "_module_cache", {})
    monkeypatch.setenv(forking.SWITCH, switch)
    forking.CallbackModule().v2_playbook_on_task_start(None, False)
    read = []
    load = loader.PluginLoader._load_module_source
    monkeypatch.setattr(loader.PluginLoader, "_load_module_source",
                        lambda self, *a, **kw: read.append(self.type) or load(self, *a, **kw))
    assert loader.filter_loader.get_with_context("to_json").object is not None  # what a worker's templating asks
    assert loader.test_loader.get_with_context("match").object is not None
    assert bool(read) is loads, read


def test_a_plugin_that_cannot_load_still_leaves_the_heap_frozen(monkeypatch):
    def broken():
        raise RuntimeError("a filter plugin that fails to import")
    monkeypatch.setattr(forking, "load_jinja_plugins", broken)
    forking.CallbackModule().v2_playbook_on_task_start(None, False)
    assert gc.get_freeze_count() > 0


def test_the_plugin_beside_the_playbooks_is_a_shim():
    f = REPO / "ansible" / "callback_plugins" / "specdeploy_fork.py"
    body = ast.parse(f.read_text()).body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)  # its docstring
    assert [(type(n), n.module, [a.name for a in n.names]) for n in body[1:]] == \
        [(ast.ImportFrom, "specdeploy.deploy.forking", ["CallbackModule"])]


def test_a_null_left_by_the_forget_task_is_removed_and_any_other_value_stays():
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager
    vm = VariableManager(loader=DataLoader())
    vm.set_nonpersistent_facts("gpu-0001", {"plan": None, "kept": 1, "probe": None})
    vm.set_nonpersistent_facts("gpu-0002", {"plan": None})
    assert forking.drop_forgotten(vm, "gpu-0001", ["plan", "kept", "probe", "never_set"]) == 2
    assert vm._nonpersistent_fact_cache["gpu-0001"] == {"kept": 1}
    assert vm._nonpersistent_fact_cache["gpu-0002"] == {"plan": None}  # another host's stay
    assert forking.drop_forgotten(vm, "gpu-0003", ["plan"]) == 0
    assert forking.drop_forgotten(None, "gpu-0001", ["kept"]) == 0


def test_only_the_forget_task_forgets():
    from types import SimpleNamespace

    def task(name, action, args):  # what the callback reads of Ansible's Task (the real one: the test below)
        return SimpleNamespace(action=action, args=args, get_name=lambda: name)
    forget = task("Forget this host's results and facts", "ansible.builtin.set_fact", {"a": None, "b": None})
    assert forking.forgets(forget) == ["a", "b"]
    assert forking.forgets(task("Forget this host's plan", "set_fact", {"a": None, "c": 1})) == ["a"]
    assert forking.forgets(task("Clear a plan", "ansible.builtin.set_fact", {"a": None})) == []
    assert forking.forgets(task("Forget this host's (a debug)", "ansible.builtin.debug", {"msg": None})) == []
    assert forking.forgets(None) == []


def test_after_the_forget_task_a_real_playbook_sees_the_names_undefined(tmp_path):
    """Ansible stores a task's facts before it calls back: a later task of the same run finds the forgotten
    names undefined, a fact set again after the forget task defined, and a fact the task did not name untouched."""
    book = tmp_path / "book.yml"
    book.write_text(json.dumps([{
        "hosts": "all", "gather_facts": False, "tasks": [
            {"name": "A plan and a probe", "ansible.builtin.set_fact": {"plan": "p", "probe": 1, "other": "o"}},
            {"name": "A registered result", "ansible.builtin.command": "true", "register": "run",
             "changed_when": False},
            {"name": "Forget this host's plan, probe and result", "ansible.builtin.set_fact":
                {"plan": None, "probe": None, "run": None}},
            {"name": "The plan again", "ansible.builtin.set_fact": {"plan": "again"}},
            {"name": "What is defined", "ansible.builtin.copy": {
                "dest": str(tmp_path / "seen-{{ inventory_hostname }}.json"),
                "content": "{{ {'plan': plan | default('UNDEFINED'), 'probe': probe is defined,"
                           " 'run': run is defined, 'other': other} | to_json }}"}},
        ]}]))
    env = {**os.environ, "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "ansible" / "callback_plugins"),
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run(["ansible-playbook", "-i", "h1,h2,", "-c", "local", str(book)], env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for h in ("h1", "h2"):
        seen = json.loads((tmp_path / f"seen-{h}.json").read_text())
        assert seen == {"plan": "again", "probe": False, "run": False, "other": "o"}, (h, seen)
