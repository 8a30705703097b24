"""Containers around a log line that are not prefixes: what a web page, a log shipper or a front-end does to the text
itself. Each function takes one line and gives back the line(s) the engine wrote; normalise.py applies them in a loop
(they nest: a shipper's JSON record of a docker JSON record, HTML-escaped on a web page).

- HTML entities and the few tags a page leaves in pasted text (``&quot;``, ``&lt;br&gt;``, ``<span>``);
- JSON records (docker's json-file ``{"log": "...\\n", ...}``, a shipper's ``{"message": ...}``, an HTTP error
  body ``..: 500: {"detail": "..."}``) and quoted messages whose newlines are written out (glog's
  ``] "msg\\n\\nAt:\\n..."``), decoded as JSON strings and split into lines;
- table cells (a front-end's status table, a terminal UI's box drawing): the bars around the cell.

Every input is untrusted: lengths and nesting are bounded by the caller (MAX_LINE, the depth of the loop).
"""
from __future__ import annotations

import html
import json
import re

ENTITY = re.compile(r"&(?:#\d{1,7}|#[xX][0-9a-fA-F]{1,6}|quot|amp|lt|gt|apos|nbsp|#39);")
TAG = re.compile(r"</?(?:span|code|pre|div|p|b|i|em|strong|tt|samp|kbd|font|td|tr|th|table|tbody|li|ul)"
                 r"(?:\s[^<>]{0,300})?>", re.IGNORECASE)
BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
# a JSON string whose content is a log message: "key": "..." (the key names the message field)
MSG_KEY = re.compile(r'"(?:log|message|msg|MESSAGE|textPayload|detail|error|errorMessage|error_message|stderr|output|'
                     r'exception|traceback|reason|status_message|text)"\s*:\s*"')
LEVEL_KEY = re.compile(r'"(?:level|severity|levelname|lvl)"\s*:\s*"(?P<lvl>[A-Za-z]{4,8})"')
ROW = re.compile(r"^\s*[|│┃║]\s?")
ROW_END = re.compile(r"\s*[|│┃║]\s*$")
LEVEL_NAMES = {"error": "ERROR", "err": "ERROR", "fatal": "ERROR", "critical": "ERROR", "crit": "ERROR",
               "warning": "WARNING", "warn": "WARNING", "info": "INFO", "debug": "DEBUG"}
_ESC = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def html_text(line: str) -> str:
    """The text of a line pasted from a web page: entities decoded (until stable: entities can be escaped twice),
    formatting tags removed, ``<br>`` as a newline."""
    for _ in range(4):                               # a page of a page: tags and entities in turn, until stable
        before = line
        if "<" in line and ">" in line:
            line = BR.sub("\n", line)
            line = TAG.sub("", line)
            if line.endswith("\n"):                # the page's line break after the line
                line = line[:-1]
        if "&" in line and ENTITY.search(line):
            line = html.unescape(line)
        if line == before:
            break
    return line


def json_string(s: str, i: int) -> tuple[str, int]:
    """Decode a JSON string's content starting at s[i] (just after its opening quote); tolerant of a truncated
    string and of escapes JSON does not know. Returns (text, index after the closing quote or len(s))."""
    out: list[str] = []
    n = len(s)
    while i < n:
        j = s.find("\\", i)
        q = s.find('"', i)
        if q != -1 and (j == -1 or q < j):
            out.append(s[i:q])
            return "".join(out), q + 1
        if j == -1:
            out.append(s[i:])
            return "".join(out), n
        out.append(s[i:j])
        c = s[j + 1:j + 2]
        if c in _ESC:
            out.append(_ESC[c])
            i = j + 2
        elif c == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", s[j + 2:j + 6] or ""):
            out.append(chr(int(s[j + 2:j + 6], 16)))
            i = j + 6
        else:
            out.append("\\" + c)
            i = j + 2
    return "".join(out), n


def _record(obj: dict) -> list[str] | None:
    """The message lines of a parsed JSON log record, or None when it holds no message field."""
    lvl = next((obj[k] for k in ("level", "severity", "levelname", "lvl") if isinstance(obj.get(k), str)), None)
    for key in ("log", "message", "msg", "MESSAGE", "textPayload", "detail", "error", "errorMessage", "text"):
        v = obj.get(key)
        if isinstance(v, str):
            lines = v[:-1].split("\n") if v.endswith("\n") else v.split("\n")
            tag = LEVEL_NAMES.get(lvl.lower()) if lvl else None
            if tag in ("ERROR", "WARNING") and lines and lines[0]:
                lines[0] = f"{tag}: {lines[0]}"
            return lines
        if isinstance(v, dict):
            inner = _record(v)
            if inner is not None:
                return inner
    return None


def json_lines(text: str) -> list[str] | None:
    """The lines inside a JSON record or a quoted message, or None when ``text`` holds neither (the caller keeps the
    line as it is)."""
    t = text.strip()
    if not t:
        return None
    if t[0] == "{" and t[-1] == "}" and '":' in t:
        try:
            obj = json.loads(t)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            lines = _record(obj)
            if lines is not None:
                return lines
    if t[0] == '"' and len(t) > 1:
        body, end = json_string(t, 1)
        if end >= len(t) - 1 or "\n" in body:
            return body.split("\n")
        return None
    m = MSG_KEY.search(text)
    if m and "\\n" in text[m.end():]:
        body, end = json_string(text, m.end())
        head = text[:m.start()].rstrip()
        if head.endswith("{"):
            head = head[:-1].rstrip()
        lv = LEVEL_KEY.search(text)
        tag = LEVEL_NAMES.get(lv.group("lvl").lower()) if lv else None
        parts = body.split("\n")
        first = f"{head} {parts[0]}".strip() if head and not head.endswith(("{", "[", ",")) else parts[0]
        if tag in ("ERROR", "WARNING"):
            first = f"{tag}: {first}"
        return [first] + parts[1:]
    return None


def table_cell(line: str) -> str:
    """A table row's last cell (a status table's message column, a terminal UI's bordered line): the text without
    the bars around it. Lines that are not rows are returned unchanged."""
    if not ROW.match(line):
        return line
    body = ROW_END.sub("", ROW.sub("", line, count=1), count=1)
    return body
