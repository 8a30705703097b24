"""Quoting, one function per destination. Every value specdeploy writes into a file a host reads goes through
the function for where it lands; nothing is interpolated into those files unquoted.

- an argument of a unit's ``ExecStart=`` line: :func:`exec_arg` / :func:`exec_line` (systemd unquotes, reads C
  escapes, ``%`` specifiers and ``$`` variables);
- any other unit setting's value: :func:`unit_value` (systemd reads one line);
- a line of an ``EnvironmentFile=``: :func:`environment_file_line` (shell-like quotes and backslashes);
- a line of a ``docker run --env-file`` file: :func:`docker_env_file_line` (docker takes everything after ``=``);
- a shell command line: :func:`shell_arg` / :func:`shell_line`;
- a YAML scalar in a template: :func:`yaml_scalar` (a JSON string, which YAML reads as a double-quoted
  scalar), never bare interpolation; a whole YAML document is ``yaml.safe_dump``'s.

The schema refuses control characters in every variable already; these functions refuse them again where a
value that did not come from the schema could carry one, so a line cannot end early.
"""
from __future__ import annotations

import re
import shlex
import unicodedata


def _one_line(value: str, what: str) -> str:
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            raise ValueError(f"{what} {value!r}: holds the control character U+{ord(ch):04X}, which would end its "
                             "line early")
    return value


def exec_arg(arg: str) -> str:
    """One argument of an ``ExecStart=`` line: ``%`` and ``$`` escaped (bar ``${CREDENTIALS_DIRECTORY}``, the
    directory of a LoadCredential=, which systemd is meant to expand), quoted unless it is made of characters
    systemd takes literally."""
    _one_line(arg, "ExecStart argument")
    s = arg.replace("%", "%%")
    s = re.sub(r"\$(?!\{CREDENTIALS_DIRECTORY\})", "$$", s)
    if s and re.fullmatch(r"[A-Za-z0-9_@%+=:,./${}-]+", s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(argv: list[str]) -> str:
    return " ".join(exec_arg(a) for a in argv)


def unit_value(value) -> str:
    """The value of a unit setting that is not a command line (``TimeoutStartSec=``, ``User=``, paths): one
    line, no surrounding white space."""
    s = _one_line(str(value), "unit setting")
    if s != s.strip() or not s:
        raise ValueError(f"unit setting {s!r}: empty, or white space around it")
    return s


def environment_file_line(key: str, value: str) -> str:
    """One line of a systemd ``EnvironmentFile=`` (which unquotes and unescapes)."""
    _one_line(key, "environment variable name")
    _one_line(value, f"environment variable {key}")
    if re.fullmatch(r"[A-Za-z0-9_./:,=@+-]*", value):
        return f"{key}={value}"
    return f'{key}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def docker_env_file_line(key: str, value: str) -> str:
    """One line of a ``docker run --env-file`` file: docker takes everything after the first ``=`` verbatim
    (no quotes, no escapes), so a value is written as is and cannot hold a newline."""
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in key + value):
        raise ValueError(f"environment variable {key}: docker --env-file cannot carry a newline or another "
                         "control character; remove it from specdeploy_engine_env")
    return f"{key}={value}"


def parse_env_file(text: str, consumer: str) -> dict[str, str]:
    """Read an env file the way ``consumer`` (``systemd`` or ``docker``) does; used to check what we render."""
    out = {}
    for line in text.split("\n"):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.lstrip().partition("=")
        if consumer == "systemd":
            value = "".join(shlex.split(value, posix=True)) if value else ""
        out[key] = value
    return out


def shell_arg(arg: str) -> str:
    """One word of a POSIX shell command line."""
    return shlex.quote(arg)


def shell_line(argv: list[str]) -> str:
    return " ".join(shell_arg(a) for a in argv)


def yaml_scalar(value, quote: bool = True) -> str:
    """One scalar of a YAML template: a JSON string (a valid YAML double-quoted scalar), or with
    ``quote=False`` the bare value when YAML reads it back as the same string."""
    import json

    import yaml
    s = str(value)
    if not quote and re.fullmatch(r"[A-Za-z0-9_./-]+", s) and yaml.safe_load(s) == s:
        return s
    return json.dumps(s)
