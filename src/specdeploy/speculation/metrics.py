"""The one definition of specdeploy's metric names and of the PromQL built on them.

The exporter publishes these names with these help texts; the Prometheus rules, the Grafana dashboard,
``specdeploy status`` and ``specdeploy report`` all query them through the expressions below.
"""
from __future__ import annotations

# name -> (type, help)
EXPORTED: dict[str, tuple[str, str]] = {
    "specdeploy_engine_up": ("gauge", "1 when the last engine scrape succeeded and parsed"),
    "specdeploy_exporter_scrape_errors": ("counter", "Failed or unparsable engine scrapes"),
    "specdeploy_exporter_input_valid": ("gauge", "0 while an input file (gate report, release mark) is invalid and "
                                        "its figures are dropped; 1 when it is valid or absent"),
    "specdeploy_engine": ("info", "What is deployed"),
    "specdeploy_spec_acceptance_rate": ("gauge", "Accepted / draft tokens over the window"),
    "specdeploy_spec_acceptance_length": ("gauge", "1 + accepted / drafts over the window (bonus token included)"),
    "specdeploy_spec_position_acceptance_rate": ("gauge", "Accepted at position / drafts over the window"),
    "specdeploy_spec_drafts": ("counter", "Engine drafts (re-exported)"),
    "specdeploy_spec_draft_tokens": ("counter", "Engine draft tokens (re-exported)"),
    "specdeploy_spec_accepted_tokens": ("counter", "Engine accepted tokens (re-exported)"),
    "specdeploy_gate_speedup": ("gauge", "Measured speedup of speculation vs none"),
    "specdeploy_gate_breakeven_acceptance_length": ("gauge", "Acceptance length at which speculation breaks even"),
    "specdeploy_gate_acceptance_length": ("gauge", "Acceptance length the gate measured"),
    "specdeploy_gate_step_ratio": ("gauge", "Step-time ratio the gate measured: acceptance length / speedup (1.0x "
                                   "is reached where the live acceptance length equals it)"),
    "specdeploy_gate_predicted_step_ratio": ("gauge", "Step-time ratio the roofline predicts at the gate's k and "
                                             "level (verify plus draft over one decode step), for local and for "
                                             "uniform expert routing: the acceptance length it needs for 1.0x"),
    "specdeploy_surface_needed_acceptance_length": ("gauge", "Acceptance length speculation at the deployed k needs "
                                                    "per load band (from_batch running requests), for 1.0x and "
                                                    "for 1 + the gate's margin, as the engine measured it on this "
                                                    "host (specdeploy breakeven --measure)"),
    "specdeploy_surface_needed_acceptance_length_now": ("gauge", "The measured acceptance length for 1.0x in the "
                                                        "load band of the engine's running requests now"),
    "specdeploy_gate_verdict": ("gauge", "1 for the gate's current verdict"),
    "specdeploy_gate_failed_requests": ("gauge", "Requests that failed during the gate's last measurement"),
    "specdeploy_gate_timestamp_seconds": ("gauge", "When the gate last ran"),
    "specdeploy_group_rank_joined": ("gauge", "On a serving group's leader, per other rank: 1 while that rank holds a "
                                     "connection to the leader's rendezvous port, 0 when it holds none (it went "
                                     "away: the group cannot serve, though the leader's health check still "
                                     "answers until its next step)"),
    "specdeploy_weight_cache_expected": ("gauge", "1 where the deployed engine attaches to a weight-cache daemon"),
    "specdeploy_weight_cache_up": ("gauge", "1 while the weight-cache daemon answers its own health check (every "
                                   "local rank serving its weights), 0 when it does not"),
    "specdeploy_weight_cache_memory_bytes": ("gauge", "GPU memory one rank of the weight-cache daemon held after "
                                             "its last full load, as its log says (absent where the release does "
                                             "not print it)"),
    "specdeploy_weight_cache_load_seconds": ("gauge", "How long the weight-cache daemon's last full load took"),
    "specdeploy_engine_start_seconds": ("gauge", "How long the engine's last start took to readiness, by how it "
                                        "got its weights: attached (from the daemon), disk (the release's own fall "
                                        "back to a disk load) or unknown"),
}


def help_of(name: str) -> str:
    return EXPORTED[name][1]


def _each(expr) -> str:
    """One expression over every registered engine: ``expr(serving)`` per engine, where ``serving`` maps our
    names (ttft, itl, generation_tokens, running, waiting, kv_cache, ...) to that engine's metric, joined by
    ``or`` (each host runs one engine)."""
    from specdeploy.engines import adapters
    return " or ".join(expr(a.metrics.serving) for a in adapters())


# serving figures, per host; R is the rate window ("$__rate_interval" in Grafana, "1m" elsewhere)
def q_tokens_per_s(r: str) -> str:
    return _each(lambda m: f"sum by (host) (rate({m['generation_tokens']}[{r}]))")


def _quantile(quantile: float, histogram: str, r: str) -> str:
    return _each(lambda m: f"histogram_quantile({quantile}, sum by (host, le) (rate({m[histogram]}_bucket[{r}])))")


def q_ttft(quantile: float, r: str) -> str:
    return _quantile(quantile, "ttft", r)


def q_itl(quantile: float, r: str) -> str:
    return _quantile(quantile, "itl", r)


def q_itl_mean(r: str) -> str:
    return _each(lambda m: f"sum by (host) (rate({m['itl']}_sum[{r}])) / sum by (host) (rate({m['itl']}_count[{r}]))")


def q_running() -> str:
    return _each(lambda m: f"sum by (host) ({m['running']})")


def q_waiting() -> str:
    return _each(lambda m: f"sum by (host) ({m['waiting']})")


def q_kv() -> str:
    return _each(lambda m: f"max by (host) ({m['kv_cache']})")


# speculation is on where the deployed unit says so (the exporter's info carries the draft-token count)
Q_SPEC_ON = 'max by (host) (specdeploy_engine_info{spec_tokens!="0",spec_tokens!=""})'
# speculation's speedup now: the live acceptance length over the acceptance length 1.0x needs, where the host's
# measured price gives it for the load band the engine is in (breakeven --measure), else over the step-time ratio
# the gate measured (its levels averaged, as its verdict weighs them)
Q_PREDICTED_SPEEDUP = ("(specdeploy_spec_acceptance_length / on (host) "
                       "max by (host) (specdeploy_surface_needed_acceptance_length_now)) or "
                       "(specdeploy_spec_acceptance_length / on (host) "
                       "avg by (host) (specdeploy_gate_step_ratio))")
# the acceptance length speculation needs for 1.0x on each host, over the gate's levels as the verdict weighs them:
# measured (the gate's step ratio) and predicted by the roofline (one line per routing model)
Q_BREAKEVEN_MEASURED = "avg by (host) (specdeploy_gate_step_ratio)"
Q_BREAKEVEN_PREDICTED = "avg by (host, routing) (specdeploy_gate_predicted_step_ratio)"
# ... and measured by the engine's price on the host for the load band it is in now (speculation/surface.py)
Q_BREAKEVEN_SURFACE = "max by (host) (specdeploy_surface_needed_acceptance_length_now)"
# a weight-cache daemon down while its engine expects it (the engine bound to it stops with it)
Q_WEIGHT_CACHE_DOWN = "specdeploy_weight_cache_expected == 1 unless on (host) specdeploy_weight_cache_up == 1"
# the label of the alerts that ask `specdeploy regate` for a new gate run on their host
REGATE_LABEL = ("specdeploy_action", "regate")
# the live acceptance length against the gate's own measurement
Q_AL_VS_GATE = ("specdeploy_spec_acceptance_length / on (host) "
                "avg by (host) (specdeploy_gate_acceptance_length)")
# engine outages Prometheus saw in a day (up dropping to 0): engine-independent, and neither engine's multiprocess
# metrics mode exports a process start time; a restart quicker than one scrape interval is not seen
Q_RESTARTS = 'sum by (host) (resets(up{job="specdeploy_engine"}[1d]))'


# The fleet's view. Every query above gives one series per host (and per concurrency or rank where it says so); a
# fleet reads them per serving group and per release. The release is a label of the exporter's info (the deployed
# release mark, read at scrape time), the serving group a label of every scrape target (a host that serves alone is
# its own group). Both are joined in by host, so any per-host expression aggregates the same way.
INFO = "specdeploy_engine_info"
FLEET_KEYS = ("group", "release")


def per(expr: str, key: str, agg: str = "avg", keep: tuple[str, ...] = ()) -> str:
    """``expr`` (series with a host label) as ``agg`` per ``key`` ("host" returns it unchanged); ``keep`` names
    labels of ``expr`` that stay apart (concurrency, routing)."""
    if key == "host":
        return expr
    if key not in FLEET_KEYS or agg not in ("avg", "min", "max", "sum", "count"):
        raise ValueError(f"cannot aggregate {agg} per {key}")
    by = ", ".join((key, *keep))
    return f"{agg} by ({by}) (({expr}) * on (host) group_left ({key}) max by (host, {key}) ({INFO}))"


def only(expr: str, selector: str) -> str:
    """``expr`` for the hosts whose info matches ``selector`` (PromQL label matchers, '' for every host)."""
    return f"({expr}) and on (host) max by (host) ({INFO}{{{selector}}})" if selector else expr


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal holding ``value`` exactly."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def matchers(**values: list[str]) -> str:
    """Label matchers selecting hosts whose label equals one of the given values, per label (exact, not a
    pattern: every value is escaped); '' where nothing is asked."""
    import re
    out = []
    for label, vals in values.items():
        if vals:
            alts = "|".join(re.escape(v) for v in vals)
            out.append(f"{label}=~{promql_string(alts)}")
    return ", ".join(out)

