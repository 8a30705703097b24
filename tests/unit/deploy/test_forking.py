"""The callback that keeps the controller's heap out of its workers' garbage collections
(specdeploy.deploy.forking): what it freezes, when it collects, and its switch."""
from __future__ import annotations

import ast
import gc
import os
import weakref

import pytest

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
    from helpers import REPO
    f = REPO / "ansible" / "callback_plugins" / "specdeploy_fork.py"
    body = ast.parse(f.read_text()).body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)  # its docstring
    assert [(type(n), n.module, [a.name for a in n.names]) for n in body[1:]] == \
        [(ast.ImportFrom, "specdeploy.deploy.forking", ["CallbackModule"])]
