"""Checks of command-line values that name the option and the fix, so bad input never ends in a traceback."""
from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from specdeploy.values.errors import Finding, SpecdeployError


def _err(option: str, message: str, fix: str) -> SpecdeployError:
    return SpecdeployError([Finding("error", option, message, fix)])


MAX_INPUT = 64 << 20  # bytes of a file given on the command line (results, reports, prompts, saved tool output)


def read_text(path: Path, option: str, what: str = "a text file", max_bytes: int = MAX_INPUT) -> str:
    """A UTF-8 text file of at most ``max_bytes``; a FIFO, device or directory is refused without blocking."""
    from specdeploy.values.bounded import Refused, read_regular
    if not path.exists():
        raise _err(option, f"{path} does not exist", f"give {what}")
    if not path.is_file():
        raise _err(option, f"{path} is not a file", f"give {what}")
    try:
        return read_regular(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError:
        raise _err(option, f"{path} is not UTF-8 text", f"give {what}") from None
    except Refused as exc:
        raise _err(option, f"{path} {exc}", f"give {what}") from None
    except OSError as exc:
        raise _err(option, f"{path} cannot be read ({exc.strerror or exc})", "make it readable") from None


def read_json(path: Path, option: str, what: str = "a JSON file") -> Any:
    """A JSON file within read_text's bounds, nested at most ``bounded.MAX_DEPTH`` levels."""
    from specdeploy.values.bounded import Refused, loads
    text = read_text(path, option, what)
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise _err(option, f"{path} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                   f"give {what}") from None
    except Refused as exc:
        raise _err(option, f"{path} {exc}", f"give {what}") from None


def read_json_object(path: Path, option: str, what: str = "a JSON object file") -> dict:
    data = read_json(path, option, what)
    if not isinstance(data, dict):
        raise _err(option, f"{path} holds a JSON {type(data).__name__}, not an object", f"give {what}")
    return data


def existing_dir(path: Path, option: str, what: str = "an existing directory") -> Path:
    if not path.is_dir():
        raise _err(option, f"{path} {'is not a directory' if path.exists() else 'does not exist'}", f"give {what}")
    return path


def http_url(url: str, option: str) -> str:
    u = urlparse(url)
    try:
        port = u.port
    except ValueError:
        port = -1
    if u.scheme not in ("http", "https") or not u.hostname or port == -1:
        raise _err(option, f"'{url}' is not an http(s) URL", "give a URL such as http://127.0.0.1:8000")
    return url.rstrip("/")


def listen_address(value: str, option: str) -> tuple[str, int]:
    """ADDR:PORT (``[v6]:PORT`` for IPv6) with a real IP address or hostname and a port in 1..65535."""
    host, sep, port_s = value.rpartition(":")
    host = host.strip("[]")
    fix = "give ADDR:PORT such as 0.0.0.0:9450 or 127.0.0.1:9450"
    if not sep or not host or not port_s.isdigit():
        raise _err(option, f"'{value}' is not ADDR:PORT", fix)
    port = int(port_s)
    if not 0 < port < 65536:
        raise _err(option, f"port {port} is outside 1-65535", fix)
    looks_numeric = all(c.isdigit() or c in ".:" for c in host)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if looks_numeric or not all(part.isalnum() or "-" in part for part in host.split(".")):
            raise _err(option, f"'{host}' is not an IP address or host name", fix) from None
    return host, port


def finite(value: float, option: str, minimum: float = 0.0, positive: bool = False,
           maximum: float = float("inf")) -> float:
    """A float option that is a real number: not NaN, not infinite, at least ``minimum`` (above it when
    ``positive``) and at most ``maximum``. NaN compares false with everything, so a plain ``<`` check would let
    it through."""
    import math
    bound = f"above {minimum:g}" if positive else f"at least {minimum:g}"
    if math.isfinite(maximum):
        bound += f" and at most {maximum:g}"
    if not math.isfinite(value) or value < minimum or (positive and value == minimum) or value > maximum:
        raise _err(option, f"{value!r} is not a finite number {bound}", f"give {option} a number {bound}")
    return value


_SPAN = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(value: str, option: str) -> float:
    """A duration such as 90s, 30m, 1h or 1h30m, in seconds; anything else (an unknown unit, a bare number, a
    trailing word) is refused, naming the option."""
    import re
    v = value.strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", v)
    if not v or "".join(n + u for n, u in parts) != v:
        raise _err(option, f"'{value}' is not a duration", "give a number and a unit (ms, s, m, h, d, w), "
                   "such as 30m, 1h or 1h30m")
    total = sum(float(n) * _SPAN[u] for n, u in parts)
    if total <= 0:
        raise _err(option, f"'{value}' is no time at all", "give a duration above zero, such as 30m or 1h")
    return total


def label_values(values: list[str] | None, option: str, limit: int = 256) -> list[str]:
    """Values of a Prometheus label asked for on the command line (a host, serving group or release to drill down
    to): printable text of at most 253 characters each, at most ``limit`` of them. They are matched exactly."""
    out = []
    for v in values or []:
        if not v or len(v) > 253 or not v.isprintable():
            raise _err(option, f"{v[:40]!r} is not a label value", "give a name as the inventory or "
                       "`specdeploy status` shows it (printable, at most 253 characters)")
        out.append(v)
    if len(out) > limit:
        raise _err(option, f"{len(out)} values given", f"give at most {limit}; a release or group selects many hosts")
    return out
