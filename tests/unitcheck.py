"""Test helpers: read a rendered unit's ExecStart= the way systemd does, and run ``systemd-analyze verify`` on
rendered units. The parser follows systemd.service(5) and systemd.syntax(7): ``%`` specifiers are resolved on the
whole line first, then the line is split into words (double and single quotes, C-style backslash escapes, a lone
``;`` separating commands), then ``$`` variables are expanded in each word. A specifier, escape or variable that
specdeploy never means to write is an assertion error, not a guess."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

CREDENTIALS_VAR = "${CREDENTIALS_DIRECTORY}"
_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
        "'": "'", "s": " "}


def _specifiers(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "%":
            assert s[i + 1:i + 2] == "%", f"unit specifier %{s[i + 1:i + 2]} in {s!r}"
            out.append("%")
            i += 2
            continue
        out.append(s[i])
        i += 1
    return "".join(out)


def _words(s: str) -> list[tuple[str, int, int]]:
    """(word, start, end) of each word of an already specifier-resolved command line."""
    words, i, n = [], 0, len(s)
    while True:
        while i < n and s[i] in " \t":
            i += 1
        if i >= n:
            return words
        assert not (s[i] == ";" and (i + 1 == n or s[i + 1] in " \t")), f"command separator in {s!r}"
        start, word, quote = i, [], None
        while i < n and (quote or s[i] not in " \t"):
            c = s[i]
            if c == "\\":
                e = s[i + 1:i + 2]
                if e == "x":
                    word.append(chr(int(s[i + 2:i + 4], 16)))
                    i += 4
                    continue
                assert e in _ESC, f"escape \\{e} in {s!r}"
                word.append(_ESC[e])
                i += 2
                continue
            if quote is None and c in "\"'":
                quote = c
            elif c == quote:
                quote = None
            else:
                word.append(c)
            i += 1
        assert quote is None, f"unbalanced quote in {s!r}"
        words.append(("".join(word), start, i))


def _variables(word: str) -> str:
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith(CREDENTIALS_VAR, i):
            out.append(CREDENTIALS_VAR)
            i += len(CREDENTIALS_VAR)
        else:
            assert word[i] != "$", f"variable expansion in {word!r}"
            out.append(word[i])
            i += 1
    return "".join(out)


def exec_argv(rvalue: str) -> list[str]:
    """The argv systemd runs for an ``ExecStart=`` value (its ``-``/``@``/``+``/``!``/``:`` prefixes dropped)."""
    s = _specifiers(rvalue.lstrip("-@+!:"))
    return [_variables(w) for w, _, _ in _words(s)]


def unit_exec(unit: str, key: str = "ExecStart") -> str:
    (line,) = [ln for ln in unit.split("\n") if ln.startswith(key + "=")]
    return line[len(key) + 1:]


def have_analyze() -> bool:
    return shutil.which("systemd-analyze") is not None


def verify(units: dict[str, str], tmp: Path) -> str:
    """``systemd-analyze verify`` on ``units`` (file name -> text). verify wants each Exec*= binary to exist, so the
    first word of every Exec*= line is swapped for a stub executable (its argv[0] is what we change, nothing
    else); docker.service, which the docker runtime's unit requires, is a stub too. Returns what verify said
    about these units (warnings included); raises when it failed."""
    d = tmp / "units"
    d.mkdir(parents=True, exist_ok=True)
    stub = tmp / "stub-binary"
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    (d / "docker.service").write_text("[Unit]\nDescription=stub\n[Service]\nExecStart=/bin/true\n")
    for name, text in units.items():
        lines = []
        for ln in text.split("\n"):
            m = re.match(r"(Exec\w+=)([-@+!:]*)(.*)", ln)
            if m:
                raw = m.group(3)
                _, _, end = _words(raw)[0]  # "%%" does not split words: the raw line's first word ends here
                ln = m.group(1) + m.group(2) + str(stub) + raw[end:]
            lines.append(ln)
        (d / name).write_text("\n".join(lines))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", *[str(d / n) for n in units]],
                       capture_output=True, text=True)
    ours = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines()
                     if str(d) in ln or any(n in ln for n in units))
    assert r.returncode == 0, ours or r.stderr
    return ours
