"""Speculative-decoding exporter: one engine-independent set of metrics for engines that count drafts (vLLM's
counters) and engines that publish acceptance gauges (SGLang). Which metric is which comes from the adapter.

It scrapes the engine's /metrics whenever it is scraped itself (reusing a result at most 1 s old), keeps its own
samples of the engine counters for ``--window`` seconds and derives acceptance rate, acceptance length and
per-position acceptance over that window. A dead, slow or garbage-returning engine never crashes it.

SGLang publishes acceptance as gauges of its own recent batches, and they read 0 before any traffic and whenever
speculation is off. An acceptance length counts the bonus token, so a real one is at least 1: a 0 means "no
figure", and the exporter reports nothing then instead of averaging it in.

Every input is untrusted. The engine is read through ``peerhttp`` (a total deadline and an 8 MiB cap: an oversized
or trickling page is a failed scrape, never held whole). Figures older than the window are dropped, so a dead
engine's last acceptance does not outlive it. The gate report and the release mark are validated on every read;
a bad one drops only the figures it feeds, sets ``specdeploy_exporter_input_valid{file=...}`` to 0 and is logged
once, naming the file.
"""
from __future__ import annotations

import json
import logging
import math
import os
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.values import peerhttp
from specdeploy.engines import get
from specdeploy.speculation.metrics import help_of
from specdeploy.topology import links

log = logging.getLogger(__name__)


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
    running: float | None = None  # requests the engine runs now (summed over its schedulers)


class ParseError(ValueError):
    pass


def aggregate_ranks(ranks: list[tuple[tuple, dict[str, float]]]) -> tuple[float | None, float | None]:
    """(acceptance length, acceptance rate) of an engine whose schedulers publish acceptance gauges (SGLang).

    Each scheduler's gauges cover its own recent batches: AL = accepted tokens / forwards, and its generated-token
    throughput is accepted tokens per second over the same interval. Schedulers with the same ``dp_rank`` label
    (none: one group) belong to one attention group and report the same batches, so a group counts once (the
    mean of its members). Across DP groups the engine's figure is total accepted tokens over total forwards: the
    harmonic mean of the groups' AL weighted by their throughput; the rate is weighted by each group's forwards
    (throughput / AL). Without a positive throughput for every group, the plain mean. A scheduler whose AL is
    below 1 (0: no traffic yet, or speculation off) or not finite has no figure and is left out."""
    groups: dict[str, list[dict[str, float]]] = {}
    for labels, g in ranks:
        al = g.get("acceptance_length")
        if al is None or not math.isfinite(al) or al < 1.0:
            continue
        groups.setdefault(dict(labels).get("dp_rank", ""), []).append(g)
    if not groups:
        return None, None
    als, rates, tps = [], [], []
    for members in groups.values():
        als.append(statistics.fmean(m["acceptance_length"] for m in members))
        r = [m["acceptance_rate"] for m in members if math.isfinite(m.get("acceptance_rate", math.nan))]
        rates.append(statistics.fmean(r) if r else None)
        t = [m["throughput"] for m in members if math.isfinite(m.get("throughput", math.nan))]
        tps.append(statistics.fmean(t) if t else None)
    weighted = len(groups) > 1 and all(t is not None and t > 0 for t in tps)
    if weighted:
        forwards = [t / a for t, a in zip(tps, als)]
        al = sum(tps) / sum(forwards)
    else:
        forwards = [1.0] * len(als)
        al = statistics.fmean(als)
    known = [(f, r) for f, r in zip(forwards, rates) if r is not None]
    rate = sum(f * r for f, r in known) / sum(f for f, _ in known) if known else None
    return al, rate


def parse_engine_metrics(engine: str, text: str, t: float) -> Sample:
    counters, gauges = get(engine).metrics.spec_counters, get(engine).metrics.spec_gauges
    itl = get(engine).metrics.serving.get("itl")
    running = get(engine).metrics.serving.get("running")
    s = Sample(t)
    found = False
    ranks: dict[tuple, dict[str, float]] = {}  # a scheduler's series (all its labels) -> its gauges
    own = False
    try:
        for fam in text_string_to_metric_families(text):  # one family at a time: a big page is never held parsed
            own = own or fam.name.startswith(engine + ":")
            for smp in fam.samples:
                if itl and smp.name == f"{itl}_sum":
                    s.itl_sum += smp.value
                    continue
                if itl and smp.name == f"{itl}_count":
                    s.itl_count += smp.value
                    continue
                if running and smp.name == running:
                    if math.isfinite(smp.value) and smp.value >= 0:
                        s.running = (s.running or 0.0) + smp.value
                    continue
                if counters:
                    if smp.name == counters.get("drafts"):
                        s.drafts += smp.value
                    elif smp.name == counters.get("draft_tokens"):
                        s.draft_tokens += smp.value
                    elif smp.name == counters.get("accepted_tokens"):
                        s.accepted += smp.value
                    elif smp.name == counters.get("accepted_tokens_per_pos"):
                        pos = smp.labels.get("position", "")
                        if not (pos.isascii() and pos.isdigit() and len(pos) <= 4):
                            continue  # a position is a small number: anything else is not the engine's counter
                        s.per_pos[pos] = s.per_pos.get(pos, 0.0) + smp.value
                    else:
                        continue
                    found = s.has_counters = True
                else:
                    for key in ("acceptance_length", "acceptance_rate", "throughput"):
                        if smp.name == gauges.get(key):
                            ranks.setdefault(tuple(sorted(smp.labels.items())), {})[key] = smp.value
                            found = found or key != "throughput"
    except Exception as exc:  # the parser raises bare ValueErrors and more on garbage
        raise ParseError(f"unparsable /metrics: {exc}") from None
    if not found and not own:
        raise ParseError(f"no {engine}: metrics in the engine's /metrics")
    if not all(math.isfinite(v) for v in (s.drafts, s.draft_tokens, s.accepted, s.itl_sum, s.itl_count,
                                          *s.per_pos.values())):
        raise ParseError("a speculative counter is NaN or infinite")
    s.al, s.rate = aggregate_ranks(list(ranks.items()))
    return s


class SpecCollector:
    def __init__(self, engine: str, url: str, window: float = 60.0, info: dict | None = None,
                 gate_file: Path | None = None, timeout: float = 2.0, cache_s: float = 1.0,
                 release_file: Path | None = None, group: tuple[int, list[str]] | None = None,
                 tables=None, weight_cache=None, surface_file: Path | None = None):
        # counters (else acceptance gauges); an unknown engine is a ValueError (UnsupportedVersion)
        self.counting = bool(get(engine).metrics.spec_counters)
        self.engine, self.url, self.window = engine, url.rstrip("/") + "/metrics", window
        self.info = {"engine": engine, "version": "", "patch_set": "", "drafter": "", "spec_tokens": "0"}
        self.info.update(info or {})
        self.gate_file, self.timeout, self.cache_s = gate_file, timeout, cache_s
        self.release_file = release_file
        # a serving group's leader: (its rendezvous port, "HOST=ADDRESS" of every other rank in rank order)
        self.group = group
        self.tables = tables or links.read_tables
        self.weight_cache = weight_cache  # a speculation.weightcache.WeightCacheCollector, where one is attached
        self.surface = None  # the measured price on this host (speculation/surfacemetrics.py), where a file may be
        if surface_file:
            from specdeploy.speculation.surfacemetrics import SurfaceFigures
            self.surface = SurfaceFigures(surface_file)
        self.samples: deque[Sample] = deque()
        self.errors = 0
        self.up = 0
        self.last_scrape = 0.0
        self.last_error = ""
        self.problems: dict[str, str] = {}  # input file kind -> what is wrong with it ('' when valid)
        self.lock = threading.Lock()

    def _scrape(self):
        now = time.monotonic()
        if now - self.last_scrape < self.cache_s and self.samples:
            return
        self.last_scrape = now
        try:
            text = peerhttp.text(self.url, self.timeout, MAX_PAGE)
            s = parse_engine_metrics(self.engine, text, now)
        except Exception as exc:  # noqa: BLE001 - whatever the engine answered, it is not readable right now
            self.errors += 1
            self.up = 0
            self.last_error = getattr(exc, "reason", str(exc))
            return
        self.up = 1
        self.samples.append(s)

    def collect(self):
        with self.lock:
            self._scrape()
            now = time.monotonic()
            while self.samples and now - self.samples[0].t > self.window:  # stale figures go, even the last one
                self.samples.popleft()
            samples = list(self.samples)
            up, errors = self.up, self.errors
            info, release_ok = self._info()
            gate = self._gate()
            gate_ok = not self.problems.get("gate")
            wc = list(self.weight_cache.collect()) if self.weight_cache else []
            surface = self._surface(info, samples)
        yield GaugeMetricFamily("specdeploy_engine_up", help_of("specdeploy_engine_up"), value=up)
        yield CounterMetricFamily("specdeploy_exporter_scrape_errors",
                                  help_of("specdeploy_exporter_scrape_errors"), value=errors)
        valid = GaugeMetricFamily("specdeploy_exporter_input_valid", help_of("specdeploy_exporter_input_valid"),
                                  labels=["file"])
        valid.add_metric(["gate"], 1.0 if gate_ok else 0.0)
        valid.add_metric(["release"], 1.0 if release_ok else 0.0)
        if self.weight_cache:
            valid.add_metric(["weight_cache"], 0.0 if self.weight_cache.problem else 1.0)
        if self.surface:
            valid.add_metric(["surface"], 0.0 if self.surface.problem else 1.0)
        yield valid
        yield from wc
        yield from surface
        yield InfoMetricFamily("specdeploy_engine", help_of("specdeploy_engine"), value=info)
        if samples:
            yield from self._spec(samples)
        yield from gate
        if self.group:
            yield self._group()

    def _surface(self, info: dict, samples: list) -> list:
        """The needed acceptance lengths of the host's measured price at the deployed k, and the one for the load
        band of the latest scrape's running requests."""
        if not self.surface:
            return []
        try:
            k = int(str(info.get("spec_tokens") or "0"))
        except ValueError:
            k = 0
        running = samples[-1].running if samples else None
        figures = self.surface.collect(self.engine, str(info.get("version") or ""), k, running)
        if self.surface.problem:
            self._note("surface", self.surface.path, self.surface.problem)
        return figures

    def _group(self):
        port, ranks = self.group
        peers = dict(r.split("=", 1) for r in ranks)
        state = links.joined(port, peers, self.tables())
        g = GaugeMetricFamily("specdeploy_group_rank_joined", help_of("specdeploy_group_rank_joined"),
                              labels=["rank", "rank_host"])
        for i, host in enumerate(peers, start=1):
            if state.get(host) is not None:
                g.add_metric([str(i), host], 1.0 if state[host] else 0.0)
        return g
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

    def _info(self) -> tuple[dict, bool]:
        """The deployed release is read at scrape time: a deploy switches it without restarting the exporter."""
        info = dict(self.info)
        if self.release_file:
            release, problem = read_release(self.release_file)
            self._note("release", self.release_file, problem)
            info["release"] = release
            return info, not problem
        return info, True

    def _note(self, kind: str, path: Path, problem: str):
        """Remember whether an input file is valid; log once when it turns invalid (or its problem changes)."""
        if problem and self.problems.get(kind) != problem:
            log.warning("specdeploy exporter: %s file %s is invalid (%s); its figures are dropped until it is "
                        "fixed", kind, path, problem)
        elif not problem and self.problems.get(kind):
            log.warning("specdeploy exporter: %s file %s is valid again", kind, path)
        self.problems[kind] = problem

    def _gate(self) -> list:
        if not self.gate_file:
            return []
        rep, problem = read_gate(self.gate_file)
        self._note("gate", self.gate_file, problem)
        if rep is None:
            return []
        sp = GaugeMetricFamily("specdeploy_gate_speedup", help_of("specdeploy_gate_speedup"), labels=["concurrency"])
        be = GaugeMetricFamily("specdeploy_gate_breakeven_acceptance_length",
                               help_of("specdeploy_gate_breakeven_acceptance_length"), labels=["concurrency"])
        al = GaugeMetricFamily("specdeploy_gate_acceptance_length", help_of("specdeploy_gate_acceptance_length"),
                               labels=["concurrency"])
        sr = GaugeMetricFamily("specdeploy_gate_step_ratio", help_of("specdeploy_gate_step_ratio"),
                               labels=["concurrency"])
        pr = GaugeMetricFamily("specdeploy_gate_predicted_step_ratio", help_of("specdeploy_gate_predicted_step_ratio"),
                               labels=["concurrency", "routing"])
        for lvl in rep.get("levels", []):
            c = str(lvl.get("concurrency"))
            for fam, key in ((sp, "speedup"), (be, "breakeven_al"), (al, "acceptance_length"), (sr, "step_ratio")):
                if lvl.get(key) is not None:
                    fam.add_metric([c], lvl[key])
            for routing, value in zip(("local", "uniform"), lvl.get("predicted_step_ratio") or ()):
                pr.add_metric([c, routing], value)
        v = GaugeMetricFamily("specdeploy_gate_verdict", help_of("specdeploy_gate_verdict"), labels=["verdict"])
        for verdict in VERDICTS:
            v.add_metric([verdict], 1.0 if (rep.get("verdict") or "undecided") == verdict else 0.0)
        failed = GaugeMetricFamily("specdeploy_gate_failed_requests", help_of("specdeploy_gate_failed_requests"),
                                   value=float(sum(int(lv.get("errors") or 0) for lv in rep.get("levels", []))))
        ts = GaugeMetricFamily("specdeploy_gate_timestamp_seconds", help_of("specdeploy_gate_timestamp_seconds"),
                               value=float(rep.get("timestamp") or 0))
        return [sp, be, al, sr, pr, v, failed, ts]


MAX_PAGE = peerhttp.MAX_BYTES  # an engine page over this is a failed scrape, never read whole
MAX_GATE_FILE = 1 << 20
MAX_RELEASE_FILE = 4096
VERDICTS = ("keep", "reduce-k", "disable", "undecided")


def _read_small(path: Path, limit: int) -> tuple[str | None, str]:
    """(text, '') or (None, what is wrong): at most ``limit`` bytes of strict UTF-8."""
    import stat
    try:  # O_NONBLOCK: a FIFO put there must not hang the scrape; only a regular file is read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "is not a regular file"
        data = os.read(fd, limit + 1)
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    finally:
        os.close(fd)
    if len(data) > limit:
        return None, f"larger than {limit:,} bytes"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte {exc.start})"


def _number(v, name: str, minimum: float | None = None) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return f"{name} is {type(v).__name__} {json.dumps(v)[:40]}, not a finite number"
    if minimum is not None and v < minimum:
        return f"{name} is {v}, below {minimum}"
    return ""


def gate_problem(rep) -> str:
    """What is wrong with a parsed gate report, '' when it has the shape `specdeploy gate` writes."""
    if not isinstance(rep, dict):
        return f"a JSON {type(rep).__name__}, not an object"
    if rep.get("verdict") is not None and rep["verdict"] not in VERDICTS:
        return f"verdict is {json.dumps(rep['verdict'])[:40]}, not one of {', '.join(VERDICTS[:3])} or null"
    if rep.get("timestamp") is not None and (why := _number(rep["timestamp"], "timestamp", 0)):
        return why
    levels = rep.get("levels", [])
    if not isinstance(levels, list):
        return f"levels is a JSON {type(levels).__name__}, not a list"
    for i, lv in enumerate(levels):
        if not isinstance(lv, dict):
            return f"levels[{i}] is a JSON {type(lv).__name__}, not an object"
        c = lv.get("concurrency")
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            return f"levels[{i}].concurrency is {json.dumps(c)[:40]}, not a positive integer"
        for key in ("speedup", "breakeven_al", "acceptance_length", "step_ratio"):
            if lv.get(key) is not None and (why := _number(lv[key], f"levels[{i}].{key}", 0)):
                return why
        pred = lv.get("predicted_step_ratio")
        if pred is not None:
            if not isinstance(pred, list) or len(pred) != 2:
                return f"levels[{i}].predicted_step_ratio is {json.dumps(pred)[:40]}, not [local, uniform]"
            for j, x in enumerate(pred):
                if why := _number(x, f"levels[{i}].predicted_step_ratio[{j}]", 0):
                    return why
        e = lv.get("errors")
        if e is not None and (isinstance(e, bool) or not isinstance(e, int) or e < 0):
            return f"levels[{i}].errors is {json.dumps(e)[:40]}, not a count"
    return ""


def read_gate(path: Path) -> tuple[dict | None, str]:
    """(report, '') for a valid gate report; (None, '') when there is none; (None, what is wrong) otherwise."""
    text, problem = _read_small(path, MAX_GATE_FILE)
    if text is None:
        return None, problem
    from specdeploy.values.bounded import loads
    try:
        rep = loads(text)
    except ValueError as exc:  # not JSON, or nested beyond bounded.MAX_DEPTH
        return None, f"not JSON ({exc})"[:120]
    problem = gate_problem(rep)
    return (None, problem) if problem else (rep, "")


def read_release(path: Path) -> tuple[str, str]:
    """(release, '') from the current-release mark ('' when there is none); ('', what is wrong) otherwise."""
    text, problem = _read_small(path, MAX_RELEASE_FILE)
    if text is None:
        return "", problem
    release = text.strip()
    if not release.isprintable():
        return "", "holds control characters or more than one line"
    return release[:64], ""


def serve(engine: str, url: str, listen: str, window: float, info: dict, gate_file: Path | None,
          group: tuple[int, list[str]] | None = None, weight_cache: tuple[str, Path | None] | None = None,
          surface_file: Path | None = None):
    """``weight_cache``: (the daemon's health check, the deploy's record of it) where the engine attaches to one;
    ``surface_file``: the price of speculation measured on the host (speculation/surfacemetrics.py)."""
    from prometheus_client import start_http_server
    from prometheus_client.core import CollectorRegistry
    reg = CollectorRegistry()
    release = gate_file.parent.parent / "current" if gate_file else None  # <state dir>/gate/.. -> <state dir>
    wc = None
    if weight_cache:
        from specdeploy.speculation.weightcache import WeightCacheCollector
        wc = WeightCacheCollector(*weight_cache)
    reg.register(SpecCollector(engine, url, window, info, gate_file, release_file=release, group=group,
                               weight_cache=wc, surface_file=surface_file))
    host, _, port = listen.rpartition(":")
    server, thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=reg)
    return server, thread
