"""The controller's memory as Ansible forks a worker for every host and task (docs/fleet.md, "Workers (the
controller's memory)").

Each worker is a fork of ``ansible-playbook``, whose heap holds the whole fleet: its inventory, every host's
variables and the deploy's fleet-wide facts. When the worker's cyclic garbage collector runs a full collection it
walks every object it inherited, writes to each one's header and so copies, page by page, a heap that grows with
the fleet. On the simulated fleet that made a worker's cost grow with the number of hosts (bench/README.md).

This callback freezes the controller's objects (``gc.freeze``: the collector leaves them alone, in the controller
and in every worker forked after it) before each task's workers are forked, and once per play and per rolling
batch it thaws them, collects the controller's garbage and freezes again, so cyclic garbage lives at most one
batch and that collection is linear in the heap.

Before each task's workers are forked it also loads Ansible's filter and test plugins in the controller. Ansible
loads them in the process that first templates a filter, keeps them there, and templates a task's arguments in
its workers, so each worker (a new process for every host and task) loaded every filter and test plugin file
again, specdeploy's core with them; loaded once in the controller, every worker inherits them.

``SPECDEPLOY_FORK_FREEZE=0`` turns both off (the control arm of ``bench/fleet_fork.py``)."""
from __future__ import annotations

import gc
import os

from ansible.plugins.callback import CallbackBase

SWITCH = "SPECDEPLOY_FORK_FREEZE"


def enabled(environ=os.environ) -> bool:
    return environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def collect_and_freeze() -> None:
    """Thaw, collect everything, freeze what is left."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def load_jinja_plugins() -> None:
    """Ansible's filter and test plugins, loaded in this process (Ansible's loaders keep them, and reload them only
    after a plugin directory is added, when a role that brings one is loaded)."""
    from ansible.plugins.loader import filter_loader, test_loader
    for loader in (filter_loader, test_loader):
        next(iter(loader.all()), None)  # all() loads every plugin of its kind on its first call, then reads its cache


class CallbackModule(CallbackBase):
    """Loaded by Ansible from ``ansible/callback_plugins/`` beside the playbooks, for every playbook there, without
    being enabled in ansible.cfg; it prints nothing."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "specdeploy_fork"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.on = enabled()
        self.collections = 0
        self.freezes = 0

    def v2_playbook_on_play_start(self, play):
        # Ansible sends this for every play and again for every rolling (serial) batch of a play
        if self.on:
            collect_and_freeze()
            self.collections += 1

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._before_fork()

    def v2_playbook_on_handler_task_start(self, task):
        self._before_fork()

    def v2_playbook_on_stats(self, stats):
        if self.on:
            gc.unfreeze()

    def _before_fork(self) -> None:
        if self.on:
            try:
                load_jinja_plugins()
            except Exception:  # noqa: BLE001 - a plugin that cannot load fails in the worker, where Ansible reports it
                pass
            gc.freeze()  # O(1): the collector's generations are moved, not walked
            self.freezes += 1
