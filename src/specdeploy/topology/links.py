"""Which ranks of a serving group are joined to their leader, read on the leader's host from the kernel's own
connection tables.

Every rank of a running group holds TCP connections to its leader's rendezvous port for as long as it runs: the
engines keep the process group's store there (vLLM's ``--master-port`` TCPStore; read off the real 0.32.0 CPU build:
two ESTABLISHED connections on the leader while a two-rank group served, the leader's own and the follower's, and
one left a second after the follower was killed). A rank whose address holds none has gone away. The leader's
engine does not notice that until its next step (its health check still answers), so this is how the exporter, and
through it ``specdeploy status`` and the alert, see a group that cannot serve.
"""
from __future__ import annotations

import ipaddress
import socket
import threading

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"
RESOLVE_TIMEOUT_S = 1.0


def _address(field: str) -> tuple[str, int] | None:
    """``0100007F:1F90`` (or 32 hex digits for IPv6) -> ("127.0.0.1", 8080); IPv4-mapped IPv6 as IPv4."""
    try:
        hexaddr, hexport = field.split(":")
        raw = bytes.fromhex(hexaddr)
        port = int(hexport, 16)
    except ValueError:
        return None
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1])), port
    if len(raw) == 16:  # four 32-bit words, each in host (little-endian) order
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        return str(ip.ipv4_mapped or ip), port
    return None


def established_peers(port: int, tables: list[str]) -> set[str]:
    """The remote addresses of every ESTABLISHED connection whose local port is ``port``, from the text of
    ``/proc/net/tcp`` and ``/proc/net/tcp6``."""
    out: set[str] = set()
    for text in tables:
        for line in text.splitlines()[1:]:
            f = line.split()
            if len(f) < 4 or f[3] != ESTABLISHED:
                continue
            local, remote = _address(f[1]), _address(f[2])
            if local and remote and local[1] == port:
                out.add(remote[0])
    return out


def read_tables(paths=TABLES) -> list[str] | None:
    out = []
    for p in paths:
        try:
            with open(p) as fh:
                out.append(fh.read())
        except OSError:
            continue
    return out or None


_resolved: dict[str, str | None] = {}


def resolve(address: str) -> str | None:
    """An address as the kernel's tables show it: an IP as it is, a name looked up until it resolves, then
    remembered (each lookup bounded by RESOLVE_TIMEOUT_S; None when it does not resolve in time)."""
    a = address.strip("[]")
    try:
        ip = ipaddress.ip_address(a)
        return str(getattr(ip, "ipv4_mapped", None) or ip)
    except ValueError:
        pass
    if a not in _resolved:
        box: list[str | None] = [None]

        def look():
            try:
                box[0] = socket.gethostbyname(a)
            except OSError:
                pass
        t = threading.Thread(target=look, daemon=True)
        t.start()
        t.join(RESOLVE_TIMEOUT_S)
        if t.is_alive() or box[0] is None:
            return None  # not remembered: asked again at the next scrape
        _resolved[a] = box[0]
    return _resolved[a]


def joined(port: int, ranks: dict[str, str], tables: list[str] | None) -> dict[str, bool | None]:
    """host -> whether it holds a connection to ``port`` here (None where that cannot be told: the tables could not
    be read, or the host's name does not resolve)."""
    if tables is None:
        return {h: None for h in ranks}
    peers = established_peers(port, tables)
    out: dict[str, bool | None] = {}
    for host, address in ranks.items():
        ip = resolve(address)
        out[host] = None if ip is None else ip in peers
    return out
