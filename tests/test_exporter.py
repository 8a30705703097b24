import http.server
import threading
import time

import pytest

from helpers import free_port, load, scrape, start_exporter, start_sim, stop
from specdeploy.exporter import ParseError, parse_engine_metrics


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
    from specdeploy.exporter import Sample, SpecCollector
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
    from specdeploy.exporter import SpecCollector
    c = SpecCollector("sglang", "http://127.0.0.1:1")
    fams = {f.name: f for f in c._spec([s, parse_engine_metrics("sglang", text, 1)])}
    assert fams["specdeploy_spec_acceptance_length"].samples == []
    # two ranks, one without a figure yet: the real one counts alone
    two = parse_engine_metrics("sglang", 'sglang:spec_accept_length{tp_rank="0"} 3.0\n'
                                         'sglang:spec_accept_length{tp_rank="1"} 0\n'
                                         'sglang:spec_accept_rate{tp_rank="0"} 0.5\n'
                                         'sglang:spec_accept_rate{tp_rank="1"} 0\n', 0)
    assert two.al == 3.0 and two.rate == 0.5
