"""Reading what comes from outside within bounds: a regular file of at most a given size (a FIFO, a socket or a
device is refused without blocking on it, a 300 MB file without reading it), and JSON of at most
:data:`MAX_DEPTH` levels (deeper nesting is refused before the parser recurses into it).

:func:`read_regular` and :func:`loads` raise :class:`Refused` with a short reason; the caller names its file or
option and the fix (a finding), so that no bad input ends in a traceback."""
from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

MAX_DEPTH = 100          # nesting levels of a JSON document (a model config has fewer than 10)
MAX_CONFIG = 16 << 20    # bytes of a JSON config file (config.json of the largest models is under 1 MB)

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


class Refused(ValueError):
    """The input is out of bounds or of the wrong kind; ``str()`` says how."""


def read_regular(path: str | os.PathLike, max_bytes: int = MAX_CONFIG) -> bytes:
    """The bytes of the regular file ``path`` (links followed), at most ``max_bytes``. A directory, FIFO, socket
    or device is refused without blocking; so is a larger file, before it is read. OSError passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Refused("is a directory where a file is expected")
        if not stat.S_ISREG(st.st_mode):
            raise Refused("is not a regular file (a FIFO, socket or device); specdeploy does not read from it")
        if st.st_size > max_bytes:
            raise Refused(f"is {st.st_size:,} bytes, more than the {_size(max_bytes)} specdeploy reads of such a "
                          "file")
        os.set_blocking(fd, True)
        chunks, left = [], max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise Refused(f"grew past {_size(max_bytes)} while it was read")
    return data


def regular_file(path: str | os.PathLike) -> None:
    """Refuse (:class:`Refused`) a path that is not a regular file, without opening it (a FIFO blocks an open)."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise Refused("is a directory where a file is expected")
    if not stat.S_ISREG(st.st_mode):
        raise Refused("is not a regular file (a FIFO, socket or device); specdeploy does not read from it")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


def depth(text: str) -> int:
    """The deepest nesting of arrays and objects in the JSON ``text`` (strings skipped)."""
    deepest = level = 0
    for m in _BRACKETS.finditer(_STRINGS.sub("", text)):
        if m.group(0) in "[{":
            level += 1
            deepest = max(deepest, level)
        else:
            level -= 1
    return deepest


def loads(text: str | bytes, max_depth: int = MAX_DEPTH, **kw) -> Any:
    """``json.loads`` that refuses (:class:`Refused`) a document nested deeper than ``max_depth``; a document
    that is not JSON raises json.JSONDecodeError (a ValueError) as json.loads does."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    d = depth(text)
    if d > max_depth:
        raise Refused(f"nests {d} levels deep, more than the {max_depth} specdeploy reads")
    try:
        return json.loads(text, **kw)
    except RecursionError:
        raise Refused(f"nests too deep to read (more than {max_depth} levels)") from None


def nesting(obj: Any, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of a parsed value (lists and dicts), counted up to ``limit + 1`` without recursion."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, d = todo.pop()
        if isinstance(o, (dict, list, tuple)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            todo.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


MAX_YAML_COLUMN = 1000  # where a block node's content may start: block nesting is at most this deep


def yaml_depth(text: str, max_depth: int = MAX_DEPTH, max_column: int = MAX_YAML_COLUMN) -> str | None:
    """Why the YAML ``text`` nests too deep for a parser to take without recursing past its stack (a C parser
    crashes, a Python one raises), or None: flow brackets nested beyond ``max_depth`` (quoted text skipped), or a
    block node starting beyond column ``max_column`` (block nesting needs a column per level)."""
    d = depth(re.sub(r"'(?:[^']|'')*'", "", text))
    if d > max_depth:
        return f"nests {d} levels deep, more than the {max_depth} specdeploy reads"
    for n, line in enumerate(text.splitlines(), 1):
        m = _BLOCK.match(line)
        if m and m.end() > max_column:
            return f"line {n} nests a block at column {m.end()}, deeper than the {max_column} specdeploy reads"
    return None


_BLOCK = re.compile(r"(?:[ \t]*(?:[-?:][ \t]+)?)*")
