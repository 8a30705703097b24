"""The phase each task of the playbooks declares, for the live view: a tag that ends in ``_<phase>``
(``inference_engine_load``, ``gpu_host_provision``), on the task itself, on a block around it, on the role entry
or include that brings its role in, or on its play. The index is read once from the playbooks' YAML (with line
numbers) and answers for the ``task_path`` (``FILE:LINE``) ansible-runner puts on every event."""
from __future__ import annotations

from pathlib import Path

import yaml

PHASES = ("preflight", "provision", "image", "stage", "start", "load", "ready", "gate", "rollback")
_TASK_LISTS = ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always")
MAX_FILE_BYTES = 1 << 20


def phase_tag(tags) -> str | None:
    """The phase a list of tags declares (the first tag that ends in ``_<phase>``), or None."""
    for t in tags if isinstance(tags, list) else [tags] if isinstance(tags, str) else []:
        for p in PHASES:
            if isinstance(t, str) and t.endswith("_" + p):
                return p
    return None


def _value(node):
    """A YAML node as plain data, for a task's ``tags`` (a scalar or a sequence of scalars)."""
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if isinstance(node, yaml.SequenceNode):
        return [n.value for n in node.value if isinstance(n, yaml.ScalarNode)]
    return None


def _get(node: yaml.MappingNode, key: str):
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _compose(path: Path):
    if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
        return None
    try:
        return yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


class Index:
    """(file relative to the ansible directory, 1-based line of the task) -> phase."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.phases: dict[tuple[str, int], str | None] = {}
        # a role's task file (role, file name) -> the phases the role entries and includes that bring it in declare
        self.file_phase: dict[tuple[str, str], set[str]] = {}
        for pb in sorted(self.root.glob("*.yml")):
            self._role = None
            self._playbook(pb)
        role_files = [(d.name, f) for d in sorted((self.root / "roles").glob("*")) for sub in ("tasks", "handlers")
                      for f in sorted((d / sub).glob("*.yml"))]
        for _ in range(3):  # includes inside role files bring further files in: settle in a few passes
            for role, f in role_files:
                got = self.file_phase.get((role, f.name), set())
                self._role = role
                self._tasks(f, _compose(f), next(iter(got)) if len(got) == 1 else None)

    def _rel(self, f: Path) -> str:
        return f.relative_to(self.root).as_posix()

    _role: str | None = None  # the role whose file is being read

    def _note(self, role, file, phase):
        if isinstance(role, str) and phase:
            name = file if isinstance(file, str) and file.endswith(".yml") else f"{file or 'main'}.yml"
            self.file_phase.setdefault((role, name), set()).add(phase)

    def _playbook(self, f: Path):
        doc = _compose(f)
        if not isinstance(doc, yaml.SequenceNode):
            return
        for play in doc.value:
            if not isinstance(play, yaml.MappingNode):
                continue
            phase = phase_tag(_value(_get(play, "tags")))
            roles = _get(play, "roles")
            for entry in roles.value if isinstance(roles, yaml.SequenceNode) else []:
                if isinstance(entry, yaml.MappingNode):
                    name = _value(_get(entry, "role")) or _value(_get(entry, "name"))
                    self._note(name, "main", phase_tag(_value(_get(entry, "tags"))) or phase)
            for key in ("tasks", "pre_tasks", "post_tasks", "handlers"):
                self._task_list(f, _get(play, key), phase)

    def _tasks(self, f: Path, doc, phase):
        if isinstance(doc, yaml.SequenceNode):
            self._task_list(f, doc, phase)

    def _task_list(self, f: Path, seq, phase):
        if not isinstance(seq, yaml.SequenceNode):
            return
        for task in seq.value:
            if not isinstance(task, yaml.MappingNode):
                continue
            own = phase_tag(_value(_get(task, "tags"))) or phase
            self.phases[(self._rel(f), task.start_mark.line + 1)] = own
            for key in _TASK_LISTS:
                self._task_list(f, _get(task, key), own)
            for action in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role",
                           "import_role"):
                args = _get(task, action)
                if isinstance(args, yaml.MappingNode):
                    self._note(_value(_get(args, "name")), _value(_get(args, "tasks_from")), own)
            for action in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks",
                           "import_tasks"):
                target = _get(task, action)
                if isinstance(target, yaml.MappingNode):
                    target = _get(target, "file")
                if self._role and isinstance(_value(target), str):
                    self._note(self._role, _value(target), own)

    def phase(self, task_path: str | None) -> str | None:
        """The phase of the task at ``task_path`` (``/abs/ansible/roles/x/tasks/main.yml:12``), or None."""
        if not task_path or ":" not in task_path:
            return None
        file, _, line = task_path.rpartition(":")
        try:
            rel = Path(file).resolve().relative_to(self.root.resolve()).as_posix()
            return self.phases.get((rel, int(line)))
        except (ValueError, OSError):
            return None


_CACHE: dict[Path, Index] = {}


def index(root: Path) -> Index:
    """The index of the playbooks under ``root`` (read once per process)."""
    root = Path(root)
    if root not in _CACHE:
        _CACHE[root] = Index(root)
    return _CACHE[root]
