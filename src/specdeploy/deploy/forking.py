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

``SPECDEPLOY_FORK_FREEZE=0`` turns both off (the control arm of ``bench/fleet_fork.py``).

And when the deploy play's forget task (``FORGET_TASK``, the play's last post task) has set a host's spent results
and facts to null, it removes those names from the host's variables. A null still keeps its name, and the name
Ansible keeps is the task file's string with its data tags (where in which YAML file it was written): about 330
bytes for each of about a hundred names per host, which the controller held for every host until the run ended."""
from __future__ import annotations

import gc
import os

from ansible.plugins.callback import CallbackBase

SWITCH = "SPECDEPLOY_FORK_FREEZE"
FORGET_TASK = "Forget this host's"  # how deploy.yml's forget task's name begins (tests/unit/ansible/test_forget.py)
SET_FACT = frozenset({"set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact"})


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


def drop_forgotten(variable_manager, host: str, names) -> int:
    """Remove from ``host``'s set_fact variables (and registered results) each of ``names`` whose value is null;
    a name with another value (set again since) stays. Returns how many it removed."""
    cache = getattr(variable_manager, "_nonpersistent_fact_cache", None)
    facts = cache.get(host) if cache is not None else None
    if not facts:
        return 0
    gone = [n for n in names if n in facts and facts[n] is None]
    for n in gone:
        del facts[n]
    return len(gone)


def forgets(task) -> list[str]:
    """The names a forget task sets to null, or none for any other task."""
    if task is None or getattr(task, "action", None) not in SET_FACT:
        return []
    if not str(task.get_name()).startswith(FORGET_TASK):
        return []
    args = getattr(task, "args", None) or {}
    return [str(k) for k, v in args.items() if v is None]


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
        self.variables = None

    def v2_playbook_on_play_start(self, play):
        self.variables = play.get_variable_manager() if play is not None else None
        # Ansible sends this for every play and again for every rolling (serial) batch of a play
        if self.on:
            collect_and_freeze()
            self.collections += 1

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._before_fork()

    def v2_playbook_on_handler_task_start(self, task):
        self._before_fork()

    def v2_runner_on_ok(self, result):
        # Ansible has stored the task's facts for the host before it sends this
        names = forgets(getattr(result, "task", None))
        if names and self.variables is not None:
            drop_forgotten(self.variables, result.host.get_name(), names)

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
