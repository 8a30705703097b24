"""An engine start's progress (weight shards, KV cache, CUDA graphs, ready, an ETA), read from its own log
lines in the journal."""
from __future__ import annotations

import re
from dataclasses import dataclass

from specdeploy.engines.base import LoadLog


@dataclass
class LoadProgress:
    stage: str = "starting"          # starting, weights, kv-cache, cuda-graphs, ready
    shards: tuple[int, int] | None = None
    kv_tokens: int | None = None
    graphs: tuple[int, int] | None = None
    eta_s: float | None = None
    daemon: bool = False         # the weight-cache daemon's full load, not the engine's start
    attached: bool = False       # the engine mapped its weights from the daemon (no load)
    disk_fallback: bool = False  # the release fell back to a disk load without its daemon

    def text(self) -> str:
        parts = ["full load (weight-cache daemon)"] if self.daemon else []
        if self.attached:
            parts.append("weights attached from the weight-cache daemon")
        if self.disk_fallback:
            parts.append("no weight-cache daemon: the release fell back to a disk load")
        if self.shards:
            parts.append(f"shards {self.shards[0]}/{self.shards[1]}")
        if self.kv_tokens is not None:
            parts.append(f"KV cache {self.kv_tokens:,} tok")
        if self.graphs:
            parts.append(f"CUDA graphs {self.graphs[0]}/{self.graphs[1]}")
        if self.stage == "ready":
            parts.append("ready")
        if self.eta_s is not None and self.stage != "ready":
            parts.append(f"ETA {fmt_s(self.eta_s)}")
        return ", ".join(parts) or self.stage


def fmt_s(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _patterns(engine: str | None) -> LoadLog:
    """The engine's progress lines (its adapter's ``load_log``); for an unknown engine, any registered engine's."""
    from specdeploy.engines import adapters, names
    logs = [a.load_log for a in adapters() if engine is None or engine not in names() or a.name == engine]

    def union(attr):
        rx = [getattr(log, attr) for log in logs if getattr(log, attr) is not None]
        return re.compile("|".join(f"(?:{r.pattern})" for r in rx)) if len(rx) > 1 else (rx[0] if rx else None)
    return LoadLog(**{k: union(k) for k in ("shards", "kv_tokens", "graphs", "graphs_done", "ready", "attached",
                                            "disk_fallback", "daemon_ready")})


def _groups(m: re.Match, n: int) -> list[str]:
    """The first ``n`` groups that matched (an alternation of several engines' patterns numbers them apart)."""
    return [g for g in m.groups() if g is not None][:n]


def parse_load(lines: list[tuple[float | None, str]], now: float | None = None,
               engine: str | None = None, daemon: bool = False) -> LoadProgress:
    """Progress of one engine start from its log lines [(unix time or None, text)], oldest first; ``daemon``: of
    its weight-cache daemon's full load (ready on the daemon's own line). The ETA extrapolates the current tqdm bar
    (weight shards, then CUDA graphs) from the log's own timestamps."""
    pat = _patterns(engine)
    never = re.compile(r"(?!)")
    shards_rx, kv_rx, graphs_rx = pat.shards or never, pat.kv_tokens or never, pat.graphs or never
    done_rx = pat.graphs_done or never
    ready_rx = (pat.daemon_ready if daemon else pat.ready) or never
    attached_rx, fallback_rx = pat.attached or never, pat.disk_fallback or never
    p = LoadProgress(daemon=daemon)
    bar_start: dict[str, tuple[float, int]] = {}
    last: dict[str, tuple[float, int, int]] = {}
    for t, line in lines:
        if m := shards_rx.search(line):
            n, tot = (int(g) for g in _groups(m, 3)[1:])
            p.shards, p.stage = (n, tot), "weights"
            if t is not None:
                bar_start.setdefault("w", (t, n))
                last["w"] = (t, n, tot)
        elif m := kv_rx.search(line):
            p.kv_tokens, p.stage = int(_groups(m, 1)[0].replace(",", "")), "kv-cache"
        elif m := graphs_rx.search(line):
            n, tot = (int(g) for g in _groups(m, 3)[1:])
            p.graphs, p.stage = (n, tot), "cuda-graphs"
            if t is not None:
                bar_start.setdefault("g", (t, n))
                last["g"] = (t, n, tot)
        elif done_rx.search(line):
            p.stage = "cuda-graphs"
            if p.graphs:
                p.graphs = (p.graphs[1], p.graphs[1])
        if not daemon and attached_rx.search(line):
            p.attached = True
        if not daemon and fallback_rx.search(line):
            p.disk_fallback = True
        if ready_rx.search(line):
            p.stage = "ready"
    bar = {"weights": "w", "cuda-graphs": "g"}.get(p.stage)
    if bar and bar in last and bar in bar_start:
        t0, n0 = bar_start[bar]
        t1, n1, tot = last[bar]
        if n1 > n0 and t1 > t0:
            rate = (n1 - n0) / (t1 - t0)
            p.eta_s = max(0.0, (tot - n1) / rate - ((now or t1) - t1))
    return p


def journal_lines(text: str, unit: str) -> list[tuple[float | None, str]]:
    """``journalctl -o short-unix`` output, from the unit's last start on."""
    out: list[tuple[float | None, str]] = []
    for raw in text.splitlines():
        ts, _, rest = raw.partition(" ")
        try:
            t = float(ts)
        except ValueError:
            t, rest = None, raw
        msg = rest.split(": ", 1)[1] if ": " in rest else rest
        if re.search(rf"(Starting|Started) {re.escape(unit.removesuffix('.service'))}", rest):
            out = []
        out.append((t, msg))
    return out
