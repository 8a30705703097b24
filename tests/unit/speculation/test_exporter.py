import json
import http.server
import threading
import time

import pytest

from helpers import free_port, load, scrape, start_exporter, start_sim, stop
from specdeploy.speculation.exporter import ParseError, parse_engine_metrics


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_exporter_maps_both_engines_to_one_set_of_names(engine):
    ep, xp = free_port(), free_port()
    sim = start_sim(engine, "127.0.0.1", ep, {"SPECDEPLOY_SIM_ACCEPTANCE": "0.8", "SPECDEPLOY_SIM_SEED": "3"})
    exp = start_exporter(engine, f"http://127.0.0.1:{ep}", "127.0.0.1", xp)
    try:
        load(f"http://127.0.0.1:{ep}", n=6)
        time.sleep(1.1)  # the exporter reuses an engine scrape for at most 1 s
        m = scrape(f"http://127.0.0.1:{xp}/metrics")
        assert m["specdeploy_engine_up"] == 1
        rate, al = m["specdeploy_spec_acceptance_rate"], m["specdeploy_spec_acceptance_length"]
        assert 0.55 < rate < 0.95 and 2.5 < al < 4.0  # alpha 0.8 at k=3: E[accepted] = 0.8+0.64+0.512
        if engine == "vllm":
            # AL = 1 + accepted/drafts, rate = accepted/draft_tokens, all from the engine's own counters
            e = scrape(f"http://127.0.0.1:{ep}/metrics")
            acc = sum(v for k, v in e.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_total"))
            drafts = sum(v for k, v in e.items() if k.startswith("vllm:spec_decode_num_drafts_total"))
            assert al == pytest.approx(1 + acc / drafts, rel=0.05)
            pos = [m[f"specdeploy_spec_position_acceptance_rate{{position={i}}}"] for i in range(3)]
            assert pos[0] >= pos[1] >= pos[2] > 0
            assert m["specdeploy_spec_drafts_total"] == pytest.approx(drafts, rel=0.05)
        else:
            assert "specdeploy_spec_drafts_total" not in m  # SGLang has no counters to re-export
        info = [k for k in m if k.startswith("specdeploy_engine_info{")]
        assert info and "engine=%s," % engine in info[0] and "version=test" in info[0]
    finally:
        stop(exp, sim)


def test_window_covers_only_recent_samples():
    """High acceptance first, then none: a short window shows only the recent rate; a single sample shows the
    cumulative figure since engine start."""
    from specdeploy.speculation.exporter import Sample, SpecCollector
    c = SpecCollector("vllm", "http://127.0.0.1:1", window=10)
    now = time.monotonic()
    c.samples.extend([Sample(now - 30, 100, 300, 240, {"0": 90, "1": 80, "2": 70}, has_counters=True),
                      Sample(now - 5, 200, 600, 480, {"0": 180, "1": 160, "2": 140}, has_counters=True),
                      Sample(now, 300, 900, 480, {"0": 180, "1": 160, "2": 140}, has_counters=True)])
    c.last_scrape = now + 1e9  # no live scrape
    while now - c.samples[0].t > c.window:
        c.samples.popleft()
    fams = {f.name: f for f in c._spec(list(c.samples))}
    assert fams["specdeploy_spec_acceptance_rate"].samples[0].value == 0.0  # nothing accepted in the window
    assert fams["specdeploy_spec_acceptance_length"].samples[0].value == 1.0
    single = {f.name: f for f in c._spec([Sample(now, 100, 300, 150, {"0": 60}, has_counters=True)])}
    assert single["specdeploy_spec_acceptance_rate"].samples[0].value == 0.5
    assert single["specdeploy_spec_acceptance_length"].samples[0].value == 2.5


class _Garbage(http.server.BaseHTTPRequestHandler):
    delay = 0.0

    def do_GET(self):
        time.sleep(self.delay)
        body = b"this is {not prometheus\n\x00\x01"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the exporter gave up first (the slow case)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("kind", ["dead", "garbage", "slow"])
def test_bad_engine_never_crashes_exporter(kind):
    ep, xp = free_port(), free_port()
    srv = None
    if kind != "dead":
        handler = type("H", (_Garbage,), {"delay": 3.0 if kind == "slow" else 0.0})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", ep), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    exp = start_exporter("vllm", f"http://127.0.0.1:{ep}", "127.0.0.1", xp)
    try:
        first = scrape(f"http://127.0.0.1:{xp}/metrics")
        time.sleep(1.1)
        second = scrape(f"http://127.0.0.1:{xp}/metrics")
        assert first["specdeploy_engine_up"] == 0 and second["specdeploy_engine_up"] == 0
        assert second["specdeploy_exporter_scrape_errors_total"] > first["specdeploy_exporter_scrape_errors_total"] >= 1
        assert exp.poll() is None
    finally:
        stop(exp)
        if srv:
            srv.shutdown()


def test_parse_rejects_non_engine_metrics():
    with pytest.raises(ParseError):
        parse_engine_metrics("vllm", "# TYPE foo counter\nfoo_total 1\n", 0)
    s = parse_engine_metrics("sglang", 'sglang:spec_accept_length{tp_rank="0"} 2.5\n', 0)
    assert s.al == 2.5


def test_sglang_reports_nothing_before_traffic_and_the_engines_own_figure_after():
    """SGLang's acceptance gauges read 0 until the first speculative batch: no figure, not a low one. After
    traffic the exporter shows exactly what the engine's gauges say."""
    import os
    import subprocess
    import sys

    from helpers import sim_argv, wait_http
    ep, xp = free_port(), free_port()
    env = dict(os.environ, SPECDEPLOY_SIM_LOAD_SECONDS="0", SPECDEPLOY_SIM_STEP_MS="2", SPECDEPLOY_SIM_ACCEPTANCE="0.8",
               SPECDEPLOY_SIM_SEED="5")
    # not through /health: SGLang's health check runs a generation, which would be traffic
    sim = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", "sglang", "--version",
                            "0.5.23", "--"] + sim_argv("sglang", "127.0.0.1", ep), env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{ep}/v1/models")
    exp = start_exporter("sglang", f"http://127.0.0.1:{ep}", "127.0.0.1", xp)
    try:
        for _ in range(3):  # several pre-traffic samples inside the window
            e = scrape(f"http://127.0.0.1:{ep}/metrics")
            assert [v for k, v in e.items() if k.startswith("sglang:spec_accept_length")] == [0.0]
            m = scrape(f"http://127.0.0.1:{xp}/metrics")
            assert m["specdeploy_engine_up"] == 1
            assert "specdeploy_spec_acceptance_length" not in m and "specdeploy_spec_acceptance_rate" not in m
            time.sleep(1.1)
        load(f"http://127.0.0.1:{ep}", n=6)
        time.sleep(1.1)
        m = scrape(f"http://127.0.0.1:{xp}/metrics")
        e = scrape(f"http://127.0.0.1:{ep}/metrics")
        eng_al = next(v for k, v in e.items() if k.startswith("sglang:spec_accept_length"))
        eng_rate = next(v for k, v in e.items() if k.startswith("sglang:spec_accept_rate"))
        assert eng_al > 2.0  # traffic happened; the zeros seen before it must not drag the figure down
        assert m["specdeploy_spec_acceptance_length"] == pytest.approx(eng_al)
        assert m["specdeploy_spec_acceptance_rate"] == pytest.approx(eng_rate)
    finally:
        stop(exp, sim)


def test_sglang_speculation_off_zeros_are_no_figure():
    text = ('sglang:spec_accept_length{tp_rank="0"} 0.0\nsglang:spec_accept_rate{tp_rank="0"} 0.0\n'
            'sglang:num_running_reqs{tp_rank="0"} 4.0\n')
    s = parse_engine_metrics("sglang", text, 0)
    assert s.al is None and s.rate is None
    from specdeploy.speculation.exporter import SpecCollector
    c = SpecCollector("sglang", "http://127.0.0.1:1")
    fams = {f.name: f for f in c._spec([s, parse_engine_metrics("sglang", text, 1)])}
    assert fams["specdeploy_spec_acceptance_length"].samples == []
    # two ranks, one without a figure yet: the real one counts alone
    two = parse_engine_metrics("sglang", 'sglang:spec_accept_length{tp_rank="0"} 3.0\n'
                                         'sglang:spec_accept_length{tp_rank="1"} 0\n'
                                         'sglang:spec_accept_rate{tp_rank="0"} 0.5\n'
                                         'sglang:spec_accept_rate{tp_rank="1"} 0\n', 0)
    assert two.al == 3.0 and two.rate == 0.5


# ---- untrusted inputs: the engine page, the gate report, the release mark ------------------------------------
VLLM_PAGE = ('vllm:spec_decode_num_drafts_total{model_name="m"} 100\n'
             'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 300\n'
             'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 150\n').encode()


class _Engine(http.server.BaseHTTPRequestHandler):
    """A fake engine on 127.0.0.1: ``body`` is its /metrics page; ``length`` False leaves Content-Length out."""
    body, length = VLLM_PAGE, True
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self.send_response(200)
        if self.length:
            self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        try:
            self.wfile.write(self.body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *a):
        pass


@pytest.fixture
def engine():
    started = []

    def start(body=VLLM_PAGE, length=True):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("E", (_Engine,), {"body": body,
                                                                                          "length": length}))
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return srv, f"http://127.0.0.1:{srv.server_address[1]}"
    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def _collect(c) -> dict[str, float]:
    """What the exporter's HTTP handler renders (it calls collect the same way), parsed back."""
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families
    reg = CollectorRegistry()
    reg.register(c)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))] = s.value
    return out


GOOD_GATE = {"verdict": "keep", "timestamp": 1.7e9, "levels": [{"concurrency": 8, "speedup": 1.7, "errors": 0}]}


@pytest.mark.parametrize("kind, content, problem", [
    ("gate", b"[1, 2, 3]", "a JSON list, not an object"),
    ("gate", json.dumps({"verdict": "keep", "levels": [{"concurrency": 8, "speedup": "fast"}]}).encode(),
     "levels[0].speedup is str"),
    ("gate", json.dumps({"verdict": "keep", "levels": {"8": {}}}).encode(), "levels is a JSON dict"),
    ("gate", json.dumps({"verdict": "keep", "levels": [{"concurrency": 8, "predicted_step_ratio": 1.5}]}).encode(),
     "levels[0].predicted_step_ratio is 1.5, not [local, uniform]"),
    ("gate", json.dumps({"verdict": "keep", "levels": [{"concurrency": 8,
                                                        "predicted_step_ratio": [1.2, -3]}]}).encode(),
     "levels[0].predicted_step_ratio[1] is -3, below 0"),
    ("gate", json.dumps({"verdict": "maybe", "levels": []}).encode(), "verdict is \"maybe\""),
    ("gate", json.dumps({"levels": [{"concurrency": 8, "errors": -3}]}).encode(), "levels[0].errors is -3"),
    ("gate", b'{"verdict": "keep", "levels": [{"concurrency": 8, "speedup": NaN}]}', "not a finite number"),
    ("gate", b"\xff\xfe{}", "not UTF-8"),
    ("gate", b'{"verdict": "ke', "not JSON"),
    ("release", b"r-2026\xff\xfe", "not UTF-8"),
    ("release", b"r-1\x1b[31m\n", "control characters"),
])
def test_a_bad_input_file_drops_only_its_own_figures(engine, tmp_path, caplog, kind, content, problem):
    from specdeploy.speculation.exporter import SpecCollector
    _, url = engine()
    gate, release = tmp_path / "gate" / "report.json", tmp_path / "current"
    gate.parent.mkdir()
    gate.write_text(json.dumps(GOOD_GATE))
    release.write_text("r-2026-12-01\n")
    (gate if kind == "gate" else release).write_bytes(content)
    c = SpecCollector("vllm", url, gate_file=gate, release_file=release, cache_s=0)
    with caplog.at_level("WARNING", logger="specdeploy.speculation.exporter"):
        m = _collect(c)
        again = _collect(c)
    assert m["specdeploy_engine_up"] == 1 and again["specdeploy_engine_up"] == 1
    assert m["specdeploy_spec_acceptance_length"] == 2.5  # the engine's figures stay
    assert m[f"specdeploy_exporter_input_valid{{file={kind}}}"] == 0
    other = "release" if kind == "gate" else "gate"
    assert m[f"specdeploy_exporter_input_valid{{file={other}}}"] == 1
    if kind == "gate":
        assert not any(k.startswith("specdeploy_gate_") for k in m)
        assert any(k.startswith("specdeploy_engine_info{") and "release=r-2026-12-01" in k for k in m)
    else:
        assert m["specdeploy_gate_speedup{concurrency=8}"] == 1.7
        assert any(k.startswith("specdeploy_engine_info{") and "release=}" in k for k in m)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(gate if kind == "gate" else release) in lines[0] and problem in lines[0], lines
    # fixed: valid again, the figures come back
    gate.write_text(json.dumps(GOOD_GATE))
    release.write_text("r-2026-12-02\n")
    fixed = _collect(c)
    assert fixed["specdeploy_exporter_input_valid{file=gate}"] == 1
    assert fixed["specdeploy_exporter_input_valid{file=release}"] == 1
    assert fixed["specdeploy_gate_speedup{concurrency=8}"] == 1.7


def test_a_bad_gate_file_still_gets_http_200_from_the_exporter(tmp_path, engine):
    _, url = engine()
    gate = tmp_path / "report.json"
    gate.write_bytes(b"\xff[not utf-8]")
    xp = free_port()
    exp = start_exporter("vllm", url, "127.0.0.1", xp, gate_file=gate)
    try:
        m = scrape(f"http://127.0.0.1:{xp}/metrics")  # urlopen raises on a 500
        assert m["specdeploy_engine_up"] == 1 and m["specdeploy_exporter_input_valid{file=gate}"] == 0
    finally:
        stop(exp)


@pytest.mark.parametrize("length", [True, False])
def test_an_oversized_engine_page_is_a_failed_scrape_not_held(engine, length):
    from specdeploy.speculation.exporter import SpecCollector
    page = VLLM_PAGE + b'vllm:spec_decode_num_drafts_total{model_name="m",pad="%s"} 1\n' % (b"x" * 1000) * 9000
    assert len(page) > 8 << 20
    _, url = engine(page, length)
    c = SpecCollector("vllm", url, cache_s=0)
    m = _collect(c)
    assert m["specdeploy_engine_up"] == 0 and m["specdeploy_exporter_scrape_errors_total"] == 1
    assert "8,388,608-byte limit" in c.last_error
    assert "specdeploy_spec_acceptance_length" not in m


def test_a_trickling_engine_is_cut_at_the_exporters_deadline():
    """The engine sends a byte every 0.1 s: a per-read timeout never fires, the total deadline does."""
    import socket

    from specdeploy.speculation.exporter import SpecCollector
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(1)
    done = threading.Event()

    def trickle():
        conn, _ = lsn.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(VLLM_PAGE))
            for b in VLLM_PAGE:
                if done.is_set():
                    return
                try:
                    conn.sendall(bytes([b]))
                except OSError:
                    return
                time.sleep(0.1)
    threading.Thread(target=trickle, daemon=True).start()
    try:
        c = SpecCollector("vllm", f"http://127.0.0.1:{lsn.getsockname()[1]}", timeout=1.0, cache_s=0)
        t0 = time.monotonic()
        m = _collect(c)
        assert time.monotonic() - t0 < 1.8 and m["specdeploy_engine_up"] == 0
        assert "within 1 s" in c.last_error
    finally:
        done.set()
        lsn.close()


def test_figures_older_than_the_window_are_dropped_after_the_engine_dies(engine):
    from specdeploy.speculation.exporter import SpecCollector
    srv, url = engine()
    c = SpecCollector("vllm", url, window=1.5, cache_s=0)
    live = _collect(c)
    assert live["specdeploy_engine_up"] == 1 and live["specdeploy_spec_acceptance_length"] == 2.5
    srv.shutdown()
    srv.server_close()
    inside = _collect(c)  # dead, but its last figures are inside the window
    assert inside["specdeploy_engine_up"] == 0 and inside["specdeploy_spec_acceptance_length"] == 2.5
    time.sleep(1.7)
    late = _collect(c)
    assert late["specdeploy_engine_up"] == 0
    assert not any(k.startswith("specdeploy_spec_") for k in late), late


def test_non_finite_engine_figures():
    with pytest.raises(ParseError, match="NaN or infinite"):
        parse_engine_metrics("vllm", "vllm:spec_decode_num_drafts_total NaN\n", 0)
    s = parse_engine_metrics("sglang", 'sglang:spec_accept_length{tp_rank="0"} NaN\n'
                                       'sglang:spec_accept_length{tp_rank="1"} 2.5\n'
                                       'sglang:spec_accept_rate{tp_rank="0"} NaN\n'
                                       'sglang:spec_accept_rate{tp_rank="1"} 0.5\n', 0)
    assert s.al == 2.5 and s.rate == 0.5


@pytest.mark.parametrize("window", ["nan", "inf", "0", "-5"])
def test_exporter_refuses_a_window_that_is_no_duration(window):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "exporter", "--engine", "vllm", "--engine-url",
                        "http://127.0.0.1:9", "--listen", "127.0.0.1:9", "--window", window],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--window" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_fifo_in_place_of_the_gate_file_does_not_hang_a_scrape(tmp_path):
    """Files other components write are read without blocking: a FIFO where the gate report belongs is named
    as invalid, at once."""
    import os
    import time

    from specdeploy.speculation.exporter import _read_small
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    text, why = _read_small(fifo, 1 << 20)
    assert text is None and why == "is not a regular file" and time.monotonic() - t0 < 1
