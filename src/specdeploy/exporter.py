"""Speculative-decoding exporter: one engine-independent set of metrics for engines that count drafts (vLLM's
counters) and engines that publish acceptance gauges (SGLang). Which metric is which comes from the adapter.

It scrapes the engine's /metrics whenever it is scraped itself (reusing a result at most 1 s old), keeps its own
samples of the engine counters for ``--window`` seconds and derives acceptance rate, acceptance length and
per-position acceptance over that window. A dead, slow or garbage-returning engine never crashes it.

SGLang publishes acceptance as gauges of its own recent batches, and they read 0 before any traffic and whenever
speculation is off. An acceptance length counts the bonus token, so a real one is at least 1: a 0 means "no
figure", and the exporter reports nothing then instead of averaging it in.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families

from .engines import get
from .metrics import help_of


@dataclass
class Sample:
    t: float
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[str, float] = field(default_factory=dict)
    al: float | None = None  # acceptance gauges
    rate: float | None = None
    has_counters: bool = False
    itl_sum: float = 0.0  # the engine's inter-token latency histogram (seconds), for the gate
    itl_count: float = 0.0


class ParseError(ValueError):
    pass


def parse_engine_metrics(engine: str, text: str, t: float) -> Sample:
    counters, gauges = get(engine).metrics.spec_counters, get(engine).metrics.spec_gauges
    itl = get(engine).metrics.serving.get("itl")
    s = Sample(t)
    found = False
    gauge_al: list[float] = []
    gauge_rate: list[float] = []
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises bare ValueErrors and more on garbage
        raise ParseError(f"unparsable /metrics: {exc}") from None
    for fam in families:
        for smp in fam.samples:
            if itl and smp.name == f"{itl}_sum":
                s.itl_sum += smp.value
                continue
            if itl and smp.name == f"{itl}_count":
                s.itl_count += smp.value
                continue
            if counters:
                if smp.name == counters.get("drafts"):
                    s.drafts += smp.value
                elif smp.name == counters.get("draft_tokens"):
                    s.draft_tokens += smp.value
                elif smp.name == counters.get("accepted_tokens"):
                    s.accepted += smp.value
                elif smp.name == counters.get("accepted_tokens_per_pos"):
                    pos = smp.labels.get("position", "?")
                    s.per_pos[pos] = s.per_pos.get(pos, 0.0) + smp.value
                else:
                    continue
                found = s.has_counters = True
            else:
                if smp.name == gauges.get("acceptance_length"):
                    gauge_al.append(smp.value)
                    found = True
                elif smp.name == gauges.get("acceptance_rate"):
                    gauge_rate.append(smp.value)
                    found = True
    if not found and not any(f.name.startswith(engine + ":") for f in families):
        raise ParseError(f"no {engine}: metrics in the engine's /metrics")
    # gauges: one per rank; ranks without a figure (0: no traffic yet, or speculation off) say nothing
    real = [al for al in gauge_al if al >= 1.0]
    if real:
        s.al = sum(real) / len(real)
        rates = [r for al, r in zip(gauge_al, gauge_rate) if al >= 1.0] if len(gauge_rate) == len(gauge_al) \
            else gauge_rate
        if rates:
            s.rate = sum(rates) / len(rates)
    return s


class SpecCollector:
    def __init__(self, engine: str, url: str, window: float = 60.0, info: dict | None = None,
                 gate_file: Path | None = None, timeout: float = 2.0, cache_s: float = 1.0,
                 release_file: Path | None = None):
        # counters (else acceptance gauges); an unknown engine is a ValueError (UnsupportedVersion)
        self.counting = bool(get(engine).metrics.spec_counters)
        self.engine, self.url, self.window = engine, url.rstrip("/") + "/metrics", window
        self.info = {"engine": engine, "version": "", "patch_set": "", "drafter": "", "spec_tokens": "0"}
        self.info.update(info or {})
        self.gate_file, self.timeout, self.cache_s = gate_file, timeout, cache_s
        self.release_file = release_file
        self.samples: deque[Sample] = deque()
        self.errors = 0
        self.up = 0
        self.last_scrape = 0.0
        self.lock = threading.Lock()

    def _scrape(self):
        now = time.monotonic()
        if now - self.last_scrape < self.cache_s and self.samples:
            return
        self.last_scrape = now
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as resp:
                if resp.status != 200:
                    raise ParseError(f"HTTP {resp.status}")
                text = resp.read(32 << 20).decode("utf-8", "replace")
            s = parse_engine_metrics(self.engine, text, now)
        except Exception:  # noqa: BLE001 - any failure means the engine is not readable right now
            self.errors += 1
            self.up = 0
            return
        self.up = 1
        self.samples.append(s)
        while len(self.samples) > 1 and now - self.samples[0].t > self.window:
            self.samples.popleft()

    def collect(self):
        with self.lock:
            self._scrape()
            samples = list(self.samples)
            up, errors = self.up, self.errors
        yield GaugeMetricFamily("specdeploy_engine_up", help_of("specdeploy_engine_up"), value=up)
        yield CounterMetricFamily("specdeploy_exporter_scrape_errors",
                                  help_of("specdeploy_exporter_scrape_errors"), value=errors)
        yield InfoMetricFamily("specdeploy_engine", help_of("specdeploy_engine"), value=self._info())
        if samples:
            yield from self._spec(samples)
        yield from self._gate()

    def _spec(self, samples):
        last = samples[-1]
        rate = GaugeMetricFamily("specdeploy_spec_acceptance_rate", help_of("specdeploy_spec_acceptance_rate"))
        al = GaugeMetricFamily("specdeploy_spec_acceptance_length", help_of("specdeploy_spec_acceptance_length"))
        pos = GaugeMetricFamily("specdeploy_spec_position_acceptance_rate",
                                help_of("specdeploy_spec_position_acceptance_rate"), labels=["position"])
        if self.counting and last.has_counters:
            first = samples[0] if len(samples) > 1 else Sample(last.t, per_pos={k: 0.0 for k in last.per_pos})
            d = last.drafts - first.drafts
            dt = last.draft_tokens - first.draft_tokens
            a = last.accepted - first.accepted
            if d < 0 or dt < 0 or a < 0:  # engine restarted inside the window: use its own totals
                first = Sample(last.t, per_pos={k: 0.0 for k in last.per_pos})
                d, dt, a = last.drafts, last.draft_tokens, last.accepted
            if dt > 0:
                rate.add_metric([], a / dt)
            if d > 0:
                al.add_metric([], 1 + a / d)
                for p in sorted(last.per_pos, key=lambda x: int(x) if x.isdigit() else 0):
                    pos.add_metric([p], (last.per_pos[p] - first.per_pos.get(p, 0.0)) / d)
            for name, v in (("specdeploy_spec_drafts", last.drafts),
                            ("specdeploy_spec_draft_tokens", last.draft_tokens),
                            ("specdeploy_spec_accepted_tokens", last.accepted)):
                yield CounterMetricFamily(name, help_of(name), value=v)
        elif not self.counting:
            # acceptance gauges already cover the engine's own recent batches: report its latest real figure, and only
            # while one was seen inside the window (samples without a figure were dropped at parse time)
            real = [s for s in samples if s.al is not None]
            if real:
                al.add_metric([], real[-1].al)
                if real[-1].rate is not None:
                    rate.add_metric([], real[-1].rate)
        yield rate
        yield al
        yield pos

    def _info(self) -> dict:
        """The deployed release is read at scrape time: a deploy switches it without restarting the exporter."""
        info = dict(self.info)
        if self.release_file:
            try:
                info["release"] = self.release_file.read_text().strip()[:64]
            except OSError:
                info["release"] = ""
        return info

    def _gate(self):
        if not self.gate_file or not self.gate_file.is_file():
            return
        try:
            rep = json.loads(self.gate_file.read_text())
        except (OSError, json.JSONDecodeError):
            return
        sp = GaugeMetricFamily("specdeploy_gate_speedup", help_of("specdeploy_gate_speedup"), labels=["concurrency"])
        be = GaugeMetricFamily("specdeploy_gate_breakeven_acceptance_length",
                               help_of("specdeploy_gate_breakeven_acceptance_length"), labels=["concurrency"])
        for lvl in rep.get("levels", []):
            c = str(lvl.get("concurrency"))
            if lvl.get("speedup") is not None:
                sp.add_metric([c], lvl["speedup"])
            if lvl.get("breakeven_al") is not None:
                be.add_metric([c], lvl["breakeven_al"])
        yield sp
        yield be
        v = GaugeMetricFamily("specdeploy_gate_verdict", help_of("specdeploy_gate_verdict"), labels=["verdict"])
        for verdict in ("keep", "reduce-k", "disable", "undecided"):
            v.add_metric([verdict], 1.0 if (rep.get("verdict") or "undecided") == verdict else 0.0)
        yield v
        yield GaugeMetricFamily("specdeploy_gate_failed_requests", help_of("specdeploy_gate_failed_requests"),
                                value=float(sum(int(lv.get("errors") or 0) for lv in rep.get("levels", []))))
        yield GaugeMetricFamily("specdeploy_gate_timestamp_seconds", help_of("specdeploy_gate_timestamp_seconds"),
                                value=float(rep.get("timestamp", 0)))


def serve(engine: str, url: str, listen: str, window: float, info: dict, gate_file: Path | None):
    from prometheus_client import start_http_server
    from prometheus_client.core import CollectorRegistry
    reg = CollectorRegistry()
    release = gate_file.parent.parent / "current" if gate_file else None  # <state dir>/gate/.. -> <state dir>
    reg.register(SpecCollector(engine, url, window, info, gate_file, release_file=release))
    host, _, port = listen.rpartition(":")
    server, thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=reg)
    return server, thread
