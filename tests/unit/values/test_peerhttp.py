"""The bounded HTTP GET against peers that misbehave on purpose: each fake peer is a thread on 127.0.0.1 with an
ephemeral port, speaking raw bytes so that it can trickle, lie about its length or send garbage."""
import socket
import threading
import time

import pytest

from specdeploy.values import peerhttp


class RawPeer:
    """Accepts connections and answers each with ``reply(conn)``; every loop is bounded."""

    def __init__(self, reply):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.stopped = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)  # the request
                self.reply(self, conn)
            except OSError:
                pass

    def send(self, conn, data: bytes):
        conn.sendall(data)
        self.sent += len(data)

    def close(self):
        self.stopped.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def peer():
    made = []

    def make(reply):
        p = RawPeer(reply)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


def _answer(body: bytes, ctype="text/plain; version=0.0.4", status="200 OK", length=True):
    head = f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\nconnection: close\r\n"
    if length:
        head += f"content-length: {len(body)}\r\n"
    return lambda p, c: p.send(c, head.encode() + b"\r\n" + body)


def test_good_text_and_json(peer):
    p = peer(_answer(b"specdeploy_engine_up 1\n"))
    assert peerhttp.text(p.url, 2) == "specdeploy_engine_up 1\n"
    j = peer(_answer(b'{"status": "success"}', "application/json"))
    assert peerhttp.json_object(j.url, 2) == {"status": "success"}


def test_a_trickling_body_is_cut_at_the_deadline(peer):
    def trickle(p, c):
        p.send(c, b"HTTP/1.1 200 OK\r\ncontent-length: 200\r\n\r\n")
        for _ in range(200):
            if p.stopped.is_set():
                return
            p.send(c, b"x")
            time.sleep(0.1)
    p = peer(trickle)
    t0 = time.monotonic()
    with pytest.raises(peerhttp.PeerError, match="within 1 s"):
        peerhttp.text(p.url, 1.0)
    assert time.monotonic() - t0 < 1.6  # a per-read timeout would wait 20 s: every byte comes within 0.1 s


def test_trickling_headers_are_cut_at_the_deadline(peer):
    def trickle(p, c):
        for b in b"HTTP/1.1 200 OK\r\nx-slow: " + b"y" * 100:
            if p.stopped.is_set():
                return
            p.send(c, bytes([b]))
            time.sleep(0.05)
    p = peer(trickle)
    t0 = time.monotonic()
    with pytest.raises(peerhttp.PeerError, match="within 1 s"):
        peerhttp.text(p.url, 1.0)
    assert time.monotonic() - t0 < 1.6


def test_a_declared_length_over_the_cap_is_refused_before_the_body(peer):
    def big(p, c):
        p.send(c, b"HTTP/1.1 200 OK\r\ncontent-length: 31457280\r\n\r\n")
        for _ in range(480):  # 30 MiB in 64 KiB pieces, as long as the reader takes them
            p.send(c, b"a" * 65536)
    p = peer(big)
    with pytest.raises(peerhttp.PeerError, match="31,457,280 bytes is over the 1,048,576-byte limit"):
        peerhttp.fetch(p.url, 5, max_bytes=1 << 20)
    time.sleep(0.3)
    assert p.sent < 8 << 20  # the reader hung up long before the 30 MiB


def test_a_body_without_length_is_dropped_once_over_the_cap(peer):
    def big(p, c):
        p.send(c, b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
        for _ in range(480):
            p.send(c, b"a" * 65536)
    p = peer(big)
    with pytest.raises(peerhttp.PeerError, match="over the 1,048,576-byte limit"):
        peerhttp.fetch(p.url, 5, max_bytes=1 << 20)
    time.sleep(0.3)
    assert p.sent < 8 << 20


def test_a_chunked_body_is_read_whole_and_capped(peer):
    def chunked(n):
        def reply(p, c):
            p.send(c, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(n):
                p.send(c, b"10000\r\n" + b"a" * 65536 + b"\r\n")
            p.send(c, b"0\r\n\r\n")
        return reply
    small = peer(chunked(3))
    assert len(peerhttp.text(small.url, 5)) == 3 * 65536
    big = peer(chunked(40))
    with pytest.raises(peerhttp.PeerError, match="over the 1,048,576-byte limit"):
        peerhttp.text(big.url, 5, max_bytes=1 << 20)


@pytest.mark.parametrize("reply, reason", [
    (_answer(b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "text/html", "502 Bad Gateway"),
     "HTTP 502 (an HTML error page)"),
    (_answer(b"<html><body>login</body></html>", "text/html"), "an HTML page"),
    (_answer(b"\x00\x01\x02\xff binary"), "binary data"),
    (_answer(b"caf\xe9 1\n"), "not UTF-8 text"),
    (_answer(b"", status="500 Internal Server Error"), "HTTP 500"),
    (lambda p, c: p.send(c, b"SSH-2.0-OpenSSH_9.6\r\n"), "not an HTTP answer"),
    (lambda p, c: None, "not an HTTP answer"),  # closes without a word
])
def test_bad_answers_are_one_short_reason(peer, reply, reason):
    p = peer(reply)
    with pytest.raises(peerhttp.PeerError) as exc:
        peerhttp.text(p.url, 2)
    assert reason in exc.value.reason and p.url in str(exc.value)
    assert isinstance(exc.value, OSError)  # callers that handle an unreachable peer handle this one too


def test_json_that_is_not_an_object(peer):
    p = peer(_answer(b"[1, 2]", "application/json"))
    with pytest.raises(peerhttp.PeerError, match="a JSON list, not an object"):
        peerhttp.json_object(p.url, 2)
    q = peer(_answer(b"{nope", "application/json"))
    with pytest.raises(peerhttp.PeerError, match="not JSON"):
        peerhttp.json_object(q.url, 2)


def test_nobody_listening():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(peerhttp.PeerError, match="connection refused"):
        peerhttp.text(f"http://127.0.0.1:{port}/metrics", 2)
    assert peerhttp.ok(f"http://127.0.0.1:{port}/health", 1) == (False, "")
