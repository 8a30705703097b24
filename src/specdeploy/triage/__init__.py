"""Find the root cause in vLLM/SGLang logs, say how the engine ended, and name the failure when it is known.

- ``unwrap``: what a web page, a shipper or a front-end does to the text (HTML, JSON records, quoted messages, table
  cells);
- ``normalise``: every line format (containers, shippers, engines) into records of (process, rank, time, level, text);
- ``evidence``: what can say why, by kind (exceptions, error lines, device errors, NCCL/HCCL warnings, kills,
  shutdown markers), per process;
- ``outcome``: the root (the earliest strong causal evidence) and the ending, from the sequence of events;
- ``signatures``: known failures, each tied to the line that is its evidence, with a fix and a confidence.

Files are streamed: only the first lines and the last ones (bounded in lines and bytes) are kept, so a log of any
size is read in one pass with bounded memory.
"""
from __future__ import annotations

import io
import os
import re
from collections import deque

from specdeploy.triage.normalise import MAX_LINE, Record, normalise
from specdeploy.triage.outcome import Triage, decide

__all__ = ["Record", "Triage", "group_root", "iter_log", "iter_logs", "normalise", "read_log", "triage_files",
           "triage_lines", "window"]

HEAD_LINES, TAIL_LINES = 10_000, 60_000
HEAD_BYTES, TAIL_BYTES = 1 << 20, 6 << 20
# where an engine (re)starts: a unit's journal holds every earlier run, and only the latest that ended says why
RUN_START = re.compile(r"^(?:Started|Starting) [\w@.\-]+\.service\b|vLLM API server version|"
                       r"specdeploy engine simulator:|server_args=ServerArgs\(")


def window(lines):
    """(line number, line) for the first and the last lines of ``lines`` (strings, or (number, string) pairs),
    bounded in count and bytes."""
    head: list[tuple[int, str]] = []
    tail: deque[tuple[int, str]] = deque()
    hb = tb = 0
    for n, s in enumerate(lines, 1):
        if isinstance(s, tuple):
            n, s = s
        if isinstance(s, (bytes, bytearray)):
            s = bytes(s).decode("utf-8", "replace")
        elif not isinstance(s, str):
            s = str(s)
        if len(s) > MAX_LINE:
            s = s[:MAX_LINE]
        if hb < HEAD_BYTES and len(head) < HEAD_LINES:
            head.append((n, s))
            hb += len(s)
            continue
        tail.append((n, s))
        tb += len(s)
        while len(tail) > TAIL_LINES or tb > TAIL_BYTES:
            tb -= len(tail.popleft()[1])
    return head + list(tail)


def _pieces(s: str):
    """A line as str.splitlines would cut it at carriage returns (progress bars), without its line ending."""
    s = s.rstrip("\n")
    if s.endswith("\r"):
        s = s[:-1]
    if "\r" in s:
        yield from s.split("\r")
    else:
        yield s


def iter_log(path):
    """A log file's lines, streamed, whatever its bytes (binary, UTF-16, NULs, lines of any length: each is cut at
    MAX_LINE characters)."""
    with open(path, "rb") as fh:
        bom = fh.read(2)
        fh.seek(0)
        if bom in (b"\xff\xfe", b"\xfe\xff"):
            text = io.TextIOWrapper(fh, encoding="utf-16", errors="replace", newline="")
            read = text.readline
        else:
            text = None
            read = fh.readline
        while True:
            chunk = read(MAX_LINE)
            if not chunk:
                return
            nl = "\n" if text is not None else b"\n"
            whole = chunk.endswith(nl) or len(chunk) < MAX_LINE
            while not whole:                        # skip the rest of an overlong line
                more = read(1 << 20)
                whole = not more or more.endswith(nl)
            line = chunk if text is not None else chunk.decode("utf-8", "replace")
            yield from _pieces(line)


def read_log(path) -> list[str]:
    """A log file as text lines, whatever its bytes (binary, another encoding, NULs)."""
    return list(iter_log(path))


def triage_lines(lines, kernel=None) -> Triage:
    """Triage engine log lines; ``kernel`` are kernel-log (dmesg / journalctl -k) lines, evidence for OOM kills.

    A log with several engine starts (a unit's journal across restarts and deploys) is triaged run by run from the
    latest: the answer is the latest run that shows how it ended; earlier runs never shadow it."""
    recs = normalise(window(lines))
    starts = [i for i, r in enumerate(recs) if RUN_START.search(r.text)]
    cuts = [0] + [i for i in starts if i > 0]
    res = None
    for a, b in reversed(list(zip(cuts, cuts[1:] + [len(recs)]))):
        res = decide(recs[a:b], kernel)
        if res.outcome != "no-exception-found":
            return res
    return res if res is not None else decide([], kernel)


def iter_logs(paths):
    """The lines of several log files, one after another, streamed."""
    for p in paths:
        yield from iter_log(p)


def _decoded(chunk: bytes, n: int):
    for raw in chunk.split(b"\n"):
        for piece in _pieces(raw[:MAX_LINE].decode("utf-8", "replace")):
            n += 1
            yield n, piece


def _file_window(path, n0: int = 0):
    """(line number, line) of the head and the tail of one file, and its line count. A large regular file is not
    read through: its middle's lines are only counted, and its tail is read from the end."""
    size = os.path.getsize(path) if os.path.isfile(path) else None
    with open(path, "rb") as fh:
        small = size is None or size <= 2 * (HEAD_BYTES + TAIL_BYTES) or fh.read(2) in (b"\xff\xfe", b"\xfe\xff")
        if small:
            items = [(n0 + i, s) for i, s in enumerate(iter_log(path), 1)]
            return window(items), (items[-1][0] if items else n0)
        fh.seek(0)
        head = fh.read(HEAD_BYTES)
        cut = head.rfind(b"\n")
        head = head[:cut] if cut >= 0 else head[:MAX_LINE]
        items = list(_decoded(head, n0))[:HEAD_LINES]
        fh.seek(len(head) + (cut >= 0))
        n = n0 + head.count(b"\n") + 1 if cut >= 0 else n0 + 1
        start = size - TAIL_BYTES
        buf = bytearray(1 << 20)                 # the middle: counted in one reused buffer, never kept
        pos = fh.tell()
        while pos < start:
            k = fh.readinto(memoryview(buf)[:min(len(buf), start - pos)])
            if not k:
                break
            n += buf.count(b"\n", 0, k)
            pos += k
        data = fh.read()
    first = data.find(b"\n")
    n += 1 if first >= 0 else 0
    body = data[first + 1:] if first >= 0 else b""
    if body.endswith(b"\n"):
        body = body[:-1]
    items += list(_decoded(body, n))[-TAIL_LINES:] if body else []
    return items, (items[-1][0] if items else n)


def triage_files(paths, kernel=None) -> Triage:
    """Triage log files, each read as its head and tail (a large one never read through)."""
    items: list[tuple[int, str]] = []
    n = 0
    for p in paths:
        mine, n = _file_window(p, n)
        items.extend(mine)
    return triage_lines(window(items) if len(paths) > 1 else items, kernel)


def group_root(per_rank: list[tuple[str, dict]]) -> tuple[str, dict] | None:
    """The rank of a failed serving group whose triage says why: ``per_rank`` is (host, Triage.to_dict()) in rank
    order. A known signature first; then a root cause that is not merely another rank going away (every rank of
    the group reports that once one dies); None when no rank's journal names a root cause."""
    from specdeploy.triage.signatures import RENDEZVOUS
    found = [(h, t) for h, t in per_rank if isinstance(t, dict) and t.get("root_cause")]
    for pick in ([x for x in found if x[1].get("signature")],
                 [x for x in found if not RENDEZVOUS.search(str(x[1]["root_cause"]))], found):
        if pick:
            return pick[0]
    return None
