"""Rules with promtool, and every dashboard panel's PromQL against a real Prometheus scraping the simulators
(vLLM and SGLang) through the rendered scrape config and the exporters."""
import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from helpers import REPO, free_port, load, start_exporter, start_sim, stop, wait_http
from specdeploy.speculation.monitoring import dashboard_json, panel_queries, render_rules
from specdeploy.plan.render.prometheus import render_prometheus

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus package "
                                "(scripts/setup.sh installs it)")


def test_committed_rules_and_dashboard_match_code():
    assert (REPO / "monitoring/specdeploy.rules.yml").read_text() == render_rules()
    assert (REPO / "monitoring/specdeploy-dashboard.json").read_text() == dashboard_json()


def test_promtool_check_and_unit_tests(tmp_path):
    rules = tmp_path / "specdeploy.rules.yml"
    rules.write_text(render_rules())
    subprocess.run(["promtool", "check", "rules", str(rules)], check=True, capture_output=True)
    tests = {
        "rule_files": [str(rules)], "evaluation_interval": "1m",
        # recording rules before the alerts that read them (promtool orders only the groups named here)
        "group_eval_order": ["specdeploy.recording", "specdeploy.alerts"],
        "tests": [
            {"interval": "1m",
             "input_series": [
                 {"series": 'specdeploy_spec_acceptance_length{host="gpu-a"}', "values": "1.45x30"},
                 {"series": 'specdeploy_spec_acceptance_length{host="gpu-b"}', "values": "2.9x30"},
                 {"series": 'specdeploy_gate_speedup{host="gpu-a",concurrency="8"}', "values": "0.66"},
                 {"series": 'up{job="specdeploy_engine",host="gpu-a"}', "values": "1 1 1 0 0 0 0 0"},
                 {"series": 'up{job="specdeploy_engine",host="gpu-c"}', "values": "0x90"},
                 {"series": 'vllm:kv_cache_usage_perc{host="gpu-a",engine="0"}', "values": "0.97x10"},
                 # gpu-d: the gate turned speculation off; its last figures must not page anyone
                 {"series": 'specdeploy_spec_acceptance_length{host="gpu-d"}', "values": "1.2x30"},
                 {"series": 'specdeploy_gate_speedup{host="gpu-d",concurrency="8"}', "values": "0.7x30"},
                 {"series": 'specdeploy_engine_info{host="gpu-a",engine="vllm",spec_tokens="3"}', "values": "1x30"},
                 {"series": 'specdeploy_engine_info{host="gpu-b",engine="sglang",spec_tokens="3"}', "values": "1x30"},
                 {"series": 'specdeploy_engine_info{host="gpu-d",engine="sglang",spec_tokens="0"}', "values": "1x30"},
                 {"series": 'specdeploy_exporter_input_valid{host="gpu-b",file="gate"}', "values": "1 1 0x10"},
                 {"series": 'specdeploy_exporter_input_valid{host="gpu-b",file="release"}', "values": "1x12"},
                 # the continuous gate: gpu-a's live AL 1.45 against the gate's step ratio 1.9 (0.76x now);
                 # gpu-b 2.9 against 1.6 (1.8x) but 85% of the 3.4 the gate measured; gpu-d's speculation is off
                 {"series": 'specdeploy_gate_step_ratio{host="gpu-a",concurrency="1"}', "values": "1.9x40"},
                 {"series": 'specdeploy_gate_acceptance_length{host="gpu-a",concurrency="1"}', "values": "1.5x40"},
                 {"series": 'specdeploy_gate_step_ratio{host="gpu-b",concurrency="1"}', "values": "1.5x40"},
                 {"series": 'specdeploy_gate_step_ratio{host="gpu-b",concurrency="8"}', "values": "1.7x40"},
                 {"series": 'specdeploy_gate_acceptance_length{host="gpu-b",concurrency="1"}', "values": "3.4x40"},
                 {"series": 'specdeploy_gate_step_ratio{host="gpu-d",concurrency="1"}', "values": "1.9x40"},
                 {"series": 'specdeploy_gate_acceptance_length{host="gpu-d",concurrency="1"}', "values": "3.0x40"},
                 # a serving group led by gpu-e: rank 1 (gpu-f) leaves at minute 3; rank 2 (gpu-g) stays
                 {"series": 'specdeploy_group_rank_joined{host="gpu-e",rank="1",rank_host="gpu-f"}',
                  "values": "1 1 1 0 0 0 0"},
                 {"series": 'specdeploy_group_rank_joined{host="gpu-e",rank="2",rank_host="gpu-g"}',
                  "values": "1x6"}],
             "alert_rule_test": [
                 {"eval_time": "16m", "alertname": "SpecdeployLowAcceptanceLength",
                  "exp_alerts": [{"exp_labels": {"severity": "warning", "host": "gpu-a"},
                                  "exp_annotations": {
                                      "summary": "Speculative acceptance length 1.45 on gpu-a",
                                      "description": "Below 2.0 for 15 minutes: a misconfigured or off-distribution "
                                                     "drafter (public Kimi drafters reach 2.4-3.4 at k=3). Run "
                                                     "`specdeploy drafter check`."}}]},
                 {"eval_time": "14m", "alertname": "SpecdeployLowAcceptanceLength", "exp_alerts": []},
                 {"eval_time": "9m", "alertname": "SpecdeploySpeculationBelowBreakeven", "exp_alerts": []},
                 {"eval_time": "11m", "alertname": "SpecdeploySpeculationBelowBreakeven",
                  "exp_alerts": [{"exp_labels": {"severity": "warning", "host": "gpu-a",
                                                 "specdeploy_action": "regate"},
                                  "exp_annotations": {
                                      "summary": "Speculation on gpu-a now runs at about 0.76x of none (live "
                                                 "acceptance length over the one 1.0x needs: the host's measured "
                                                 "price at its load now where it has one, else the gate's "
                                                 "step-time ratio)",
                                      "description": "Below 1.0 for 10m. `specdeploy regate` (or a deploy with "
                                                     "specdeploy_spec_gate) measures again and keeps k, reduces "
                                                     "it, or disables speculation."}}]},
                 {"eval_time": "29m", "alertname": "SpecdeployAcceptanceDecayed", "exp_alerts": []},
                 {"eval_time": "31m", "alertname": "SpecdeployAcceptanceDecayed",
                  "exp_alerts": [{"exp_labels": {"severity": "info", "host": "gpu-b"},
                                  "exp_annotations": {
                                      "summary": "Acceptance length on gpu-b is 85.29% of what the gate measured",
                                      "description": "Below 0.9 of the gate's figure for 30m: traffic drifting "
                                                     "away from the drafter's training data, or a known decay "
                                                     "(prefix caching over hours, DP attention)."}}]},
                 {"eval_time": "0m", "alertname": "SpecdeploySpeculationSlowerThanNone",
                  "exp_alerts": [{"exp_labels": {"severity": "critical", "host": "gpu-a", "concurrency": "8"},
                                  "exp_annotations": {
                                      "summary": "Speculation runs at 0.66x of no speculation on gpu-a (concurrency 8)",
                                      "description": "The speculation gate measured a net slowdown. Apply its "
                                                     "verdict (deploy with specdeploy_spec_gate) or disable "
                                                     "speculation."}}]},
                 {"eval_time": "6m", "alertname": "SpecdeployEngineDown",
                  "exp_alerts": [{"exp_labels": {"severity": "critical", "host": "gpu-a", "job": "specdeploy_engine"},
                                  "exp_annotations": {
                                      "summary": "Engine on gpu-a stopped answering /metrics",
                                      "description": "It was up within the last 1h. Run `specdeploy triage "
                                                     "--journal specdeploy-<engine>.service` on the host."}}]},
                 {"eval_time": "62m", "alertname": "SpecdeployEngineNotReady",
                  "exp_alerts": [{"exp_labels": {"severity": "critical", "host": "gpu-c", "job": "specdeploy_engine"},
                                  "exp_annotations": {
                                      "summary": "Engine on gpu-c has not been ready for 1h (the deploy timeout)"}}]},
                 {"eval_time": "3m", "alertname": "SpecdeployGroupRankLost", "exp_alerts": []},
                 {"eval_time": "4m", "alertname": "SpecdeployGroupRankLost",
                  "exp_alerts": [{"exp_labels": {"severity": "critical", "host": "gpu-e", "rank": "1",
                                                 "rank_host": "gpu-f"},
                                  "exp_annotations": {
                                      "summary": "Rank 1 (gpu-f) left the serving group led by gpu-e",
                                      "description": "It holds no connection to its leader's rendezvous port, so "
                                                     "the group cannot serve: the leader still answers its health "
                                                     "check, and its next request fails. Run `specdeploy triage "
                                                     "--journal specdeploy-<engine>.service` on gpu-f."}}]},
                 {"eval_time": "6m", "alertname": "SpecdeployExporterInputInvalid", "exp_alerts": []},
                 {"eval_time": "7m", "alertname": "SpecdeployExporterInputInvalid",
                  "exp_alerts": [{"exp_labels": {"severity": "warning", "host": "gpu-b", "file": "gate"},
                                  "exp_annotations": {
                                      "summary": "The gate file the exporter on gpu-b reads is invalid",
                                      "description": "Its figures are dropped until it is fixed; the exporter's "
                                                     "journal names the file and what is wrong."}}]},
                 {"eval_time": "6m", "alertname": "SpecdeployKVCacheNearFull",
                  "exp_alerts": [{"exp_labels": {"severity": "warning", "host": "gpu-a"},
                                  "exp_annotations": {"summary": "KV cache 97% full on gpu-a"}}]},
             ]}]}
    tf = tmp_path / "rules_test.yml"
    tf.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(tf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


class _Static(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def _query(base, q):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    return json.load(urllib.request.urlopen(url, timeout=10))


def test_every_panel_returns_data_from_real_prometheus(tmp_path):
    hosts = {"vllm": "127.0.0.2", "sglang": "127.0.0.3"}
    procs, targets = [], []
    # each host's state directory as the deploy leaves it: the gate's report and the current-release mark, which
    # the exporter reads at scrape time (the dashboard's per-release panels join on it)
    releases, groups = {"vllm": "rel-a", "sglang": "rel-b"}, {"vllm": "g-vllm", "sglang": "sglang-host"}
    gates = {}
    for engine, release in releases.items():
        gates[engine] = tmp_path / engine / "gate" / "gate.json"
        gates[engine].parent.mkdir(parents=True)
        gates[engine].write_text(json.dumps({"verdict": "keep", "timestamp": time.time(), "levels": [
            {"concurrency": 1, "speedup": 1.4, "breakeven_al": 1.43, "acceptance_length": 1.82, "step_ratio": 1.3,
             "predicted_step_ratio": [1.25, 1.71]}]}))
        (tmp_path / engine / "current").write_text(release + "\n")
    # ports chosen now: a real exporter (or anything) on 9400/9100 must neither clash with nor feed this test
    dcgm_port, node_port = free_port("127.0.0.2"), free_port("127.0.0.2")
    dcgm = http.server.ThreadingHTTPServer(("127.0.0.2", dcgm_port), type("D", (_Static,), {
        "body": (REPO / "tests/data/dcgm-sample.prom").read_bytes()}))
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    # the vLLM host leads a serving group of three: rank 1 (127.0.0.6) holds a connection to its rendezvous port,
    # rank 2 (127.0.0.7) none
    rdv_port = free_port("127.0.0.2")
    rdv = socket.create_server(("127.0.0.2", rdv_port))
    rank1 = socket.socket()
    rank1.bind(("127.0.0.6", 0))
    rank1.connect(("127.0.0.2", rdv_port))
    group = ("--group-port", str(rdv_port), "--group-rank", "rank1-host=127.0.0.6", "--group-rank",
             "rank2-host=127.0.0.7")
    # the vLLM host's engine attaches to a weight-cache daemon: its health (any 200 answers) and the deploy's record
    record = tmp_path / "weight-cache.json"
    record.write_text(json.dumps({"daemon": {"load_s": 1830.0, "memory_gib_per_rank": 70.1},
                                  "engine": {"ready_s": 41.5, "attached": True, "disk_fallback": False}}))
    group += ("--weight-cache-health", f"http://127.0.0.2:{dcgm_port}/health", "--weight-cache-record", str(record))
    # and the price of speculation was measured on it (breakeven --measure's surface at the sims' k=3)
    surface = tmp_path / "surface.json"
    surface.write_text(json.dumps({"kind": "specdeploy-speculation-surface", "engine": "vllm", "release": "test",
                                   "margin": 0.1, "concurrency": [1], "points": [
                                       {"k": 3, "concurrency": 1, "al_measured": al, "speedup": al / 1.3}
                                       for al in (1.5, 2.5)]}))
    group += ("--surface-file", str(surface))
    try:
        for engine, addr in hosts.items():
            ep, xp = free_port(addr), free_port(addr)
            procs.append(start_sim(engine, addr, ep))
            procs.append(start_exporter(engine, f"http://{addr}:{ep}", addr, xp, gate_file=gates[engine],
                                        info=("spec_tokens=3",),  # the sims draft k=3, as the unit would say
                                        extra=group if engine == "vllm" else ()))
            targets.append({"host": f"{engine}-host", "address": addr, "engine": engine, "engine_port": ep,
                            "exporter_port": xp, "dcgm_port": dcgm_port, "node_port": node_port,
                            "group": groups[engine]})
        rules = tmp_path / "rules.yml"
        rules.write_text(render_rules(eval_interval="1s"))
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(render_prometheus(targets, [str(rules)], scrape_interval="1s"))
        port = free_port()
        prom = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(prom)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/-/ready", timeout=30)
        deadline = time.time() + 25
        while time.time() < deadline:  # keep traffic flowing so rates have data
            for t in targets:
                load(f"http://{t['address']}:{t['engine_port']}", n=2, max_tokens=20)
            time.sleep(0.5)
            if time.time() > deadline - 15 and all(
                    _query(base, q)["data"]["result"] for _, q in panel_queries("15s")):
                break
        empty = [(title, q) for title, q in panel_queries("15s") if not _query(base, q)["data"]["result"]]
        assert not empty, empty
        # both engines show up under the engine-independent names
        res = _query(base, "specdeploy_spec_acceptance_length")["data"]["result"]
        assert {r["metric"]["engine"] for r in res} == {"vllm", "sglang"}
        # the roofline's break-even beside the measured one: both routing models, as the gate report gives them
        from specdeploy.speculation import metrics as M
        pred = {(r["metric"]["host"], r["metric"]["routing"]): float(r["value"][1])
                for r in _query(base, M.Q_BREAKEVEN_PREDICTED)["data"]["result"]}
        assert pred == {(h, routing): v for h in ("vllm-host", "sglang-host")
                        for routing, v in (("local", 1.25), ("uniform", 1.71))}
        assert {float(r["value"][1]) for r in _query(base, M.Q_BREAKEVEN_MEASURED)["data"]["result"]} == {1.3}
        joined = {(r["metric"]["host"], r["metric"]["rank"], r["metric"]["rank_host"]): float(r["value"][1])
                  for r in _query(base, "specdeploy_group_rank_joined")["data"]["result"]}
        assert joined == {("vllm-host", "1", "rank1-host"): 1.0, ("vllm-host", "2", "rank2-host"): 0.0}
        # the fleet's row: per release and per serving group, and a drill-down to one host keeps only its series
        every = panel_queries("15s")

        def by(title, label, queries=every):  # the panel's first query
            q = next(q for t, q in queries if t == title)
            return {r["metric"].get(label): float(r["value"][1]) for r in _query(base, q)["data"]["result"]}
        assert by("Engines serving and down, per release", "release") == {"rel-a": 1.0, "rel-b": 1.0}
        assert set(by("Acceptance length per release: mean, lowest and highest host", "release")) == {"rel-a", "rel-b"}
        assert set(by("Acceptance length, the 10 lowest serving groups (mean over their hosts)", "group")) == {
            "g-vllm", "sglang-host"}
        assert by("Ranks not joined to their leader, per serving group (above 0: the group cannot serve)",
                  "group") == {"g-vllm": 1.0}
        one = panel_queries("15s", host="sglang-host")
        assert set(by("Output tokens/s per release", "release", one)) == {"rel-b"}
        assert set(by("Output tokens/s", "host", one)) == {"sglang-host"}
        assert set(by("Output tokens/s", "host")) == {"vllm-host", "sglang-host"}
        # DCGM answers on the vLLM host's address only; its targets carry the group, not the release
        assert set(by("GPU utilization", "host", panel_queries("15s", group="g-vllm"))) == {"vllm-host"}
        assert not by("GPU utilization", "host", one)
        assert not by("Output tokens/s", "host", panel_queries("15s", release="rel-b", group="g-vllm"))
        _report_per_release_group_and_host(base, tmp_path)
    finally:
        stop(*procs)
        dcgm.shutdown()
        rank1.close()
        rdv.close()


def _report_per_release_group_and_host(base, tmp_path):
    """`specdeploy report` on the same Prometheus: a fleet's lines per release or group, computed in Prometheus,
    equal the hosts' own where each holds one host; a drill-down keeps the selected host; "auto" switches to per
    release above its host count; a selector is matched exactly, never as PromQL."""
    import specdeploy.speculation.report as report
    now = time.time()
    # every render reads the same samples: a scrape timestamped before `now` but stored after the first render
    # would change the later ones (seen once in CI). Scrapes are 1 s apart with a 1 s timeout, so after 2.5 s every
    # sample up to `now` is stored.
    time.sleep(2.5)
    hosts = report.render(base, tmp_path / "hosts.png", 60, now=now, by="host")
    rel = report.render(base, tmp_path / "rel.png", 60, now=now, by="release")
    grp = report.render(base, tmp_path / "grp.png", 60, now=now, by="group")
    assert hosts["hosts"] == rel["hosts"] == 2 and rel["by"] == "release"
    for key in ("acceptance", "tokens"):
        assert set(rel["last"][key]) == {"rel-a", "rel-b"} and set(grp["last"][key]) == {"g-vllm", "sglang-host"}
        assert rel["last"][key]["rel-b"] == grp["last"][key]["sglang-host"] == hosts["last"][key]["sglang-host"]
        assert rel["last"][key]["rel-a"] == hosts["last"][key]["vllm-host"]
    assert set(rel["last"]["speedup"]) == {"rel-a c=1", "rel-b c=1"}
    one = report.render(base, tmp_path / "one.png", 60, now=now, select={"host": ["sglang-host"]})
    assert one["by"] == "host" and one["hosts"] == 1 and set(one["last"]["acceptance"]) == {"sglang-host"}
    assert hosts["drawn"] == {k: sorted(v) for k, v in hosts["last"].items()}  # under 12 lines: all drawn
    old = report.HOST_LINES, report.LINES
    report.HOST_LINES, report.LINES = 1, 1
    try:
        auto = report.render(base, tmp_path / "auto.png", 60, now=now)
        assert auto["by"] == "release"
        # one line a panel, one of the two releases; which one is worst by its mean over the range is checked by
        # test_a_panel_of_many_lines_draws_the_worst_by_their_mean (here the values move while the scrapes warm up)
        for key in ("acceptance", "tokens"):
            assert len(auto["last"][key]) == 2 and len(auto["drawn"][key]) == 1
            assert set(auto["drawn"][key]) <= set(auto["last"][key])
    finally:
        report.HOST_LINES, report.LINES = old
    odd = report.render(base, tmp_path / "odd.png", 60, now=now,
                        select={"host": ['sglang-host"} or vector(1) # $x', ".*"], "release": ["rel-b"]})
    assert odd["hosts"] == 0 and not any(odd["last"].values())
    assert (tmp_path / "odd.png").read_bytes()[:4] == b"\x89PNG"



def test_a_panel_of_many_lines_draws_the_worst_by_their_mean():
    from specdeploy.speculation.report import worst
    nan = float("nan")
    series = {f"g{i:03d}": [(0, 3.0 - i / 100), (1, 3.0 - i / 100)] for i in range(40)}
    series["g-nan"] = [(0, nan)]  # a series with no value is neither worst nor best: it goes last
    series["g-spike"] = [(0, 0.5), (1, 5.0)]  # its mean (2.75) ranks it, not its last or lowest point
    low = worst(series, 3, "low")
    assert list(low) == ["g039", "g038", "g037"]
    assert list(worst(series, 3, "high")) == ["g000", "g001", "g002"]
    assert "g-spike" in worst(series, 15, "low") and "g-spike" not in worst(series, 14, "low")
    assert "g-nan" not in worst(series, 41, "low") and "g-nan" not in worst(series, 41, "high")
    assert len(worst(series, 42, "low")) == 42
    assert worst(series, 100, "low") is series
