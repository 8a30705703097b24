"""Prometheus rules and the Grafana dashboard, both from the metric definitions in ``metrics.py``.

The dashboard is built with Grafana's Foundation SDK (``grafana-foundation-sdk``); every panel's PromQL comes from
``panels()``, which the tests evaluate against a real Prometheus and ``specdeploy report`` renders without Grafana.
The third-party facts used here and by the monitoring role (ports, units, DCGM field names, Grafana's signing key)
are listed with their sources in docs/monitoring.md.
"""
from __future__ import annotations

import json
import time

from specdeploy.speculation import metrics as M
from specdeploy.engines import names as engine_names
from specdeploy.plan.render.systemd import jinja_env

RULE_DEFAULTS = {"eval_interval": "15s", "ready_timeout": "1h", "min_acceptance_length": 2.0,
                 "kv_cache_full": 0.95, "ttft_slo_seconds": 2.0, "itl_slo_seconds": 0.1,
                 # the continuous gate: how long the live figures must stay below the gate's before a re-gate,
                 # and how far acceptance may decay against the gate's measurement before a warning
                 "regate_after": "10m", "al_decay": 0.9, "al_decay_for": "30m"}
REGATE_LABEL = M.REGATE_LABEL


def render_rules(**overrides) -> str:
    ctx = dict(RULE_DEFAULTS, **overrides)
    ctx.update(q_tokens_1m=M.q_tokens_per_s("1m"), q_ttft_p95_5m=M.q_ttft(0.95, "5m"),
               q_itl_p95_5m=M.q_itl(0.95, "5m"), q_kv=M.q_kv(), q_spec_on=M.Q_SPEC_ON,
               q_predicted_speedup=M.Q_PREDICTED_SPEEDUP, q_al_vs_gate=M.Q_AL_VS_GATE, regate_label=REGATE_LABEL,
               q_weight_cache_down=M.Q_WEIGHT_CACHE_DOWN)
    return jinja_env().get_template("monitoring/specdeploy.rules.yml.j2").render(**ctx)


R = "$__rate_interval"
# the dashboard's drill-down: its release, serving group and host variables ("All" is .*) select the hosts every
# panel shows; the per-host panels keep only the selected hosts' series, the fleet panels aggregate over them
VARIABLES = ("release", "group", "host")
SELECTED = ", ".join(f'{v}=~"${v}"' for v in VARIABLES)
# the scrape targets of the host-side exporters (node, DCGM) carry host and group but not the release
SELECTED_GPU = 'group=~"$group", host=~"$host"'
WORST = 10  # the per-group panels show the lowest groups: a fleet of a thousand hosts has a hundred groups


def _hosts(expr: str) -> str:
    return M.only(expr, SELECTED)


def fleet_panels() -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """The fleet's row: the per-host figures per release and per serving group, over the selected hosts."""
    sec = "Fleet: per release and per serving group"
    al, up = _hosts("specdeploy_spec_acceptance_length"), _hosts("specdeploy_engine_up")
    tokens, speedup = _hosts(M.q_tokens_per_s(R)), _hosts("specdeploy:spec_predicted_speedup")
    return [
        (sec, "Engines serving and down, per release", "short",
         [("{{release}} serving", M.per(up, "release", "sum")),
          ("{{release}} down", M.per(_hosts("1 - specdeploy_engine_up"), "release", "sum")),
          ("exporters unreachable", f'sum(1 - up{{job="specdeploy_exporter", {SELECTED_GPU}}})')]),
        (sec, "Acceptance length per release: mean, lowest and highest host", "none",
         [("{{release}} mean", M.per(al, "release")), ("{{release}} lowest", M.per(al, "release", "min")),
          ("{{release}} highest", M.per(al, "release", "max"))]),
        (sec, f"Acceptance length, the {WORST} lowest serving groups (mean over their hosts)", "none",
         [("{{group}}", f"bottomk({WORST}, {M.per(al, 'group')})")]),
        (sec, "Speedup now per release (live acceptance / the gate's step ratio), mean and lowest", "none",
         [("{{release}} mean", M.per(speedup, "release")), ("{{release}} lowest", M.per(speedup, "release", "min")),
          ("break-even", "vector(1)")]),
        (sec, "Hosts below break-even now, per release", "short",
         [("{{release}}", M.per(_hosts("specdeploy:spec_predicted_speedup < bool 1"), "release", "sum"))]),
        (sec, "Output tokens/s per release", "short", [("{{release}}", M.per(tokens, "release", "sum"))]),
        (sec, f"Output tokens/s, the {WORST} lowest serving groups", "short",
         [("{{group}}", f"bottomk({WORST}, {M.per(tokens, 'group', 'sum')})")]),
        (sec, "Ranks not joined to their leader, per serving group (above 0: the group cannot serve)", "short",
         [("{{group}}", f"sum by (group) ({_hosts('1 - specdeploy_group_rank_joined')})")]),
    ]


def panels() -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """(section, title, unit, [(legend, expr), ...]); serving queries cover every registered engine. The fleet's
    row first, then the per-host panels (drill down with the release, group and host variables)."""
    gpu = SELECTED_GPU
    per_host = [
        ("Speculative decoding", "Draft acceptance rate", "percentunit",
         [("{{host}}", "specdeploy_spec_acceptance_rate")]),
        ("Speculative decoding", "Acceptance length (bonus token included)", "none",
         [("{{host}}", "specdeploy_spec_acceptance_length"),
          ("alert threshold", f"vector({RULE_DEFAULTS['min_acceptance_length']})")]),
        ("Speculative decoding", "Acceptance per draft position", "percentunit",
         [("{{host}} pos {{position}}", "specdeploy_spec_position_acceptance_rate")]),
        ("Speculative decoding", "Draft and accepted tokens/s", "short",
         [("{{host}} drafted", f"sum by (host) (rate(specdeploy_spec_draft_tokens_total[{R}]))"),
          ("{{host}} accepted", f"sum by (host) (rate(specdeploy_spec_accepted_tokens_total[{R}]))")]),
        ("Speculative decoding", "Speedup vs no speculation (gate)", "none",
         [("{{host}} c={{concurrency}}", "specdeploy_gate_speedup"), ("break-even", "vector(1)")]),
        ("Speculative decoding", "Speedup now: live acceptance length / the gate's step ratio", "none",
         [("{{host}}", "specdeploy:spec_predicted_speedup"), ("break-even (re-gate below)", "vector(1)")]),
        ("Speculative decoding", "Acceptance length: live against the gate's measurement", "none",
         [("{{host}} live", "specdeploy_spec_acceptance_length"),
          ("{{host}} gate c={{concurrency}}", "specdeploy_gate_acceptance_length"),
          ("{{host}} break-even c={{concurrency}}", "specdeploy_gate_step_ratio")]),
        ("Speculative decoding", "Step-time ratio: measured by the gate against the roofline", "none",
         [("{{host}} measured c={{concurrency}}", "specdeploy_gate_step_ratio"),
          ("{{host}} predicted c={{concurrency}} {{routing}} routing", "specdeploy_gate_predicted_step_ratio")]),
        ("Speculative decoding", "Break-even: live acceptance length against the one needed for 1.0x", "none",
         [("{{host}} live", "specdeploy_spec_acceptance_length"),
          ("{{host}} needed (measured)", M.Q_BREAKEVEN_MEASURED),
          ("{{host}} needed (measured price, load band now)", M.Q_BREAKEVEN_SURFACE),
          ("{{host}} needed (roofline, {{routing}} routing)", M.Q_BREAKEVEN_PREDICTED)]),
        ("Serving", "Time to first token p50 / p99", "s",
         [("{{host}} p99", M.q_ttft(0.99, R)), ("{{host}} p50", M.q_ttft(0.5, R))]),
        ("Serving", "Inter-token latency p95", "s", [("{{host}}", M.q_itl(0.95, R))]),
        ("Serving", "Output tokens/s", "short", [("{{host}}", M.q_tokens_per_s(R))]),
        ("Serving", "Running / waiting requests", "short",
         [("{{host}} running", M.q_running()), ("{{host}} waiting", M.q_waiting())]),
        ("Serving", "KV cache usage", "percentunit", [("{{host}}", M.q_kv())]),
        ("Serving", "Serving groups: ranks joined to their leader (0: the group cannot serve)", "none",
         [("{{host}} rank {{rank}} ({{rank_host}})", "specdeploy_group_rank_joined")]),
        ("Restarts", "Weight-cache daemon up (where the engine attaches to one)", "none",
         [("{{host}}", "specdeploy_weight_cache_up and on (host) specdeploy_weight_cache_expected == 1")]),
        ("Restarts", "Engine start: attached vs the daemon's last full load", "s",
         [("{{host}} engine ({{how}})", "specdeploy_engine_start_seconds"),
          ("{{host}} daemon full load", "specdeploy_weight_cache_load_seconds")]),
    ]
    per_host = [(sec, title, unit, [(legend, expr if expr.startswith("vector(") else _hosts(expr))
                                    for legend, expr in targets]) for sec, title, unit, targets in per_host]
    return fleet_panels() + per_host + [
        ("GPU (DCGM)", "GPU utilization", "percent", [("{{host}} gpu {{gpu}}", f"DCGM_FI_DEV_GPU_UTIL{{{gpu}}}")]),
        ("GPU (DCGM)", "GPU memory used", "mbytes", [("{{host}} gpu {{gpu}}", f"DCGM_FI_DEV_FB_USED{{{gpu}}}")]),
        ("GPU (DCGM)", "GPU power", "watt", [("{{host}} gpu {{gpu}}", f"DCGM_FI_DEV_POWER_USAGE{{{gpu}}}")]),
    ]


def dashboard() -> dict:
    """The dashboard, built with the Foundation SDK and returned as Grafana's JSON model."""
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import prometheus as gp
    from grafana_foundation_sdk.builders import timeseries as gt
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh, VariableSort

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    b = (gd.Dashboard("specdeploy: speculative decoding").uid("specdeploy-spec").tags(["specdeploy", *engine_names()])
         .editable().refresh("30s").time("now-1h", "now").version(1)
         .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for name, label, query in (
            ("release", "Release", f"label_values({M.INFO}, release)"),
            ("group", "Serving group", f'label_values({M.INFO}{{release=~"$release"}}, group)'),
            ("host", "Host", f'label_values({M.INFO}{{release=~"$release", group=~"$group"}}, host)')):
        b = b.with_variable(gd.QueryVariable(name).label(label).query(query).datasource(ds).multi(True)
                            .include_all(True).all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                            .current(VariableOption(selected=True, text=["All"], value=["$__all"]))
                            .sort(VariableSort.ALPHABETICAL_ASC))
    section, pid = None, 0
    for sec, title, unit, targets in panels():
        if sec != section:
            pid += 1
            b = b.with_row(gd.Row(sec).id(pid))
            section = sec
        pid += 1
        panel = gt.Panel().id(pid).title(title).unit(unit).datasource(ds).height(8).span(8)
        for i, (legend, expr) in enumerate(targets):
            panel = panel.with_target(gp.Dataquery().expr(expr).legend_format(legend).ref_id(chr(65 + i))
                                      .datasource(ds))
        b = b.with_panel(panel)
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(b.build()))


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def panel_queries(rate_interval: str = "1m", **selected: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) with Grafana's $__rate_interval replaced, and each drill-down variable by the regex
    given for it (Grafana's "All", .*, where none is), for evaluation against Prometheus."""
    def fill(expr: str) -> str:
        expr = expr.replace(R, rate_interval)
        for v in VARIABLES:
            expr = expr.replace(f"${v}", selected.get(v, ".*"))
        return expr
    return [(title, fill(expr)) for _, title, _, targets in panels() for _, expr in targets]


def grafana_datasource(prometheus_url: str) -> str:
    return ("apiVersion: 1\ndatasources:\n  - name: Prometheus\n    type: prometheus\n    access: proxy\n"
            f"    url: {prometheus_url}\n    isDefault: true\n")


def grafana_dashboard_provider(path: str) -> str:
    return ("apiVersion: 1\nproviders:\n  - name: specdeploy\n    type: file\n    disableDeletion: false\n"
            f"    options:\n      path: {path}\n")


def gpg_key_problem(colons: str, fingerprint: str, now: float | None = None) -> str:
    """What is wrong with a downloaded repository key, from ``gpg --show-keys --with-colons`` of it: '' when one of
    its primary keys has ``fingerprint`` and is neither revoked nor expired. A key file may carry more keys (Grafana's
    holds its revoked predecessors too); only the pinned one has to be usable."""
    want = fingerprint.replace(" ", "").upper()
    now = time.time() if now is None else now
    seen, pub = [], None
    for line in colons.splitlines():
        f = line.split(":")
        if f[0] == "pub":
            pub = f
        elif f[0] == "fpr" and pub is not None and len(f) > 9:
            seen.append(f[9])
            if f[9].upper() == want:
                expires = pub[6] if len(pub) > 6 else ""
                if pub[1] == "r":
                    return f"key {want} is revoked"
                if pub[1] == "e" or (expires.isdigit() and int(expires) <= now):
                    when = time.strftime("%Y-%m-%d", time.gmtime(int(expires))) if expires.isdigit() else "?"
                    return f"key {want} expired on {when}"
                return ""
            pub = None
    if not seen:
        return "the file holds no OpenPGP public key"
    return f"no key with fingerprint {want} (the file holds {', '.join(seen)})"
