"""The line-format layer: every prefix that engines, containers and log shippers write, turned into records of
(process, rank, timestamp, level, text).

Two kinds of prefix, stripped in a loop because they nest:

- outer prefixes, added around the engine's own line by whatever carried it: docker compose (``vllm-1  | ``),
  ``kubectl logs --prefix`` (``[pod/p/c] ``), stern's ``pod container ``, CI tables and table cells, GKE's logging
  export, docker/CI ISO timestamps, bare times, journald (short, short-precise, short-iso, with or without a PID),
  syslog (RFC 3164 and 5424 headers), markdown quotes and pasted line numbers;
- message headers, written by the process itself: a process prefix (vLLM V1 ``(Worker_TP3 pid=1) ``, V0
  ``(VllmWorkerProcess pid=1) ``, Ray ``(RayWorkerWrapper pid=1, ip=...) ``), a stage tag (``[Stage-1] ``), vLLM's
  ``LEVEL mm-dd hh:mm:ss [file.py:N] `` and its bare ``[file.py:N] `` / ``file.py:N] `` forms, SGLang's
  ``[date TPn] ``, uvicorn's ``ERROR:    ``, KServe's logger, Dynamo's ``LEVEL module::path: ``, torch's
  ``[rank0]:`` and glog's ``[E... file.cpp:N] `` / ``E1027 hh:mm:ss.us pid file.py:N] ``; Python logging's
  ``date - name - LEVEL - `` and ``[date] LEVEL: ``, loguru's ``date | LEVEL | where | ``, Ray Serve's
  ``LEVEL date name file.py:N - ``, ``[LEVEL] [component] ``, CANN's ``[ERROR] MOD(pid,proc):date [file:N]`` plog
  and ``[ERROR] date (PID:n, ...)`` records, a status table's ``UNAVAILABLE: Internal: ``.

Around both, what is not a prefix: HTML entities and tags from a web page, JSON records and quoted messages with
their newlines written out, table bars (unwrap.py). A line is unwrapped, then its prefixes are stripped, and what
a JSON record or a quoted message held is read again as lines of its own, in a bounded loop.

ANSI colours are removed in their three forms: with the ESC byte, without it, and written out as text (``^[[``,
``#033[``, ``\\x1b[``, ``\\u001B[``). New formats belong here, as one more pattern in one of these lists; the rewrap
property test in tests/unit/triage/test_triage_formats.py wraps every corpus log in every form and expects the same
answer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from specdeploy.triage.unwrap import MSG_KEY, ROW, ROW_END, html_text, json_lines, table_cell

MAX_LINE = 20_000     # characters per line looked at

ANSI = re.compile(r"(?:\x1b|\^\[|#033|\\(?<!\\\\)(?:033|x1b|e|u001b))\[[0-9;]{0,16}[A-Za-z]|"
                  r"\x1b[()][A-Z0-9]|"
                  r"(?=\[)(?<!x1b)(?<!u001b)(?<!033)(?<!\\e)(?:\[(?:\d{1,3}(?:;\d{1,3})*)?m(?=[\s(\[]|$)|\[\d{1,3}(?:;\d{1,3})*m)",
                  re.IGNORECASE)
DATE = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d)?(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
OUTER = [
    re.compile(r"^>\s?"),                                                    # markdown quote
    re.compile(r"^\s*\d{1,6}\s+(?=[(\[])"),                                  # pasted with line numbers
    re.compile(r"^\[pod/[^\]\s/]+/[^\]\s]+\]\s?"),                           # kubectl logs --prefix
    re.compile(r"^[a-z0-9][a-z0-9.\-]{0,200}-[a-z0-9]{6,10}-[a-z0-9]{5}\s[a-z0-9][a-z0-9\-]{0,62}\s(?=\S)"),  # stern
    re.compile(r"^[A-Za-z0-9][\w.\-/]{0,62}\s*\|\s?"),                      # docker compose: "vllm-1  | "
    re.compile(r"^\s*[|│┃║]\s?"),                                            # CI tables, table cells: "  | "
    re.compile(r"^(?:INFO|ERROR|WARNING|DEFAULT|DEBUG|NOTICE)\s+\d{4}-\d\d-\d\dT[\d:.]+Z?\s+(?:\[[^\]]{0,200}\]\s*)?"),
    re.compile(r"^<\d{1,3}>1 \S+ \S+ \S+ \S+ \S+ (?:-|(?:\[[^\]]{0,300}\])+) ?"),   # syslog RFC 5424
    re.compile(r"^<\d{1,3}>(?=[A-Z][a-z]{2} [ \d]\d \d\d:)"),                  # syslog RFC 3164 priority
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ [^:\[]+\[\d+\]: "),  # journald short(-precise)
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ kernel: (?:\[\s*\d+\.\d+\] )?"),
    re.compile(r"^\d{4}-\d\d-\d\dT\S+ \S+ [^:\[]+\[\d+\]: "),                 # journald short-iso
    re.compile(r"^\d{4}-\d\d-\d\dT\S+ \S+ kernel: (?:\[\s*\d+\.\d+\] )?"),
    re.compile(r"^\s*\[?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s"),  # ISO (docker -t, CI)
    re.compile(r"^\[?\d\d:\d\d:\d\d(?:[.,]\d{1,9})?\]?\s"),                   # a bare time of day
    re.compile(r"^\[\s*\d{1,9}\.\d{6}\]\s"),                                    # dmesg / short-monotonic
]
OUTER_ANY = re.compile("|".join(f"(?:{rx.pattern})" for rx in OUTER))
PROC = re.compile(r"^\((?P<body>[A-Za-z_][\w .:=,\-/]{0,120}?)\)\s?")
PROC_ANY = re.compile(r"\((?:[A-Za-z_][\w .=\-]{0,60}?) pid=\d+(?:, ip=[^)]*)?\) ")
STAGE = re.compile(r"^\[(?P<stage>Stage-\d+)\]\s?")
LEVELS = "DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
# message headers: (name, pattern); named groups lvl / ts / rank / tags are read when present
HEADERS = [
    ("bracket-date-tp", re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"
                          r"(?P<tags>(?: (?:DP|TP|PP|EP|CP|ATTN_DP)\d+)*)\]\s?")),
    ("level-date-src", re.compile(rf"^(?P<lvl>{LEVELS})\s+(?P<ts>\d\d-\d\d \d\d:\d\d(?::\d\d(?:\.\d+)?)?)\s+"
                        r"(?:\[[^\]\[]{1,120}[\]\[]{1,2}|[\w./\-]{1,120}\.py:\d+\])\s?")),
    ("level-fulldate", re.compile(rf"^(?P<lvl>{LEVELS})\s+(?P<ts>{DATE})\s+(?:(?:[\w.\-]+\s+){{0,3}}"
                                  r"(?:[\w.<>\-]+\.py:\d+|\d+)\s+-{1,2}\s+|\[[^\]]{0,200}\]\s*)?")),
    ("kserve", re.compile(rf"^(?P<ts>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+) \d+ [\w.\-]+ (?P<lvl>{LEVELS}) "
                          r"\[[^\]]{0,200}\]\s?")),
    ("loguru", re.compile(rf"^(?P<ts>{DATE}) \| (?P<lvl>{LEVELS}|SUCCESS|TRACE)\s*\| [^|]{{1,200}}? \| ")),
    ("py-logging", re.compile(rf"^\[?(?P<ts>{DATE})\]?(?:\s+-)?\s+(?:[\w.\-]+\s+(?:-\s+)?)?(?P<lvl>{LEVELS})"
                              r"(?:\s+-\s+|:\s+|\s+(?!\d\d-\d\d \d\d:|\d{4}-\d\d-\d\d))")),  # not a header's level
    ("py-logging-date", re.compile(rf"^\[(?P<ts>{DATE})\]\s")),
    ("bracket-level", re.compile(rf"^\[(?P<lvl>{LEVELS})\]\s+(?:\[[\w.:\-]{{1,80}}\]\s+)?(?!\d{{4}}-)")),
    ("cann-record", re.compile(r"^\[(?P<lvl>ERROR|WARNING|INFO|DEBUG|EVENT)\] (?:[A-Z_]{2,16}\(\d+,[^)]{0,80}\):)?"
                               r"(?P<ts>\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d(?:\.\d+)*)\s*(?:\(PID:\d+[^)]{0,80}\)\s*|"
                               r"\[[\w.\-]+:\d+\]\d*\s*)?")),
    ("component-date", re.compile(r"^\[[A-Z][\w ().\-]{0,40}\]\s+(?=\d{4}-\d\d-\d\d)")),
    ("status-cell", re.compile(r"^(?:UNAVAILABLE|UNHEALTHY|FAILED|FAILED_PRECONDITION): +"
                               r"(?:(?:Internal|Invalid argument|Not found|Unknown|Unavailable|Internal error): +)?")),
    ("uvicorn", re.compile(rf"^(?P<lvl>{LEVELS}):\s+")),
    ("module", re.compile(rf"^(?P<lvl>TRACE|{LEVELS})\s+[A-Za-z_][\w.]*(?:::[\w.<>]+)*:\s?")),   # Dynamo, Rust tracing
    ("bare-src", re.compile(r"^\[?[\w./\-]{1,120}\.py:\d+\]\s?")),
    ("torch-rank", re.compile(r"^\[rank(?P<rank>\d+)\]:\s?")),
    ("glog", re.compile(r"^\[(?P<glvl>[EWIF])(?P<ts>(?:\d{3,4})?(?: [\d:.]+)?) ?[\w.\-]+\.\w{1,4}:\d+\]\s?")),
    ("glog-plain", re.compile(r"^(?P<glvl>[EWIF])(?P<ts>\d{4} \d\d:\d\d:\d\d\.\d+)\s+\d+ [\w.\-]+:\d+\]\s?")),
]
GLOG_LEVEL = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "FATAL"}
TB_MID = re.compile(r"(?<=\S)\s*(?=Traceback \(most recent call last\):)")
RANK_IN = re.compile(r"(?:(?<![A-Za-z])TP|rank[= ]?|Rank )(\d+)")
RANK_TXT = re.compile(r"^\[(?:PG [^\]]*?)?Rank (\d+)\]")
CR = re.compile(r"(?:\^M|\r)+$")
QUOTED = re.compile(r'\{"|"\s*:\s*"|^\W{0,4}"|\]\s+"')   # a JSON record or a quoted message in the line
JSONISH = re.compile(r'^\W{0,4}[{"]|\]\s+"|' + MSG_KEY.pattern)     # decoded before it is split
UNWRAP_DEPTH = 4      # JSON in JSON in a quoted message ...: deeper than this is read as text
MAX_PIECES = 400      # lines one input line may unfold into


@dataclass
class Record:
    n: int                 # 1-based line number in the input
    proc: str | None
    rank: int | None
    ts: str | None
    text: str
    raw: str
    hdr: bool = False      # the line carried its own log header (a new message, not a continuation)
    level: str | None = None


def _outer(line: str) -> str:
    for _ in range(10):
        if ROW.match(line):                      # a table cell (also inside a prefix, or a cell in a cell)
            line = table_cell(line)
            continue
        m = OUTER_ANY.match(line)
        if not m or not m.end():
            break
        line = line[m.end():]
    return line


def _split_flat(line: str) -> list[str]:
    """Lines pasted without their newlines: split before every worker prefix after the first."""
    if line.count("pid=") < 2:
        return [line]
    starts = [m.start() for m in PROC_ANY.finditer(line)]
    if len(starts) < 2:
        return [line]
    if ROW_END.search(line):                     # a cell's closing bar belongs to the whole line, not its last piece
        line = ROW_END.sub("", line, count=1)
        starts = [m.start() for m in PROC_ANY.finditer(line)]
    cuts = [0] + [s for s in starts if s > 0]
    return [line[a:b].strip() for a, b in zip(cuts, cuts[1:] + [len(line)]) if line[a:b].strip()]


class _Header:
    __slots__ = ("proc", "rank", "ts", "level", "hdr", "midline")

    def __init__(self):
        self.proc = self.rank = self.ts = self.level = None
        self.hdr = self.midline = False


_BY_NAME = dict(HEADERS)
_CANDIDATES = {
    "[": [(n, _BY_NAME[n]) for n in ("bracket-date-tp", "py-logging", "py-logging-date", "cann-record", "bracket-level",
                                     "component-date", "bare-src", "torch-rank", "glog")],
    "A": [(n, _BY_NAME[n]) for n in ("level-date-src", "level-fulldate", "status-cell", "uvicorn", "module",
                                     "glog-plain", "bare-src")],
    "0": [(n, _BY_NAME[n]) for n in ("kserve", "loguru", "py-logging", "bare-src")],
    "a": [("bare-src", _BY_NAME["bare-src"])],
}
PROC_NAME = re.compile(r",? ?(?:pid|ip)=[^,)]*")
SGL_TP = re.compile(r"TP(\d+)")


def _candidates(c: str):
    if c == "[":
        return _CANDIDATES["["]
    if "A" <= c <= "Z":
        return _CANDIDATES["A"]
    if c.isdigit():
        return _CANDIDATES["0"]
    return _CANDIDATES["a"] if c.isalpha() or c in "_./-" else ()


def _headers(text: str, h: _Header) -> str:
    """Strip the message headers at the start of ``text`` (in any order, nested), filling ``h``."""
    for k in range(12):
        c = text[:1]
        if c in (" ", "\t") and k:              # spaces between two headers (a tag, then the engine's own header)
            s2 = text.lstrip()
            if s2 and any(rx.match(s2) for _, rx in _candidates(s2[0])):
                text, c = s2, s2[:1]
        if c == "(" or (c == " " and text.lstrip()[:1] == "("):
            stripped = text.lstrip()
            m = PROC.match(stripped)
            if m and ("pid=" in m.group("body") or m.group("body") in ("raylet", "pid")):
                body = m.group("body")
                h.proc = (PROC_NAME.sub("", body).strip() or body) if h.proc is None else h.proc
                r = RANK_IN.search(body)
                h.rank = int(r.group(1)) if r and h.rank is None else h.rank
                text = _outer(stripped[m.end():])
                if text[:1] == " " and text.lstrip()[:1] == "[":   # a header after the prefix's colour codes
                    text = text.lstrip()
                continue
        if c == "[":
            m = STAGE.match(text)
            if m:                                  # a stage tag names the process only when nothing else does
                h.proc = h.proc or m.group("stage")
                text = text[m.end():]
                continue
        for name, rx in _candidates(c):
            m = rx.match(text)
            if not m:
                continue
            gd = m.groupdict()
            if name == "bracket-date-tp":  # its tracebacks start mid-line
                tags = gd["tags"].strip()
                h.proc = h.proc or (tags or "main")
                r = SGL_TP.search(tags)
                h.rank = int(r.group(1)) if r else h.rank
                h.midline = True
            if gd.get("rank") is not None:
                h.rank = int(gd["rank"])
                h.proc = h.proc or f"rank{h.rank}"
            if gd.get("ts"):
                h.ts = h.ts or gd["ts"].strip() or None
            lvl = gd.get("lvl") or GLOG_LEVEL.get(gd.get("glvl") or "")
            if lvl:
                h.level = "WARNING" if lvl == "WARN" else lvl
            h.hdr = True
            text = text[m.end():]
            break
        else:
            m = OUTER_ANY.match(text) if c else None
            if m and m.end():                      # a container prefix inside a header (a wrapper's own logger)
                text = table_cell(text) if ROW.match(text) else text[m.end():]
                continue
            return text
    return text


def _clean(raw: str) -> str:
    """A raw line without what is not text: NULs, HTML entities and tags, ANSI colours, carriage returns."""
    # HTML around JSON or a quoted message is decoded first; HTML inside them after they are (the lines they hold
    # are cleaned again)
    clean = html_text(raw) if ("&" in raw or "<" in raw) and not QUOTED.search(raw) else raw
    clean = ANSI.sub("", clean) if "[" in clean else clean
    if clean.endswith(("^M", "\r")):
        clean = CR.sub("", clean)
    return clean


def _lines(clean: str) -> list[str]:
    """A cleaned line as lines: a page's <br> may have cut it; what is empty after the cut is the page's, not the
    log's."""
    if "\n" not in clean:
        return [clean]
    return [p for p in clean.split("\n") if p.strip(" \t|│┃║")] or [""]


class _Unfold:
    """Records of one input line, which may unfold into many (JSON records, quoted messages), bounded in count."""

    def __init__(self, out: list[Record], n: int, raw: str, carry):
        self.out, self.n, self.raw, self.carry, self.left = out, n, raw, carry, MAX_PIECES

    def piece(self, piece: str, parent: _Header | None = None, depth: int = 0, first: bool = False) -> None:
        if self.left <= 0:
            return
        h = _Header()
        piece = _outer(piece)
        if piece.endswith(("^M", "\r")):          # a carriage return written out, inside a cell or a record
            piece = CR.sub("", piece)
        text = _headers(piece, h)
        if text.endswith(("^M", "\r")):
            text = CR.sub("", text)
        if parent is not None:                   # a line of a record: the record's process, time and level
            h.proc = h.proc or parent.proc
            h.rank = parent.rank if h.rank is None else h.rank
            h.ts = h.ts or parent.ts
            h.level = h.level or parent.level
            h.hdr = h.hdr or (first and parent.hdr)    # the record's first line is the record's own message
        if depth < UNWRAP_DEPTH and text and ('":' in text or text.lstrip()[:1] in ('"', "{")):
            subs = json_lines(text)
            if subs is not None and subs != [text]:
                k = 0
                for sub in subs[:self.left]:
                    for line in _lines(_clean(sub)):
                        line = _outer(line)
                        for p in ([line] if '"' in line and JSONISH.search(line) else _split_flat(line)):
                            self.piece(p, h, depth + 1, first=k == 0)
                            k += 1
                return
        rt = RANK_TXT.match(text)
        if rt and h.rank is None:
            h.rank = int(rt.group(1))
        if h.midline:
            self.carry = (h.proc, h.rank, h.ts)
        elif h.proc is None and not h.hdr and self.carry[0] is not None:
            h.proc, h.rank, h.ts = self.carry          # a continuation line of the last SGLang record
        elif h.proc is not None or h.hdr:
            self.carry = (None, None, None)
        parts = TB_MID.split(text, maxsplit=1) if "Traceback (most recent call last)" in text else [text]
        for part in parts:
            self.out.append(Record(self.n, h.proc, h.rank, h.ts, part, self.raw, h.hdr, h.level))
            self.left -= 1


def normalise(lines) -> list[Record]:
    """Every line as a record; SGLang continuation lines inherit their record's process. ``lines`` holds strings,
    bytes, or (line number, string) pairs (a window of a longer file keeps its line numbers)."""
    out: list[Record] = []
    carry: tuple[str | None, int | None, str | None] = (None, None, None)
    for n, raw in enumerate(lines, 1):
        if isinstance(raw, tuple):
            n, raw = raw
        if not isinstance(raw, str):
            raw = bytes(raw).decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
        raw = raw.rstrip("\r\n")[:MAX_LINE].replace("\x00", "")
        unfold = _Unfold(out, n, raw, carry)
        for line in _lines(_clean(raw)):
            line = _outer(line)
            for piece in ([line] if '"' in line and JSONISH.search(line) else _split_flat(line)):
                unfold.piece(piece)
        carry = unfold.carry
    return out
