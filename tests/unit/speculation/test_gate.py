"""The gate against the engine simulator: good acceptance with a cheap draft is kept, poor acceptance with an
expensive draft is disabled; the report and chart are written."""
import json
import subprocess
import sys

import pytest

from helpers import free_port, start_sim, stop

# Simulated decode steps long enough that HTTP and Python overhead on a loaded 2-core machine stay small
# against them: the expected speedup of the good drafter is (1 + .8 + .64 + .512) / 1.3 = 2.3x
STEP_MS = "15"


@pytest.fixture(scope="module")
def engines():
    ports = {name: free_port() for name in ("base", "good", "poor")}
    base = _start_plain(ports["base"])
    good = start_sim("vllm", "127.0.0.1", ports["good"], {"SPECDEPLOY_SIM_ACCEPTANCE": "0.8",
                                                           "SPECDEPLOY_SIM_SPEC_STEP_RATIO": "1.3",
                                                           "SPECDEPLOY_SIM_STEP_MS": STEP_MS})
    poor = start_sim("vllm", "127.0.0.1", ports["poor"], {"SPECDEPLOY_SIM_ACCEPTANCE": "0.15",
                                                           "SPECDEPLOY_SIM_SPEC_STEP_RATIO": "2.2",
                                                           "SPECDEPLOY_SIM_STEP_MS": STEP_MS})
    yield ports
    stop(base, good, poor)


def _start_plain(port):
    import os
    from helpers import MODEL, wait_http
    env = dict(os.environ, SPECDEPLOY_SIM_LOAD_SECONDS="0", SPECDEPLOY_SIM_STEP_MS=STEP_MS)
    p = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", "vllm", "--version",
                          "0.16.0", "--", "vllm", "serve", str(MODEL), "--served-model-name", "kimi", "--host",
                          "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/health")
    return p


def _gate(port, out, *extra):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", f"http://127.0.0.1:{port}",
                        "--concurrency", "1,4", "--max-tokens", "48", "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "report.json").read_text())


def test_gate_keeps_good_and_disables_poor(engines, tmp_path):
    base = _gate(engines["base"], tmp_path / "base")
    assert base["speculation"] is False and base["verdict"] is None
    good = _gate(engines["good"], tmp_path / "good", "--baseline", str(tmp_path / "base/report.json"))
    poor = _gate(engines["poor"], tmp_path / "poor", "--baseline", str(tmp_path / "base/report.json"))
    assert good["verdict"] == "keep" and poor["verdict"] == "disable"
    for lv in good["levels"]:
        assert lv["speedup"] > 1.3 and lv["acceptance_length"] > 2.4 and len(lv["per_position"]) == 3
        assert lv["per_position"][0] >= lv["per_position"][2]
        assert lv["itl_ms"] > 0 and lv["errors"] == 0
    for lv in poor["levels"]:
        assert lv["speedup"] < 1 and lv["acceptance_length"] < 1.4
        assert lv["breakeven_al"] > lv["acceptance_length"]  # AL below the step-time ratio: no pay-off
    png = (tmp_path / "poor/report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000


def test_gate_bad_input_is_a_clean_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", "http://127.0.0.1:9",
                        "--concurrency", "1,x"], capture_output=True, text=True)
    assert r.returncode == 2 and "--concurrency" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", "http://127.0.0.1:9",
                        "--baseline", str(tmp_path / "nope.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "does not exist" in r.stderr


class _Failing:
    """A reverse proxy in front of a healthy engine that fails 3 of every 4 chat completions with HTTP 500."""

    def __init__(self, upstream: str):
        import http.server
        import threading
        import urllib.request
        self.n = 0
        lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def _forward(self, body=None):
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                             headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    data = r.read()
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._forward()

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    outer.n += 1
                    fail = outer.n % 4 != 0
                if fail:
                    self.send_response(500)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self._forward(body)

            def log_message(self, *a):
                pass

        self.port = free_port()
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


def test_gate_with_failing_requests_refuses_to_decide(engines, tmp_path):
    """12 of 16 requests fail: the throughput of the survivors says nothing about speculation."""
    base = _gate(engines["base"], tmp_path / "base")
    proxy = _Failing(f"http://127.0.0.1:{engines['good']}")
    try:
        r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", f"http://127.0.0.1:{proxy.port}",
                            "--concurrency", "1", "--requests", "16", "--max-tokens", "48",
                            "--baseline", str(tmp_path / "base/report.json"), "--out", str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=300)
    finally:
        proxy.srv.shutdown()
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads((tmp_path / "run/report.json").read_text())
    assert rep["verdict"] is None and rep["failed_requests"] == 12 and rep["sent_requests"] == 16
    assert "12 of 16 requests failed" in rep["refused"]
    assert "failed 12/16" in r.stdout and "refused to decide" in r.stderr
    from specdeploy.speculation.gate import verdict_overrides
    assert verdict_overrides(rep) == {}  # nothing to apply: the previous decision stays
    assert base["failed_requests"] == 0


def test_nothing_measured_is_no_verdict():
    from specdeploy.speculation.gate import decide, refusal
    levels = [{"concurrency": 1, "requests": 16, "errors": 0, "speedup": None}]
    assert decide(levels, 3)[0] is None
    assert refusal(levels, {"levels": []}).startswith("nothing measured")
    ok = [{"concurrency": 1, "requests": 200, "errors": 2, "speedup": 1.8, "acceptance_length": 2.9,
           "speedup_interval": [1.6, 2.0]}]
    assert refusal(ok, {"levels": [{"requests": 200, "errors": 0}]}) is None  # 1% exactly is tolerated
    assert "in the baseline" in refusal(ok, {"levels": [{"requests": 100, "errors": 5}]})
    assert decide(ok, 3)[0] == "keep"


def _serve_metrics(text: str):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_gate_reads_metrics_as_the_exporter_does():
    """The gate's reading of /metrics is the exporter's: counters summed over ranks, acceptance gauges averaged
    over the ranks that report one (0: no figure), inter-token latency sums; no engine metrics is a finding."""
    from specdeploy.values.errors import SpecdeployError
    from specdeploy.speculation.exporter import parse_engine_metrics
    from specdeploy.speculation.gate import read_metrics
    sg = ("# TYPE sglang:spec_accept_length gauge\n"
          'sglang:spec_accept_length{tp_rank="0"} 3.0\nsglang:spec_accept_length{tp_rank="1"} 0.0\n'
          'sglang:spec_accept_length{tp_rank="2"} 2.0\n'
          "# TYPE sglang:spec_accept_rate gauge\n"
          'sglang:spec_accept_rate{tp_rank="0"} 0.6\nsglang:spec_accept_rate{tp_rank="1"} 0.0\n'
          'sglang:spec_accept_rate{tp_rank="2"} 0.4\n'
          "# TYPE sglang:inter_token_latency_seconds histogram\n"
          'sglang:inter_token_latency_seconds_bucket{le="+Inf"} 40\n'
          "sglang:inter_token_latency_seconds_sum 2.0\nsglang:inter_token_latency_seconds_count 40\n")
    vl = ("# TYPE vllm:spec_decode_num_drafts counter\n"
          'vllm:spec_decode_num_drafts_total{engine="0"} 10\nvllm:spec_decode_num_drafts_total{engine="1"} 6\n'
          "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
          'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 20\n'
          "# TYPE vllm:inter_token_latency_seconds histogram\n"
          'vllm:inter_token_latency_seconds_bucket{le="+Inf"} 8\n'
          "vllm:inter_token_latency_seconds_sum 0.4\nvllm:inter_token_latency_seconds_count 8\n")
    for engine, text in (("sglang", sg), ("vllm", vl), ("vllm", "# TYPE foo counter\nfoo_total 1\n")):
        srv, url = _serve_metrics(text)
        try:
            if text.startswith("# TYPE foo"):
                with pytest.raises(SpecdeployError) as exc:
                    read_metrics(url, engine)
                assert exc.value.problems[0].subject == "--engine" and "/metrics" in exc.value.problems[0].message
                continue
            s = read_metrics(url, engine)
        finally:
            srv.shutdown()
        ref = parse_engine_metrics(engine, text, 0.0)
        assert (s.drafts, s.accepted, s.al, s.rate, s.itl_sum, s.itl_count) == \
            (ref.drafts, ref.accepted, ref.al, ref.rate, ref.itl_sum, ref.itl_count)
        if engine == "sglang":
            assert s.al == pytest.approx(2.5) and s.rate == pytest.approx(0.5)  # rank 1's zeros say nothing
            assert (s.itl_sum, s.itl_count) == (2.0, 40)
        else:
            assert (s.drafts, s.accepted, s.al) == (16, 20, None) and (s.itl_sum, s.itl_count) == (0.4, 8)


class _FakeEngine:
    """An engine on 127.0.0.1 that serves /v1/models and /metrics, and answers every chat completion with
    ``chat`` (status, content type, body)."""

    def __init__(self, chat=(500, "text/plain", b"boom"), models=(200, "application/json",
                                                                   b'{"data": [{"id": "kimi"}]}')):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        page = b'vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_accepted_tokens_total 5\n'
        self.auth = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def _send(self, status, ctype, body):
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.auth.append(self.headers.get("authorization"))
                self._send(*(models if self.path == "/v1/models" else (200, "text/plain", page)))

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._send(*chat)

            def log_message(self, *a):
                pass
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def _run_gate(url, tmp_path, *extra):
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", "gate", "--url", url, "--concurrency", "2",
                           "--requests", "4", "--out", str(tmp_path / "out"), *extra],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("chat", [(500, "text/plain", b"boom"),
                                  (200, "text/html", b"<html><body>maintenance</body></html>"),
                                  (200, "application/json", b'{"choices": []}')])
def test_gate_without_baseline_where_every_request_failed_exits_non_zero(tmp_path, chat):
    """A baseline run whose every request failed measured nothing: no verdict, a clear message, exit 1."""
    eng = _FakeEngine(chat)
    try:
        r = _run_gate(eng.url, tmp_path)
    finally:
        eng.close()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "gate refused to decide: 4 of 4 requests failed in this run" in r.stderr
    rep = json.loads((tmp_path / "out/report.json").read_text())
    assert rep["verdict"] is None and rep["refused"] and rep["failed_requests"] == 4


@pytest.mark.parametrize("models, words", [
    ((502, "text/html", b"<!DOCTYPE html><html>Bad Gateway</html>"), "HTTP 502 (an HTML error page)"),
    ((200, "application/json", b'{"data": []}'), "no served model"),
    ((200, "application/octet-stream", b"\x00\x01\x02"), "binary data"),
])
def test_gate_on_a_garbage_engine_is_a_clean_error(tmp_path, models, words):
    eng = _FakeEngine(models=models)
    try:
        r = _run_gate(eng.url, tmp_path)
    finally:
        eng.close()
    assert r.returncode == 2 and "--url" in r.stderr and words in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("cmd, option, value", [
    ("gate", "--margin", "nan"), ("gate", "--margin", "inf"), ("gate", "--margin", "-0.1"),
    ("breakeven", "--margin", "nan"), ("breakeven", "--acceptance-length", "nan"),
    ("breakeven", "--acceptance-length", "inf"), ("breakeven", "--step-ratio", "nan"),
    ("breakeven", "--step-ratio", "-1"),
])
def test_float_options_refuse_nan_inf_and_negatives(cmd, option, value):
    args = {"gate": ["--url", "http://127.0.0.1:9"],
            "breakeven": ["--acceptance-length", "2.5", "--step-ratio", "1.3"]}[cmd]
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", cmd, *args, option, value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and option in r.stderr and "not a finite number" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "verdict" not in r.stdout


def test_breakeven_itself_refuses_nan():
    from specdeploy.speculation.gate import breakeven
    for args in ((float("nan"), 1.3), (2.5, float("nan")), (2.5, 1.3, float("nan"))):
        with pytest.raises(ValueError):
            breakeven(*args)


def test_an_empty_api_key_file_is_refused(tmp_path):
    key = tmp_path / "api-key"
    key.write_text("  \n")
    eng = _FakeEngine()
    try:
        r = _run_gate(eng.url, tmp_path, "--api-key-file", str(key))
    finally:
        eng.close()
    assert r.returncode == 2 and "--api-key-file" in r.stderr and f"{key} is empty" in r.stderr, r.stderr
    assert eng.auth == []  # refused before anything was sent without authentication


def test_no_accepted_draft_disables_whatever_the_throughput_says():
    """Acceptance length 1 (no draft token accepted) cannot pay: a higher measured throughput is load noise between
    the baseline and the speculative run (seen on the real vLLM 0.32 CPU build: 2.26x with a random drafter)."""
    from specdeploy.speculation.gate import decide
    lv = [{"speedup": 2.26, "acceptance_length": 1.0, "per_position": [0.0, 0.0], "step_ratio": 0.44,
           "speedup_interval": [2.0, 2.5]}]
    verdict, k, why = decide(lv, 2)
    assert verdict == "disable" and k is None and "no draft token accepted" in why
    lv[0]["acceptance_length"] = 1.6  # one accepted draft token in 0.6 steps: the throughput decides again
    assert decide(lv, 2)[0] == "keep"


def test_the_speedup_interval_follows_the_spread_of_the_rounds():
    """The interval of a throughput ratio from rounds: tight rounds give a tight interval around the ratio of the
    means; the same means with a wide spread give a wide one; one round (or a non-positive one) gives none."""
    import math
    import random
    from specdeploy.speculation.gate import ratio_interval
    lo, hi = ratio_interval([150.0, 151.0, 149.0, 150.0], [100.0, 101.0, 99.0, 100.0])
    assert lo < 1.5 < hi and hi - lo < 0.05
    wlo, whi = ratio_interval([100.0, 200.0, 150.0, 150.0], [60.0, 140.0, 100.0, 100.0])
    assert wlo < 1.0 < 1.5 < whi
    assert ratio_interval([150.0], [100.0, 101.0]) is None and ratio_interval([1.0, 0.0], [1.0, 2.0]) is None
    assert ratio_interval([2.0, 2.0], [1.0, 1.0]) == (2.0, 2.0)
    # coverage on generated noise: the 95% interval holds the true ratio in most of 400 draws
    rng = random.Random(7)
    hits = 0
    for _ in range(400):
        a = [1.3 * math.exp(rng.gauss(0, 0.15)) for _ in range(4)]
        b = [1.0 * math.exp(rng.gauss(0, 0.15)) for _ in range(4)]
        lo, hi = ratio_interval(a, b)
        hits += lo <= 1.3 <= hi
    assert 0.90 * 400 <= hits <= 0.99 * 400, hits


def test_a_difference_inside_the_noise_is_no_decision():
    """The verdict needs the effect to beat the spread: a point above the threshold whose interval reaches below
    1x is no decision, and so is one just below it whose interval reaches above; a single round is none either."""
    from specdeploy.speculation.gate import decide
    lv = {"acceptance_length": 2.0, "per_position": [1.0], "step_ratio": 1.0}
    assert decide([dict(lv, speedup=1.3, speedup_interval=[1.15, 1.45])], 1)[0] == "keep"
    verdict, _, why = decide([dict(lv, speedup=1.3, speedup_interval=[0.8, 2.1])], 1)
    assert verdict is None and "spread between rounds" in why and "0.80-2.10x" in why
    assert decide([dict(lv, speedup=1.05, speedup_interval=[0.95, 1.16])], 1)[0] is None
    verdict, _, why = decide([dict(lv, speedup=0.8, speedup_interval=[0.7, 0.9])], 1)
    assert verdict == "disable" and "even the top" in why
    verdict, _, why = decide([dict(lv, speedup=1.5, speedup_interval=None)], 1)
    assert verdict is None and "single round" in why


def test_the_aa_line_is_the_run_against_itself():
    from specdeploy.speculation.gate import aa_line
    aa = aa_line([101.0, 99.0, 98.0, 102.0])
    assert aa["ratio"] == 1.0 and aa["interval"][0] < 1.0 < aa["interval"][1]
    assert aa_line([100.0, 101.0, 99.0]) is None  # below four rounds there are no two halves of two
