"""Text from outside shown on a terminal: every control character escaped, so that a log line, an exporter's
label, a file name or an exception's text cannot move the cursor, clear the screen, set the window title, plant a
hyperlink, ring the bell or reorder what follows (bidirectional overrides).

:func:`safe` is the one function; the commands call it where such text reaches stdout or stderr (findings, triage,
status and regate labels, the live view of a deploy, file names). What a terminal would execute is shown as an
escape (``\\x1b``, ``\\u202e``); the text is otherwise unchanged.
"""
from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls and DEL; the Unicode format characters (bidirectional controls, zero-width characters, the
# byte order mark) and the line and paragraph separators that some terminals honour.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff"
                     "\ufff9-\ufffb\U000e0000-\U000e007f]")


def _escape(m: re.Match) -> str:
    c = m.group(0)
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def safe(text: object, newlines: bool = False) -> str:
    """``text`` with every control and format character shown escaped; with ``newlines``, line breaks and tabs
    are kept (a multi-line message), else they are escaped too (a label, a name, one field of a row)."""
    s = text if isinstance(text, str) else str(text)
    if newlines:
        return "\n".join(_UNSAFE.sub(lambda m: "\t" if m.group(0) == "\t" else _escape(m), line)
                         for line in s.split("\n"))
    return _UNSAFE.sub(_escape, s)


def unsafe_chars(text: str) -> list[str]:
    """The characters of ``text`` :func:`safe` would escape, besides newline and tab: what a test asserts absent
    from a command's output."""
    return [c for c in text if c not in "\n\t" and (_UNSAFE.match(c) or unicodedata.category(c) == "Cc")]
