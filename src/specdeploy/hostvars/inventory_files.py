"""What every inventory file must be before either reader parses it: a regular file of at most ``MAX_BYTES``, UTF-8
text, and, where it is YAML or JSON, a document whose aliases expand to at most ``NODE_BUDGET`` nodes, without
recursion, and without a mapping key given twice. Group loops are refused here too (``group_loop``).

Each refusal is a ``SpecdeployError`` naming the file (and line) and the fix. Both inventory readers call this: the
native one on every file it opens, the Ansible one through its file loader (``inventory_ansible``)."""
from __future__ import annotations

import json
import os
from typing import Any

import yaml

from specdeploy.values.errors import Finding, SpecdeployError

MAX_BYTES = 16 << 20
# nodes a document may have once every alias is replaced by what it points at (a real inventory has thousands)
NODE_BUDGET = 1_000_000
STRUCTURED_EXTS = ("", ".yml", ".yaml", ".json")


def refuse(where: str, message: str, fix: str) -> SpecdeployError:
    return SpecdeployError([Finding("error", where, message, fix)])


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a regular file of at most MAX_BYTES (values.bounded.read_regular); a FIFO, device, socket or
    directory is refused without blocking on it, each refusal naming the file and the fix."""
    from specdeploy.values.bounded import Refused, read_regular
    p = str(path)
    try:
        return read_regular(p, MAX_BYTES)
    except IsADirectoryError:
        raise refuse(p, "is a directory where a file is expected",
                     "make it a YAML file, or move the directory out of the inventory") from None
    except Refused as exc:
        fix = ("make it a YAML file, or move the directory out of the inventory" if "directory" in str(exc) else
               "split it, or remove what is not inventory data" if "bytes" in str(exc) or "grew" in str(exc) else
               "give a regular YAML file")
        raise refuse(p, str(exc), fix) from None
    except OSError as exc:
        raise refuse(p, f"cannot be opened ({exc.strerror or exc})", "check the path and its permissions") from None


MAX_LINE = 64 << 10  # bytes; Ansible's INI and YAML parsers crawl through a megabyte-long line for tens of seconds


def decode(path: str | os.PathLike, data: bytes) -> str:
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if end - start > MAX_LINE:
            line_no = data.count(b"\n", 0, start) + 1
            raise refuse(f"{path}:{line_no}", f"has a line of {end - start} bytes, more "
                         f"than the {MAX_LINE >> 10} KiB an inventory line may have",
                         "give a YAML, JSON or INI inventory with ordinary lines")
        start = end + 1
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise refuse(f"{path}:{line}", f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                     "save the file as UTF-8 (Ansible, too, requires UTF-8 inventory files)") from None


def check_text(path: str | os.PathLike, text: str) -> None:
    """Alias expansion, recursion and duplicate keys of a YAML or JSON document. A document that does not parse is
    left to the reader, which reports it in its own words."""
    if os.path.splitext(str(path))[1] not in STRUCTURED_EXTS or text.lstrip().startswith("$ANSIBLE_VAULT"):
        return
    from specdeploy.values.bounded import yaml_depth
    deep = yaml_depth(text)
    if deep:  # before any parser recurses into it (libyaml's crashes the process)
        raise refuse(str(path), deep, "flatten the document")
    try:
        json.loads(text, object_pairs_hook=_json_pairs(path, text))
        return
    except SpecdeployError:
        raise
    except (ValueError, RecursionError):
        pass
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        while loader.check_node():
            _check_node(path, loader.get_node())
    except yaml.YAMLError:
        return
    except RecursionError:
        raise refuse(str(path), "nests too deep to read", "flatten the document") from None
    finally:
        loader.dispose()


def checked_text(path: str | os.PathLike) -> str:
    """read_bytes, decode and check_text in one."""
    text = decode(path, read_bytes(path))
    check_text(path, text)
    return text


def _json_pairs(path, text: str):
    def hook(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _duplicate(path, _json_line(text, k), k)
            seen.add(k)
        return dict(pairs)
    return hook


def _json_line(text: str, key: str) -> int | None:
    needle = json.dumps(key)
    first = text.find(needle)
    second = text.find(needle, first + 1) if first >= 0 else -1
    return text.count("\n", 0, second) + 1 if second >= 0 else None


def _duplicate(path, line: int | None, key: Any) -> SpecdeployError:
    where = f"{path}:{line}" if line else str(path)
    return refuse(where, f"mapping key {key!r} is given twice; YAML would keep only the last one (Ansible warns and "
                         "keeps the last; specdeploy refuses)", f"remove or rename one of the two {key!r} entries")


_KEYS = yaml.SafeLoader("")


def _key(node: yaml.Node) -> Any:
    """A mapping key as the loaders compare it: constructed where it is a scalar of a standard tag."""
    if isinstance(node, yaml.ScalarNode):
        if node.tag.startswith("tag:yaml.org,2002:"):
            try:
                value = _KEYS.construct_object(node, deep=True)
                return (type(value).__name__, value) if isinstance(value, (bool, int, float)) else value
            except (yaml.YAMLError, ValueError, TypeError):
                pass
        return (node.tag, node.value)
    return (node.tag, id(node))


def _check_node(path, root: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        nid = id(node)
        if nid in sizes:
            return sizes[nid]
        if nid in open_:
            raise refuse(f"{path}:{node.start_mark.line + 1}", "has an alias that refers to itself (a recursive "
                         "structure)", "replace the alias with the data it should hold")
        open_.add(nid)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                total += size(child)
                if total > NODE_BUDGET:
                    break
        elif isinstance(node, yaml.MappingNode):
            seen: set = set()
            for k, v in node.value:
                if k.tag != "tag:yaml.org,2002:merge":
                    key = _key(k)
                    try:
                        dup = key in seen
                        seen.add(key)
                    except TypeError:
                        dup = False
                    if dup:
                        raise _duplicate(path, k.start_mark.line + 1, k.value if isinstance(k, yaml.ScalarNode)
                                         else key)
                total += size(k) + size(v)
                if total > NODE_BUDGET:
                    break
        open_.discard(nid)
        if total > NODE_BUDGET:
            raise refuse(f"{path}:{root.start_mark.line + 1}", f"expands its aliases to more than {NODE_BUDGET:,} "
                         "nodes (an alias bomb?); specdeploy does not read it", "write the data out without nested "
                         "aliases")
        sizes[nid] = total
        return total
    size(root)


def group_loop(where: str, chain: list[str]) -> SpecdeployError:
    """A group that contains itself, directly or through others: ``chain`` from the group back to it."""
    return refuse(where, f"group {chain[0]} contains itself ({' -> '.join(chain)}); Ansible refuses such a group "
                         "and drops the file with a warning, specdeploy stops",
                  f"remove {chain[-1]} from the children of {chain[-2]}")


def loop_in(children: dict[str, list[str]]) -> list[str] | None:
    """A group loop in {group: its children}: [g, ..., g], or None."""
    state: dict[str, int] = {}

    def visit(g: str, trail: list[str]) -> list[str] | None:
        state[g] = 1
        for c in children.get(g, ()):
            if state.get(c) == 1:
                return trail[trail.index(c):] + [c] if c in trail else [g, c]
            if c not in state:
                found = visit(c, trail + [c])
                if found:
                    return found
        state[g] = 2
        return None
    for g in list(children):
        if g not in state:
            found = visit(g, [g])
            if found:
                return found
    return None


def scan_inventory_file_groups(data: Any) -> dict[str, list[str]]:
    """{group: children} as a YAML inventory file declares them (any depth)."""
    out: dict[str, list[str]] = {}

    def walk(name: str, body: Any) -> None:
        if not isinstance(body, dict):
            return
        kids = body.get("children")
        if isinstance(kids, dict):
            for sub, sub_body in kids.items():
                out.setdefault(str(name), []).append(str(sub))
                walk(str(sub), sub_body)
    if isinstance(data, dict):
        for name, body in data.items():
            walk(str(name), body)
    return out
