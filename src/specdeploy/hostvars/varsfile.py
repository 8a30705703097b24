"""Where specdeploy writes into a host's host_vars directory (``host_vars_file``), and one variable set in a
host_vars or group_vars YAML file that a person also edits (``nccl choose --write-host-vars``): everything else in
the file stays byte for byte (comments, order, quoting, ``!vault`` values); only the variable's own block, and the
comment lines the command wrote above it, are replaced.

The file's top level must be a block mapping (``key: value`` lines, as Ansible's vars files are); a flow mapping,
a list, or text that is not YAML is refused. The result is parsed again and must hold the same variables as
before, the one set aside."""
from __future__ import annotations

from typing import Any

import yaml

from specdeploy.values.errors import Finding, SpecdeployError


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads Ansible's ``!vault`` and ``!unsafe`` tags as opaque text."""


def _opaque(loader, node):
    return ("<tagged>", node.tag, loader.construct_scalar(node))


_Loader.add_constructor("!vault", _opaque)
_Loader.add_constructor("!unsafe", _opaque)


def _err(where: str, message: str, fix: str = "fix the file, or give another path") -> SpecdeployError:
    return SpecdeployError([Finding("error", where, message, fix)])


def load(text: str, where: str) -> dict[str, Any]:
    from specdeploy.values.bounded import yaml_depth
    deep = yaml_depth(text)
    if deep:
        raise _err(where, deep)
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader with two opaque tags)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise _err(where, f"is not YAML{at}") from None
    except RecursionError:
        raise _err(where, "nests too deep to read") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _err(where, f"holds a YAML {type(data).__name__}, not a mapping of variables")
    return data


def set_variable(text: str, key: str, value: Any, comments: list[str], where: str) -> str:
    """``text`` with top-level ``key`` set to ``value`` (a plain YAML value), ``comments`` (lines without '#')
    written just above it in place of those an earlier run wrote there (lines starting ``# <prefix>`` where
    prefix is each comment's first word up to ':')."""
    before = load(text, where)
    block = yaml.safe_dump({key: value}, sort_keys=True, default_flow_style=False)
    heads = sorted({c.split(":", 1)[0] + ":" for c in comments if ":" in c})
    ours = "".join(f"# {c}\n" for c in comments)
    root = _root(text, where)
    lines = text.splitlines(keepends=True)
    span = None
    if root is not None:
        for k, v in root.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                span = (k.start_mark.line, _end_line(v, lines))
    if span is None:
        body = text if not text or text.endswith("\n") else text + "\n"
        new = body + ours + block
    else:
        start, end = span
        while start > 0 and any(lines[start - 1].startswith(f"# {h}") for h in heads):
            start -= 1
        new = "".join(lines[:start]) + ours + block + "".join(lines[end:])
    after = load(new, where)
    if {k: v for k, v in after.items() if k != key} != {k: v for k, v in before.items() if k != key} \
            or after.get(key) != value:
        raise _err(where, f"cannot be edited safely (setting {key} would change other variables)",
                   f"set {key} in it by hand, or give another path")
    return new


def _root(text: str, where: str):
    load(text, where)  # its bounds first
    try:
        node = yaml.compose(text, Loader=_Loader)  # noqa: S506
    except yaml.YAMLError:
        raise _err(where, "is not YAML") from None
    if node is None:
        return None
    if not isinstance(node, yaml.MappingNode) or node.flow_style:
        raise _err(where, "is not a block mapping of variables (key: value lines)",
                   "write its variables as key: value lines, or give another path")
    return node


def _end_line(node: yaml.Node, lines: list[str]) -> int:
    """The line after the value ``node`` ends (its last line included; blank and comment lines after its last
    line belong to what follows)."""
    end = node.end_mark.line + (1 if node.end_mark.column > 0 else 0)
    while end > node.start_mark.line + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return max(end, node.start_mark.line + 1)


def host_vars_file(inventory_dir: str, host: str, name: str, writing: bool = True) -> str:
    """A controller-side inventory file of specdeploy's in a host's host_vars directory (the gate's verdict, the
    chosen NCCL environment); the host name and the file name must each be one path component. Refused where the
    host's variables are a file (``host_vars/<host>.yml``): a directory beside it would make Ansible ignore that
    file without a word (``writing``; a read of the file that cannot be there is not)."""
    import os
    for what, part in (("host", host), ("file", name)):
        if not part or part in (".", "..") or "/" in part or "\x00" in part:
            raise ValueError(f"{what} {part!r} is not one path component")
    base = f"{inventory_dir}/host_vars/{host}"
    if writing and not os.path.isdir(base):
        for ext in ("", ".yml", ".yaml", ".json"):
            if os.path.isfile(base + ext):
                raise ValueError(f"{base + ext} holds {host}'s variables; writing {name} into host_vars/{host}/ "
                                 f"would make Ansible ignore that file: move it into host_vars/{host}/ (Ansible "
                                 "reads every file there)")
    return f"{base}/{name}"


def gate_vars_file(inventory_dir: str, host: str, writing: bool = True) -> str:
    """The controller-side inventory file where the gate writes a host's verdict as variables."""
    return host_vars_file(inventory_dir, host, "specdeploy_gate.yml", writing)
