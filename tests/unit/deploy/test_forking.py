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


def test_the_plugin_beside_the_playbooks_is_a_shim():
    from helpers import REPO
    f = REPO / "ansible" / "callback_plugins" / "specdeploy_fork.py"
    body = ast.parse(f.read_text()).body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)  # its docstring
    assert [(type(n), n.module, [a.name for a in n.names]) for n in body[1:]] == \
        [(ast.ImportFrom, "specdeploy.deploy.forking", ["CallbackModule"])]
