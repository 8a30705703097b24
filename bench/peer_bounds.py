"""How far an untrusted peer can push specdeploy: the exporter's peak RSS while its engine serves a 30 MB
/metrics page and over many scrapes of a normal page, and the wall time of `specdeploy status --timeout 2`
against an exporter that trickles its answer and against one that serves a 30 MB page.

    python3 bench/peer_bounds.py [--src SRC_DIR] [--scrapes 900]

``--src`` picks the tree under test (default: this checkout's src/), so the same script measures a tree before a
change (``git archive BASE | tar -x -C /tmp/before`` then ``--src /tmp/before/src``) and after it. Everything runs
on 127.0.0.1 with ephemeral ports. The exporter runs as ``specdeploy exporter`` in its own process; its 1 s reuse
of an engine scrape is turned off (``cache_s=0``) so that every one of the scrapes reads the engine.
"""
from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIG = 30 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def normal_page() -> bytes:
    """A vLLM-shaped page of about 20 KB: the speculative counters and some serving histograms."""
    lines = ["# TYPE vllm:spec_decode_num_drafts counter", 'vllm:spec_decode_num_drafts_total{model_name="m"} 1000',
             "# TYPE vllm:spec_decode_num_draft_tokens counter",
             'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 3000',
             "# TYPE vllm:spec_decode_num_accepted_tokens counter",
             'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 2100',
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",position="{i}"}} {900 - 200 * i}'
              for i in range(3)]
    for h in range(8):
        lines.append(f"# TYPE vllm:histogram_{h}_seconds histogram")
        for le in [0.001 * 2 ** i for i in range(20)] + ["+Inf"]:
            lines.append(f'vllm:histogram_{h}_seconds_bucket{{model_name="m",le="{le}"}} {h * 10}')
        lines += [f'vllm:histogram_{h}_seconds_sum{{model_name="m"}} 1.5',
                  f'vllm:histogram_{h}_seconds_count{{model_name="m"}} {h * 10}']
    return ("\n".join(lines) + "\n").encode()


def big_page() -> bytes:
    """30 MB of well-formed samples: what an engine with a label explosion could serve."""
    row = 'vllm:spec_decode_num_drafts_total{model_name="m",lora="%08d"} 1\n'
    out, n = [], 0
    while n < BIG:
        s = row % len(out)
        out.append(s)
        n += len(s)
    return ("# TYPE vllm:spec_decode_num_drafts counter\n" + "".join(out)).encode()


class Peer(http.server.BaseHTTPRequestHandler):
    pages: dict[str, bytes] = {}
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        if self.path.startswith("/trickle"):
            body = b"# TYPE specdeploy_engine_up gauge\nspecdeploy_engine_up 1\n"
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            try:
                for b in body:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:
                pass
            return
        key = self.path.split("/")[1]
        body = self.pages.get(key, b"")
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        if not key.endswith("-nolength"):
            self.send_header("content-length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *a):
        pass


def start_peer() -> tuple[http.server.ThreadingHTTPServer, int]:
    Peer.pages = {"normal": normal_page(), "big": big_page()}
    Peer.pages["big-nolength"] = Peer.pages["big"]
    port = free_port()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Peer)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, port


EXPORTER = """
import sys
import specdeploy.speculation.exporter as E
init = E.SpecCollector.__init__
def no_cache(self, *a, **k):
    k["cache_s"] = 0.0
    init(self, *a, **k)
E.SpecCollector.__init__ = no_cache
from specdeploy.cli import main
sys.argv = ["specdeploy"] + sys.argv[1:]
main()
"""


def hwm_mb(pid: int) -> tuple[float, float]:
    """(peak RSS, current RSS) in MB from /proc."""
    f = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(f["VmHWM"].split()[0]) / 1024, int(f["VmRSS"].split()[0]) / 1024


def exporter_rss(src: str, engine_url: str, scrapes: int) -> dict:
    xp = free_port()
    env = dict(os.environ, PYTHONPATH=src)
    p = subprocess.Popen([sys.executable, "-c", EXPORTER, "exporter", "--engine", "vllm", "--engine-url", engine_url,
                          "--listen", f"127.0.0.1:{xp}", "--gate-file", "/nonexistent/gate/report.json"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{xp}/metrics"
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=60).read()
                break
            except OSError:
                time.sleep(0.2)
        start = hwm_mb(p.pid)[0]
        t0, errors, ok = time.monotonic(), 0, 0
        for _ in range(scrapes):
            try:
                body = urllib.request.urlopen(url, timeout=60).read().decode()
                ok += "specdeploy_engine_up 1.0" in body
            except OSError:
                errors += 1
        peak, now = hwm_mb(p.pid)
        return {"scrapes": scrapes, "engine_up_answers": ok, "http_errors": errors, "rss_start_mb": round(start, 1),
                "rss_peak_mb": round(peak, 1), "rss_end_mb": round(now, 1),
                "wall_s": round(time.monotonic() - t0, 1)}
    finally:
        p.terminate()
        p.wait(10)


def status_wall(src: str, path: str) -> dict:
    """`specdeploy status --timeout 2` over one host whose exporter is the peer at ``path``."""
    tmp = Path(tempfile.mkdtemp())
    try:
        inv = tmp / "inventory" / "bench"
        shutil.copytree(REPO / "inventory/example", inv)
        (tmp / "examples").symlink_to(REPO / "examples")
        # the exporter's path is fixed (/metrics): each page gets a peer of its own
        srv, port = _single(path)
        (inv / "hosts.yml").write_text(json.dumps({"all": {"children": {
            "specdeploy_engines": {"hosts": {"gpu-a": {"ansible_host": "127.0.0.1",
                                                       "specdeploy_exporter_port": port}}},
            "specdeploy_monitoring": {"hosts": {}}}}}))
        t0 = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "status", "-i", str(inv), "--timeout", "2",
                                "--prometheus", f"http://127.0.0.1:{free_port()}", "--json"],
                               env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True, timeout=180)
            rc, err = r.returncode, r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
            try:
                row = json.loads(r.stdout.splitlines()[0])["hosts"][0]
                shown = {k: row.get(k) for k in ("reachable", "error", "up") if k in row}
            except (ValueError, IndexError, KeyError):
                shown = None
        except subprocess.TimeoutExpired:
            rc, err, shown = "killed at 180 s", [], None
        wall = time.monotonic() - t0
        srv.shutdown()
        return {"peer": path, "wall_s": round(wall, 1), "rc": rc, "row": shown, "last_stderr": err}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _single(path: str):
    class One(Peer):
        def do_GET(self):
            self.path = path
            super().do_GET()
    port = free_port()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), One)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=str(REPO / "src"))
    ap.add_argument("--scrapes", type=int, default=900)
    ap.add_argument("--big-scrapes", type=int, default=5)
    a = ap.parse_args()
    srv, port = start_peer()
    out = {"src": a.src}
    out["exporter_30MB"] = exporter_rss(a.src, f"http://127.0.0.1:{port}/big", a.big_scrapes)
    out["exporter_30MB_no_length"] = exporter_rss(a.src, f"http://127.0.0.1:{port}/big-nolength", a.big_scrapes)
    out["exporter_normal"] = exporter_rss(a.src, f"http://127.0.0.1:{port}/normal", a.scrapes)
    out["status_trickle"] = status_wall(a.src, "/trickle")
    out["status_30MB"] = status_wall(a.src, "/big")
    srv.shutdown()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
