"""The measured price of speculation: the speedup surface speedup(AL, k, load) an engine measured on this host, and
the acceptance length each load band needs (docs/speculation.md, "The measured price").

``specdeploy breakeven --measure`` (speculation/measure.py) fills it: a baseline without speculation and, for each
k and acceptance length, the engine run with the synthetic rejection method (or with given drafters), each at the
gate's concurrency levels with the gate's noise method (rounds, a 95% interval per speedup, an A/A line per run).
This module holds what is computed from those runs and read by the decisions:

- :func:`cells` / :func:`needed`: per (k, load), the acceptance length at which the speedup reaches 1.0 and
  1 + margin, interpolated between the measured points (the interval from the points' intervals), extrapolated
  as speedup proportional to AL beyond them, and "out of reach" above k + 1;
- :func:`speedup_at`: the surface's speedup at any AL for a (k, load) it measured (the gate's prediction for
  another k);
- :func:`band_needs`: per load band, the AL live acceptance is to be compared with: the exporter publishes it
  for the band the engine is in (speculation/surfacemetrics.py) and the continuous gate's rule compares the live
  AL with it instead of the gate's step-time ratio; ``drafter check --surface`` states it for a drafter;
  :func:`add_to_report` puts it beside each level the gate measured (``gate --surface``);
- :func:`read` / :func:`problem`: a surface file, bounded and validated (it is read by long-running services);
- :func:`chart`: the PNG (speedup against AL per load, one line per k, the roofline's range beside it).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

KIND = "specdeploy-speculation-surface"
FILE = "surface.json"
MAX_FILE = 1 << 20
MAX_POINTS = 2000


# ---- interpolation -------------------------------------------------------------------------------------------
def _crossing(xs: list[float], ys: list[float], target: float) -> tuple[float | None, str]:
    """The AL where the speedup curve through (xs, ys), xs ascending, reaches ``target``: interpolated inside the
    measured range; beyond it, speedup taken as proportional to AL from the nearest point."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0 and x is not None]
    if not pts:
        return None, "no measured point"
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if (y0 - target) * (y1 - target) <= 0 and y0 != y1:
            return x0 + (target - y0) * (x1 - x0) / (y1 - y0), "interpolated"
    if all(y < target for _, y in pts):
        x, y = max(pts)
    else:
        x, y = min(pts)
    return max(1.0, x * target / y), "extrapolated"


def cells(surface: dict) -> dict[tuple[int, int], list[dict]]:
    """The measured points per (k, concurrency), ordered by measured AL."""
    out: dict[tuple[int, int], list[dict]] = {}
    for p in surface.get("points", []):
        if p.get("speedup") is None or p.get("al_measured") is None:
            continue
        out.setdefault((int(p["k"]), int(p["concurrency"])), []).append(p)
    for pts in out.values():
        pts.sort(key=lambda p: p["al_measured"])
    return out


def needed_for(points: list[dict], target: float, k: int) -> dict:
    """The AL one (k, load) cell needs for a speedup of ``target``, with the range its points' intervals give."""
    xs = [p["al_measured"] for p in points]
    al, how = _crossing(xs, [p["speedup"] for p in points], target)
    lo_curve = [(p.get("speedup_interval") or [p["speedup"]] * 2)[0] for p in points]
    hi_curve = [(p.get("speedup_interval") or [p["speedup"]] * 2)[1] for p in points]
    hi, _ = _crossing(xs, lo_curve, target)  # the pessimistic curve needs more acceptance
    lo, _ = _crossing(xs, hi_curve, target)
    return {"al": al, "interval": [lo, hi] if lo is not None and hi is not None else None, "how": how,
            "reachable": al is not None and al <= k + 1}


def needed(surface: dict) -> list[dict]:
    """Per (k, load): the AL for 1.0x and for 1 + margin, with intervals, and the roofline's for the same point."""
    margin = float(surface.get("margin", 0.10))
    out = []
    starts = dict(zip(surface.get("concurrency", []), band_starts(surface.get("concurrency", []))))
    for (k, c), pts in sorted(cells(surface).items()):
        row = {"k": k, "concurrency": c, "from_batch": starts.get(c), "points": len(pts),
               "breakeven": needed_for(pts, 1.0, k), "keep": needed_for(pts, 1 + margin, k)}
        pred = next((p.get("roofline_needed_al") for p in pts if p.get("roofline_needed_al")), None)
        if pred:
            row["roofline"] = {"breakeven": pred, "keep": [x * (1 + margin) for x in pred]}
        out.append(row)
    return out


def band_starts(concurrency: list[int]) -> list[int]:
    from specdeploy.speculation.kbands import band_starts as starts
    return starts(sorted(int(c) for c in concurrency)) if concurrency else []


def band_needs(surface: dict, k: int) -> list[dict]:
    """The needed AL at ``k`` per load band (one band per measured level, as the gate's bands start), from the
    surface's ``needed`` rows; empty when the surface has no row at that k."""
    return [r for r in surface.get("needed") or needed(surface) if int(r["k"]) == int(k)]


def band_of(rows: list[dict], batch: float) -> dict | None:
    """The row whose band holds ``batch`` running requests (rows ordered by from_batch)."""
    chosen = None
    for r in sorted(rows, key=lambda r: r.get("from_batch") or 0):
        if (r.get("from_batch") or 1) <= max(1.0, batch):
            chosen = r
    return chosen


def add_to_report(report: dict, surface: dict) -> dict:
    """Beside each level a gate report measured at its k: the AL the surface says the level's load band needs for
    1.0x and 1 + margin, and the surface's speedup at the level's measured AL where it measured that load. The
    gate's own measurement keeps the verdict; a level whose measured AL is below the surface's break-even is
    named in ``surface_check`` (the drafter, not the host, falls short there)."""
    k = report.get("k")
    rows = band_needs(surface, int(k)) if k and report.get("speculation") else []
    if not rows:
        report["surface"] = {"stamp": stamp(surface), "k": k, "used": False,
                             "why": f"the surface measured no point at k={k}" if k else "no k deployed"}
        return report
    short = []
    for lv in report.get("levels", []):
        row = band_of(rows, float(lv["concurrency"]))
        if row is None:
            continue
        be, keep = row["breakeven"]["al"], row["keep"]["al"]
        lv["surface_needed_al"] = [be, keep]
        al = lv.get("acceptance_length")
        if al is not None:
            lv["surface_speedup"] = speedup_at(surface, float(al), int(k), int(row["concurrency"]))
            if be is not None and al < be:
                short.append(int(lv["concurrency"]))
    report["surface"] = {"stamp": stamp(surface), "k": int(k), "used": True, "below_breakeven_at": short}
    return report


def speedup_at(surface: dict, al: float, k: int, concurrency: int) -> float | None:
    """The surface's speedup at acceptance length ``al`` for (k, concurrency), piecewise linear between its points
    and proportional to AL beyond them; None where it measured nothing at that (k, concurrency)."""
    pts = cells(surface).get((int(k), int(concurrency)))
    if not pts:
        return None
    xs, ys = [p["al_measured"] for p in pts], [p["speedup"] for p in pts]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= al <= x1 and x1 > x0:
            return y0 + (al - x0) * (y1 - y0) / (x1 - x0)
    x, y = (xs[-1], ys[-1]) if al > xs[-1] else (xs[0], ys[0])
    return y * al / x


def point_interval_at(surface: dict, al: float, k: int, concurrency: int) -> list[float] | None:
    """The surface's 95% speedup interval at ``al`` for (k, concurrency), interpolated as :func:`speedup_at`."""
    pts = cells(surface).get((int(k), int(concurrency)))
    if not pts or any(not p.get("speedup_interval") for p in pts):
        return None
    out = []
    for side in (0, 1):
        sub = {**surface, "points": [{**p, "speedup": p["speedup_interval"][side]} for p in pts]}
        out.append(speedup_at(sub, al, k, concurrency))
    return out


# ---- the file --------------------------------------------------------------------------------------------------
def _num(v, name: str, minimum: float | None = None) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return f"{name} is {json.dumps(v)[:40]}, not a finite number"
    if minimum is not None and v < minimum:
        return f"{name} is {v}, below {minimum}"
    return ""


def problem(s) -> str:
    """What is wrong with a parsed surface, '' when it has the shape ``breakeven --measure`` writes."""
    if not isinstance(s, dict) or s.get("kind") != KIND:
        return f"not a speculation surface (kind is not {KIND!r})"
    if why := _num(s.get("margin", 0.1), "margin", 0):
        return why
    conc = s.get("concurrency", [])
    if not isinstance(conc, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in conc):
        return "concurrency is not a list of positive integers"
    pts = s.get("points", [])
    if not isinstance(pts, list) or len(pts) > MAX_POINTS:
        return f"points is not a list of at most {MAX_POINTS}"
    for i, p in enumerate(pts):
        if not isinstance(p, dict):
            return f"points[{i}] is not an object"
        for key in ("k", "concurrency"):
            if isinstance(p.get(key), bool) or not isinstance(p.get(key), int) or p[key] < 1:
                return f"points[{i}].{key} is {json.dumps(p.get(key))[:40]}, not a positive integer"
        for key, lo in (("al_measured", 1.0), ("speedup", 0.0)):
            if p.get(key) is not None and (why := _num(p[key], f"points[{i}].{key}", lo)):
                return why
        iv = p.get("speedup_interval")
        if iv is not None and (not isinstance(iv, list) or len(iv) != 2 or any(_num(x, "x", 0) for x in iv)):
            return f"points[{i}].speedup_interval is not [low, high]"
    return ""


def read(path: Path) -> tuple[dict | None, str]:
    """(surface, '') for a valid file; (None, '') when there is none; (None, what is wrong) otherwise. Bounded in
    size and depth: a service reads it on every scrape."""
    from specdeploy.values.bounded import Refused, loads, read_regular
    try:
        raw = read_regular(Path(path), MAX_FILE)
    except FileNotFoundError:
        return None, ""
    except Refused as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    try:
        s = loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"not JSON ({exc})"[:120]
    why = problem(s)
    if why:
        return None, why
    if not s.get("needed"):
        s["needed"] = needed(s)
    return s, ""


def load(path: Path, subject: str = "--surface") -> dict:
    """A surface for a command: a SpecdeployError naming ``subject`` when it is missing or invalid."""
    from specdeploy.values.errors import Finding, SpecdeployError
    s, why = read(path)
    if s is None:
        raise SpecdeployError([Finding("error", subject, f"{path}: {why or 'does not exist'}",
                                       "give the surface.json `specdeploy breakeven --measure` wrote")])
    return s


def summary(surface: dict, k: int) -> list[str]:
    """One line per load band: the AL speculation at ``k`` needs on this host (measured), and the roofline's."""
    lines = []
    rows = sorted(band_needs(surface, k), key=lambda r: r.get("from_batch") or 0)
    for i, r in enumerate(rows):
        upto = f"{r['from_batch']}-{rows[i + 1]['from_batch'] - 1}" if i + 1 < len(rows) else f"{r['from_batch']}+"
        keep = r["keep"]
        if keep["al"] is None:
            text = "not measured"
        elif not keep["reachable"]:
            text = f"AL {keep['al']:.2f} ({keep['how']}): above k + 1 = {k + 1}, out of reach"
        else:
            iv = keep.get("interval")
            text = f"AL {keep['al']:.2f}" + (f" (95% {iv[0]:.2f}-{iv[1]:.2f})" if iv else "") + f", {keep['how']}"
        roof = r.get("roofline", {}).get("keep")
        lines.append(f"{upto} running requests (c={r['concurrency']}): {text}"
                     + (f"; roofline {roof[0]:.2f}-{roof[1]:.2f}" if roof else ""))
    return lines


def stamp(surface: dict) -> str:
    t = surface.get("timestamp")
    when = time.strftime("%Y-%m-%d", time.gmtime(t)) if isinstance(t, (int, float)) else "?"
    return f"{surface.get('engine', '?')} {surface.get('release', '?')}, measured {when} ({surface.get('method')})"


# ---- the chart -------------------------------------------------------------------------------------------------
def chart(surface: dict, out: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:  # hosts without matplotlib still get the JSON
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted({c for _, c in cells(surface)}) or [0]
    fig, axes = plt.subplots(1, len(loads), figsize=(4.6 * len(loads), 4.2), squeeze=False)
    margin = float(surface.get("margin", 0.1))
    for ax, c in zip(axes[0], loads):
        for (k, cc), pts in sorted(cells(surface).items()):
            if cc != c:
                continue
            xs = [p["al_measured"] for p in pts]
            ys = [p["speedup"] for p in pts]
            ivs = [p.get("speedup_interval") or [y, y] for p, y in zip(pts, ys)]
            line = ax.errorbar(xs, ys, yerr=[[y - iv[0] for y, iv in zip(ys, ivs)],
                                             [iv[1] - y for y, iv in zip(ys, ivs)]],
                               marker="o", capsize=4, label=f"k={k} measured")
            pred = [p.get("roofline_speedup") for p in pts]
            if all(pred):
                ax.fill_between(xs, [q[0] for q in pred], [q[1] for q in pred], alpha=0.15,
                                color=line[0].get_color(), label=f"k={k} roofline")
        for p in surface.get("points", []):
            if p.get("drafter") and p.get("speedup") is not None and int(p["concurrency"]) == c:
                ax.annotate(p["drafter"], (p["al_measured"], p["speedup"]), fontsize=7, xytext=(4, -10),
                            textcoords="offset points")
        ax.axhline(1.0, color="black", lw=1)
        ax.axhline(1 + margin, color="grey", ls="--", lw=1, label=f"keep {1 + margin:.2f}x")
        ax.set_title(f"concurrency {c}")
        ax.set_xlabel("acceptance length (bonus token included)")
        ax.set_ylabel("speedup vs no speculation")
        ax.legend(fontsize=7)
    fig.suptitle(f"speculation's measured price: {stamp(surface)}", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
