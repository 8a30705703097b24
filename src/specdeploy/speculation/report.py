"""``specdeploy report``: the dashboard's key panels as one PNG, drawn from Prometheus data, for people without
Grafana: acceptance length, speedup against the no-speculation baseline, tokens/s, and the all-reduce share.

No engine exports its all-reduce time. The share is estimated from what is measured: the host's NCCL all-reduce
latency at the running batch (``specdeploy nccl tune`` result) x 2 all-reduces per layer (attention and MoE
outputs under tensor parallelism), over the decode step time (mean inter-token latency x acceptance length).
Without a NCCL result the panel says so instead of guessing.

A fleet is read per release or per serving group (``by``): acceptance length as the mean over the hosts with the
lowest and highest host as a band, the gate's speedup as the mean per concurrency, tokens/s summed. The aggregation
runs in Prometheus (``metrics.per``), so a thousand hosts cost the same few series as one. ``select`` drills down to
some hosts, groups or releases; ``by="auto"`` draws one line per host up to ``HOST_LINES`` selected hosts.
"""
from __future__ import annotations

import time
import urllib.parse
from pathlib import Path

from specdeploy.speculation import metrics as M


HOST_LINES = 12  # "auto" draws one line per host up to this many hosts, else one per release
LINES = 12  # a panel draws at most this many lines: the worst ones (WORSE) when it has more
WORSE = {"acceptance": "low", "speedup": "low", "tokens": "low", "allreduce": "high"}
BY = ("auto", "host", "group", "release")


def query_range(base: str, q: str, start: float, end: float, step: float, timeout: float = 10,
                label: str = "host") -> dict[str, list]:
    """{legend: [(t, v), ...]} with the legend built from the ``label`` (host, group or release) and concurrency
    labels. Prometheus is an untrusted peer: read through peerhttp (total deadline, size cap), and anything but a
    matrix answer is a PeerError."""
    from specdeploy.values.peerhttp import PeerError, json_object
    url = f"{base.rstrip('/')}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": q, "start": start, "end": end, "step": step})
    data = json_object(url, timeout)
    if data.get("status") != "success":
        raise PeerError(url, f"Prometheus refused {q!r}: {str(data.get('error'))[:80]}")
    result = data.get("data", {}).get("result") if isinstance(data.get("data"), dict) else None
    if not isinstance(result, list):
        raise PeerError(url, "not a Prometheus range answer (no data.result list)")
    out = {}
    try:
        for r in result:
            m = r["metric"]
            name = str(m.get(label, "?") or "?") + (f" c={m['concurrency']}" if "concurrency" in m else "")
            pts = [(float(t), float(v)) for t, v in r["values"] if v not in ("NaN", "+Inf", "-Inf")]
            if pts:
                out[name] = pts
    except (TypeError, KeyError, ValueError, AttributeError):
        raise PeerError(url, "a malformed series in the Prometheus answer") from None
    return out


def allreduce_us(nccl: dict, tokens: float) -> float | None:
    """Median all-reduce latency (graph mode if measured, else eager) of the chosen/default candidate at a
    token count, interpolated linearly between measured sizes."""
    from specdeploy.nccl.choose import flat_candidates
    cands = flat_candidates(nccl)
    cand = next((c for c in cands if c.get("name") == nccl.get("chosen")), None) or \
        next((c for c in cands if c.get("name") == "default"), None) or (cands[0] if cands else None)
    if not cand:
        return None
    table = cand.get("graph") or cand.get("eager") or {}
    pts = sorted((int(k), v["median_us"]) for k, v in table.items() if v and "median_us" in v)
    if not pts:
        return None
    if tokens <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if tokens <= x1:
            return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
    return pts[-1][1]


def allreduce_share(itl: dict, al: dict, running: dict, nccl: dict, layers: int, k: int) -> dict[str, list]:
    out = {}
    for host, pts in itl.items():
        al_at = dict(al.get(host, []))
        run_at = dict(running.get(host, []))
        series = []
        for t, itl_s in pts:
            a = al_at.get(t, 1.0)
            batch = max(1.0, run_at.get(t, 1.0)) * (1 + (k if a > 1 else 0))
            ar = allreduce_us(nccl, batch)
            step_s = itl_s * a
            if ar is not None and step_s > 0:
                series.append((t, min(1.0, 2 * layers * ar * 1e-6 / step_s)))
        if series:
            out[host] = series
    return out


def worst(series: dict[str, list], n: int, worse: str) -> dict[str, list]:
    """The ``n`` series of ``series`` whose mean over the range is the worst (``worse``: "low" or "high"); ties by
    name. A panel of 512 groups draws the 12 that need a look, as the dashboard's lowest-groups panels do."""
    if len(series) <= n:
        return series

    def mean(item):
        vals = [v for _, v in item[1] if v == v]  # NaN (v != v) says nothing
        m = sum(vals) / len(vals) if vals else float("inf") if worse == "low" else float("-inf")
        return (m if worse == "low" else -m, item[0])
    return dict(sorted(series.items(), key=mean)[:n])


def hosts_seen(base: str, selector: str, start: float, end: float, step: float) -> int:
    """How many hosts' exporters matching ``selector`` Prometheus saw in the range (at most at one time)."""
    res = query_range(base, f"count(max by (host) ({M.INFO}{{{selector}}}))", start, end, step, label="none")
    return int(max((v for pts in res.values() for _, v in pts), default=0))


def render(base: str, out: Path, range_s: float = 3600, nccl: dict | None = None, layers: int = 61, k: int = 3,
           now: float | None = None, by: str = "auto", select: dict[str, list[str]] | None = None) -> dict:
    if by not in BY:
        raise ValueError(f"by {by!r}: one of {', '.join(BY)}")
    end = now or time.time()
    start, step = end - range_s, max(1.0, range_s / 240)
    r = "1m" if range_s >= 600 else "15s"
    selector = M.matchers(**(select or {}))
    hosts = hosts_seen(base, selector, start, end, step)
    if by == "auto":
        by = "host" if hosts <= HOST_LINES else "release"

    def q(expr: str, agg: str = "avg", keep: tuple[str, ...] = ()) -> dict[str, list]:
        return query_range(base, M.per(M.only(expr, selector), by, agg, keep), start, end, step, label=by)

    data = {
        "acceptance": q("specdeploy_spec_acceptance_length"),
        "speedup": q("specdeploy_gate_speedup", keep=("concurrency",)),
        "tokens": q(M.q_tokens_per_s(r), "sum"),
    }
    bands = {}
    if by != "host":  # the spread over each release's or group's hosts
        bands["acceptance"] = (q("specdeploy_spec_acceptance_length", "min"),
                               q("specdeploy_spec_acceptance_length", "max"))
    if nccl:
        itl = q(M.q_itl_mean(r))
        running = q(M.q_running())
        data["allreduce"] = allreduce_share(itl, data["acceptance"], running, nccl, layers, k)
    else:
        data["allreduce"] = {}

    drawn = {key: worst(v, LINES, WORSE[key]) for key, v in data.items()}
    import matplotlib
    matplotlib.use("Agg")
    # every text as given: a label from Prometheus or the command line may hold "$", matplotlib's math mode
    with matplotlib.rc_context({"text.parse_math": False}):
        _draw(base, out, range_s, nccl, drawn, {k: len(v) for k, v in data.items()}, bands, by, hosts, select)
    summary = {k: {n: pts[-1][1] for n, pts in v.items()} for k, v in data.items()}
    return {"png": str(out), "prometheus": base, "range_s": range_s, "by": by, "hosts": hosts,
            "selected": {label: list(v) for label, v in (select or {}).items() if v}, "last": summary,
            "drawn": {k: sorted(v) for k, v in drawn.items()}}


def _draw(base: str, out: Path, range_s: float, nccl: dict | None, data: dict, total: dict, bands: dict, by: str,
          hosts: int, select: dict | None) -> None:
    import matplotlib
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from datetime import datetime, timezone

    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    each = "" if by == "host" else f", per {by}"
    panels = [
        (axes[0][0], "acceptance", "Acceptance length (bonus token included)" if by == "host" else
         f"Acceptance length per {by}: mean, band from lowest to highest host", None),
        (axes[0][1], "speedup", f"Speedup vs no speculation (gate){each and each + ', mean'}", 1.0),
        (axes[1][0], "tokens", f"Output tokens/s{each and each + ', summed'}", None),
        (axes[1][1], "allreduce", f"All-reduce share of decode step (estimated){each}", None),
    ]

    def when(pts):
        return [datetime.fromtimestamp(t, timezone.utc) for t, _ in pts]
    for ax, key, title, ref in panels:
        for name, pts in sorted(data[key].items()):
            (line,) = ax.plot(when(pts), [v for _, v in pts], label=name)
            if key in bands:
                lo, hi = (dict(b.get(name, [])) for b in bands[key])
                span = [(t, lo[t], hi[t]) for t, _ in pts if t in lo and t in hi]
                if span:
                    ax.fill_between(when([(t, a) for t, a, _ in span]), [a for _, a, _ in span],
                                    [b for _, _, b in span],
                                    color=line.get_color(), alpha=0.2, lw=0)
        if ref is not None:
            ax.axhline(ref, color="black", lw=1, ls="--")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if data[key]:
            cut = total[key] > len(data[key])
            ax.legend(fontsize=7, loc="best", title_fontsize=7,
                      title=f"the {len(data[key])} {'lowest' if WORSE[key] == 'low' else 'highest'} of "
                            f"{total[key]} (mean over the range)" if cut else None)
        else:
            why = ("no NCCL measurement given (--nccl: a `specdeploy nccl tune` result)" if key == "allreduce"
                   and not nccl else "no data in this range")
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")
    axes[1][1].yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    for ax in axes[1]:
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M" if range_s > 900 else "%H:%M:%S"))
        ax.set_xlabel("UTC")
    chosen = "; ".join(f"{label} {', '.join(v)}" for label, v in (select or {}).items() if v)
    fig.suptitle(f"specdeploy report - {base} - last {int(range_s // 60)} min - {hosts} hosts"
                 + (f" ({chosen})" if chosen else ""), fontsize=11)
    fig.tight_layout()
    from specdeploy.values.outputs import save_png
    try:
        save_png(fig, out, "--out", "report", dpi=90)
    finally:
        plt.close(fig)
