"""The weight-cache daemon in monitoring: the alert when a daemon is down while its engine expects it (promtool),
and the exporter's figures from the daemon's health check and the deploy's record."""
import json
import shutil
import subprocess
import urllib.request

import pytest
import yaml

from helpers import free_port, start_exporter, stop
from specdeploy.speculation.monitoring import render_rules

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="needs Debian's prometheus package (scripts/setup.sh installs it)")


@needs_promtool
def test_weight_cache_down_alert_fires_only_where_an_engine_expects_its_daemon(tmp_path):
    rules = tmp_path / "specdeploy.rules.yml"
    rules.write_text(render_rules())
    series = [
        # gpu-a: its daemon goes down at minute 3 and stays down
        {"series": 'specdeploy_weight_cache_expected{host="gpu-a"}', "values": "1x10"},
        {"series": 'specdeploy_weight_cache_up{host="gpu-a"}', "values": "1 1 1 0 0 0 0 0 0 0 0"},
        # gpu-b: up all along
        {"series": 'specdeploy_weight_cache_expected{host="gpu-b"}', "values": "1x10"},
        {"series": 'specdeploy_weight_cache_up{host="gpu-b"}', "values": "1x10"},
        # gpu-c: down for one minute only (a restart): below the alert's 1m
        {"series": 'specdeploy_weight_cache_expected{host="gpu-c"}', "values": "1x10"},
        {"series": 'specdeploy_weight_cache_up{host="gpu-c"}', "values": "1 1 1 0 1 1 1 1 1 1 1"},
        # gpu-d: an engine without a daemon publishes neither series; its exporter lost the up series: down too
        {"series": 'specdeploy_weight_cache_expected{host="gpu-e"}', "values": "1x10"},
    ]
    want = {"summary": "The weight-cache daemon on {h} is down while its engine expects it",
            "description": "The engine maps its weights from the daemon: it stops with it, and cannot start without "
                           "it. Run `specdeploy triage --journal specdeploy-<engine>-weights.service` on the host; "
                           "starting the engine starts the daemon first (a full load), as does the next deploy."}

    def alert(h):
        return {"exp_labels": {"severity": "critical", "host": h},
                "exp_annotations": {k: v.format(h=h) for k, v in want.items()}}
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m",
             "group_eval_order": ["specdeploy.recording", "specdeploy.alerts"],
             "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                 {"eval_time": "3m", "alertname": "SpecdeployWeightCacheDown", "exp_alerts": [alert("gpu-e")]},
                 {"eval_time": "4m", "alertname": "SpecdeployWeightCacheDown",
                  "exp_alerts": [alert("gpu-a"), alert("gpu-e")]},
                 {"eval_time": "8m", "alertname": "SpecdeployWeightCacheDown",
                  "exp_alerts": [alert("gpu-a"), alert("gpu-e")]}]}]}
    tf = tmp_path / "rules_test.yml"
    tf.write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run(["promtool", "test", "rules", str(tf)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _scrape(url):
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(urllib.request.urlopen(url, timeout=10).read().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_exporter_publishes_the_daemons_health_and_its_record(tmp_path):
    """A ready-file daemon (SGLang's form): two ranks ready, one of them naming a dead process; the record's
    figures; then a record that is not JSON drops its figures and marks the input invalid."""
    import os
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    (sockets / "GPU-0.ready").write_text(f"pid={os.getpid()}\nconfig={{}}\n")
    (sockets / "GPU-1.ready").write_text("pid=999999999\n")
    record = tmp_path / "rec.json"
    record.write_text(json.dumps({"daemon": {"load_s": 1830.0, "memory_gib_per_rank": 70.0},
                                  "engine": {"ready_s": 41.5, "attached": True, "disk_fallback": False}}))
    port = free_port()
    health = f"files:{sockets}/*.ready:2"
    p = start_exporter("sglang", "http://127.0.0.1:9", "127.0.0.1", port,
                       extra=("--weight-cache-health", health, "--weight-cache-record", str(record)))
    try:
        m = _scrape(f"http://127.0.0.1:{port}/metrics")
        assert m[("specdeploy_weight_cache_expected", ())] == 1
        assert m[("specdeploy_weight_cache_up", ())] == 0  # one of two ranks names a live process
        assert m[("specdeploy_weight_cache_memory_bytes", ())] == 70.0 * (1 << 30)
        assert m[("specdeploy_weight_cache_load_seconds", ())] == 1830.0
        assert m[("specdeploy_engine_start_seconds", (("how", "attached"),))] == 41.5
        assert m[("specdeploy_exporter_input_valid", (("file", "weight_cache"),))] == 1
        (sockets / "GPU-1.ready").write_text(f"pid={os.getpid()}\n")
        record.write_text("not json")
        import time
        time.sleep(1.2)  # the health probe's answer is kept for a second
        m = _scrape(f"http://127.0.0.1:{port}/metrics")
        assert m[("specdeploy_weight_cache_up", ())] == 1
        assert ("specdeploy_weight_cache_load_seconds", ()) not in m
        assert m[("specdeploy_exporter_input_valid", (("file", "weight_cache"),))] == 0
    finally:
        stop(p)
