"""The one way specdeploy reads a peer over HTTP (an engine, an exporter, Prometheus): every answer is untrusted.

``fetch`` bounds a request by a total deadline (connect, headers and body together, not per socket read: a peer
that trickles one byte a second is cut off at the deadline) and by a size cap (a ``Content-Length`` over the cap
is refused before the body is read; a body without one is read in pieces and dropped as soon as it passes the
cap, so an oversized page is never held whole). ``text`` and ``json_object`` add content checks: status 200, no
HTML error page, strict UTF-8, no binary, a JSON object. Every failure is a ``PeerError`` (an ``OSError``) whose
``reason`` is one short line for a table cell or an error message. Peers are reached directly, never through an
HTTP proxy from the environment.
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse
from typing import Any

MAX_BYTES = 8 << 20  # 8 MiB: far above a real /metrics page or query answer, far below a unit's MemoryMax
CHUNK = 64 << 10


class PeerError(OSError):
    """A peer that did not answer, or answered something unusable; ``reason`` says which, in a few words."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"{url}: {reason}")
        self.url, self.reason = url, reason


class Answer:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes):
        self.status, self.headers, self.body = status, headers, body


def fetch(url: str, deadline_s: float, max_bytes: int = MAX_BYTES, headers: dict | None = None,
          body: bytes | None = None) -> Answer:
    """GET (POST when ``body`` is given) ``url``, finished within ``deadline_s`` seconds and ``max_bytes`` of body
    or refused. Any HTTP status comes back; the callers below decide what they accept."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise PeerError(url, "not an http(s) URL")
    if not deadline_s > 0:
        raise PeerError(url, "no time left")
    end = time.monotonic() + deadline_s
    try:
        port = u.port
    except ValueError:
        raise PeerError(url, "bad port") from None
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, port, timeout=deadline_s)
    expired = threading.Event()
    held: list[socket.socket] = []  # the connected socket: http.client drops conn.sock once a response will close

    def cut():  # at the deadline, whatever the connection is blocked in (headers, body) returns
        expired.set()
        for sock in held:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(deadline_s, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()  # bounded by the connection's timeout, the whole deadline
        held.append(conn.sock)
        if expired.is_set():
            raise PeerError(url, f"no complete answer within {deadline_s:g} s")
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        length = resp.getheader("content-length")
        if length is not None and length.strip().isdigit() and int(length) > max_bytes:
            raise PeerError(url, f"answer of {int(length):,} bytes is over the {max_bytes:,}-byte limit")
        parts, size = [], 0
        while True:
            left = end - time.monotonic()
            if left <= 0 or expired.is_set():
                raise PeerError(url, f"no complete answer within {deadline_s:g} s")
            if resp.isclosed():  # the whole body is in
                break
            try:
                held[0].settimeout(left)
            except OSError:
                pass
            piece = resp.read(CHUNK)
            if not piece:
                break
            size += len(piece)
            if size > max_bytes:
                raise PeerError(url, f"answer over the {max_bytes:,}-byte limit")
            parts.append(piece)
        if expired.is_set():  # the cut may make a read return early and look like the end of the body
            raise PeerError(url, f"no complete answer within {deadline_s:g} s")
        return Answer(resp.status, resp.headers, b"".join(parts))
    except PeerError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if expired.is_set() or isinstance(exc, socket.timeout):
            raise PeerError(url, f"no complete answer within {deadline_s:g} s") from None
        raise PeerError(url, _why(exc)) from None
    finally:
        timer.cancel()
        conn.close()
        for sock in held:
            sock.close()


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return "unknown host"
    if isinstance(exc, http.client.HTTPException):
        return f"not an HTTP answer ({type(exc).__name__})"
    return str(getattr(exc, "strerror", None) or exc or type(exc).__name__)[:120]


def _checked(url: str, ans: Answer) -> str:
    if ans.status != 200:
        return f"HTTP {ans.status}" + (" (an HTML error page)" if _html(ans) else "")
    if _html(ans):
        return "an HTML page, not the expected answer"
    if b"\x00" in ans.body:
        return "binary data, not text"
    return ""


def _html(ans: Answer) -> bool:
    ctype = (ans.headers.get("content-type") or "").lower()
    head = ans.body[:256].lstrip().lower()
    return "html" in ctype or head.startswith((b"<!doctype html", b"<html"))


def text(url: str, deadline_s: float, max_bytes: int = MAX_BYTES, headers: dict | None = None) -> str:
    """A 200 text answer (a /metrics page), strict UTF-8."""
    ans = fetch(url, deadline_s, max_bytes, headers)
    why = _checked(url, ans)
    if why:
        raise PeerError(url, why)
    try:
        return ans.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PeerError(url, f"not UTF-8 text (byte {exc.start})") from None


def json_object(url: str, deadline_s: float, max_bytes: int = MAX_BYTES, headers: dict | None = None,
                body: bytes | None = None) -> dict[str, Any]:
    """A 200 answer holding one JSON object."""
    ans = fetch(url, deadline_s, max_bytes, headers, body)
    why = _checked(url, ans)
    if why:
        raise PeerError(url, why)
    from specdeploy.values.bounded import Refused, loads
    try:
        data = loads(ans.body.decode("utf-8"))
    except Refused as exc:
        raise PeerError(url, f"JSON that {exc}") from None
    except (UnicodeDecodeError, ValueError):
        raise PeerError(url, "not JSON") from None
    if not isinstance(data, dict):
        raise PeerError(url, f"a JSON {type(data).__name__}, not an object")
    return data


def ok(url: str, deadline_s: float, max_bytes: int = 1 << 20) -> tuple[bool, str]:
    """(answered 200, body as text with bad bytes replaced), for health probes; never raises."""
    try:
        ans = fetch(url, deadline_s, max_bytes)
    except PeerError:
        return False, ""
    return ans.status == 200, ans.body.decode("utf-8", "replace")


def url_host(address: str) -> str:
    """``address`` as the host part of a URL, of host:port or of a Prometheus target: an IPv6 address in brackets
    (the one place this rule is written)."""
    import ipaddress
    a = str(address)
    try:
        return f"[{a}]" if isinstance(ipaddress.ip_address(a), ipaddress.IPv6Address) else a
    except ValueError:
        return a


def host_port(address: str, port: int | str) -> str:
    """ADDRESS:PORT as a URL and Prometheus's static_configs take it (``[v6]:port`` for IPv6)."""
    return f"{url_host(address)}:{port}"
