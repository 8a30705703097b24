"""Prometheus rules and the Grafana dashboard.

The dashboard is built from code here (plain Grafana JSON) rather than with grafana-foundation-sdk: every
panel's PromQL lives in one Python list that the tests evaluate against a real Prometheus, and no SDK whose
schema tracks Grafana releases has to be pinned on the controller.
"""
from __future__ import annotations

import json

from .render import jinja_env

RULE_DEFAULTS = {"eval_interval": "15s", "ready_timeout": "1h", "min_acceptance_length": 2.0,
                 "kv_cache_full": 0.95, "ttft_slo_seconds": 2.0, "itl_slo_seconds": 0.1}


def render_rules(**overrides) -> str:
    ctx = dict(RULE_DEFAULTS, **overrides)
    return jinja_env().get_template("monitoring/specdeploy.rules.yml.j2").render(**ctx)


R = "$__rate_interval"
# (section, title, unit, [(legend, expr), ...])
PANELS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("Speculative decoding", "Draft acceptance rate", "percentunit",
     [("{{host}}", "specdeploy_spec_acceptance_rate")]),
    ("Speculative decoding", "Acceptance length (bonus token included)", "none",
     [("{{host}}", "specdeploy_spec_acceptance_length"), ("alert threshold", "vector(2.0)")]),
    ("Speculative decoding", "Acceptance per draft position", "percentunit",
     [("{{host}} pos {{position}}", "specdeploy_spec_position_acceptance_rate")]),
    ("Speculative decoding", "Draft and accepted tokens/s", "short",
     [("{{host}} drafted", f"sum by (host) (rate(specdeploy_spec_draft_tokens_total[{R}]))"),
      ("{{host}} accepted", f"sum by (host) (rate(specdeploy_spec_accepted_tokens_total[{R}]))")]),
    ("Speculative decoding", "Speedup vs no speculation (gate)", "none",
     [("{{host}} c={{concurrency}}", "specdeploy_gate_speedup"), ("break-even", "vector(1)")]),
    ("Serving", "Time to first token p50 / p95", "s",
     [("{{host}} p95", f"histogram_quantile(0.95, sum by (host, le) (rate(vllm:time_to_first_token_seconds_bucket[{R}]))) or histogram_quantile(0.95, sum by (host, le) (rate(sglang:time_to_first_token_seconds_bucket[{R}])))"),
      ("{{host}} p50", f"histogram_quantile(0.5, sum by (host, le) (rate(vllm:time_to_first_token_seconds_bucket[{R}]))) or histogram_quantile(0.5, sum by (host, le) (rate(sglang:time_to_first_token_seconds_bucket[{R}])))")]),
    ("Serving", "Inter-token latency p95", "s",
     [("{{host}}", f"histogram_quantile(0.95, sum by (host, le) (rate(vllm:inter_token_latency_seconds_bucket[{R}]))) or histogram_quantile(0.95, sum by (host, le) (rate(sglang:inter_token_latency_seconds_bucket[{R}])))")]),
    ("Serving", "Output tokens/s", "short",
     [("{{host}}", f"sum by (host) (rate(vllm:generation_tokens_total[{R}])) or sum by (host) (rate(sglang:generation_tokens_total[{R}]))")]),
    ("Serving", "Running / waiting requests", "short",
     [("{{host}} running", "sum by (host) (vllm:num_requests_running) or sum by (host) (sglang:num_running_reqs)"),
      ("{{host}} waiting", "sum by (host) (vllm:num_requests_waiting) or sum by (host) (sglang:num_queue_reqs)")]),
    ("Serving", "KV cache usage", "percentunit",
     [("{{host}}", "max by (host) (vllm:kv_cache_usage_perc) or max by (host) (sglang:token_usage)")]),
    ("GPU (DCGM)", "GPU utilization", "percent", [("{{host}} gpu {{gpu}}", "DCGM_FI_DEV_GPU_UTIL")]),
    ("GPU (DCGM)", "GPU memory used", "decmbytes", [("{{host}} gpu {{gpu}}", "DCGM_FI_DEV_FB_USED")]),
    ("GPU (DCGM)", "GPU power", "watt", [("{{host}} gpu {{gpu}}", "DCGM_FI_DEV_POWER_USAGE")]),
]


def dashboard() -> dict:
    panels, y, pid = [], 0, 1
    section = None
    x = 0
    for sec, title, unit, targets in PANELS:
        if sec != section:
            if section is not None:
                y += 8
            panels.append({"id": pid, "type": "row", "title": sec, "collapsed": False,
                           "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
            pid += 1
            y += 1
            x = 0
            section = sec
        if x >= 24:
            x, y = 0, y + 8
        panels.append({
            "id": pid, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, (legend, expr) in enumerate(targets)],
        })
        pid += 1
        x += 8
    return {
        "uid": "specdeploy-spec", "title": "specdeploy: speculative decoding", "schemaVersion": 39,
        "version": 1, "editable": True, "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
        "tags": ["specdeploy", "vllm", "sglang"],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def panel_queries(rate_interval: str = "1m") -> list[tuple[str, str]]:
    """(panel title, PromQL) with Grafana's $__rate_interval replaced, for evaluation against Prometheus."""
    return [(title, expr.replace(R, rate_interval)) for _, title, _, targets in PANELS for _, expr in targets]


def grafana_datasource(prometheus_url: str) -> str:
    return ("apiVersion: 1\ndatasources:\n  - name: Prometheus\n    type: prometheus\n    access: proxy\n"
            f"    url: {prometheus_url}\n    isDefault: true\n")


def grafana_dashboard_provider(path: str) -> str:
    return ("apiVersion: 1\nproviders:\n  - name: specdeploy\n    type: file\n    disableDeletion: false\n"
            f"    options:\n      path: {path}\n")
