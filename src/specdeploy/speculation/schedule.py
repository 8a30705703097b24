"""A band schedule measured as deployed: before a verdict keeps bands of k per load, the engine serving the rendered
schedule (``num_speculative_tokens_per_batch_size``) is measured at each band's load and on both sides of each
threshold, against speculation off at the same loads (docs/speculation.md, "k per load band").

The engines' own load-dependent speculation can misfire: throughput can collapse at a band threshold, and a band with
k = 0 can still cost a good part of a plain decode step (its drafter machinery stays in the step), so k = 0 is not
"off". What the gate predicted per band from its levels is therefore checked as rendered:

- a band *loses* where, at one of its loads, the interval of the schedule's speedup tops out below 1.0;
- a losing band with k > 0 gets a lower k (the next smaller one; the next gate run measures it);
- a losing band with k = 0 (k = 0 costs here), or a band lowered to k = 0 where k = 0 was measured to cost, leaves
  two choices: the schedule with that cost, or speculation off for the whole engine; the schedule stays only when
  its traffic-weighted speedup over the bands' levels clears 1 + margin with the interval's bottom at 1.0 or more.

:func:`loads` gives the loads to measure (the baseline needs the same ones), :func:`check` the verdict after it,
:func:`report` measures a running engine and returns the gate report after it (`specdeploy gate --schedule`).
"""
from __future__ import annotations

import time
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.speculation.gate import load_prompts, model_name, ratio_interval, run_level
from specdeploy.speculation.kbands import wmean


def thresholds(bands: list[dict]) -> list[int]:
    return [int(b["from_batch"]) for b in bands[1:]]


def loads(bands: list[dict]) -> list[int]:
    """Each band's level and both sides of each threshold (the last load of a band, the first of the next)."""
    out = {int(b.get("concurrency") or b["from_batch"]) for b in bands}
    for t in thresholds(bands):
        out |= {t - 1, t}
    return sorted(x for x in out if x >= 1)


def candidate_loads(levels: list[int]) -> list[int]:
    """Every load a schedule built from these gate levels can ask for (levels and both sides of every possible
    threshold): what a baseline has to measure for a later check of any band schedule."""
    from specdeploy.speculation.kbands import band_starts
    starts = band_starts(sorted(levels))
    return sorted(set(levels) | {s for s in starts[1:]} | {s - 1 for s in starts[1:]})


def band_at(bands: list[dict], load: int) -> dict:
    chosen = bands[0]
    for b in bands:
        if int(b["from_batch"]) <= load:
            chosen = b
    return chosen


def _role(bands: list[dict], load: int) -> str:
    if any(int(b.get("concurrency") or -1) == load for b in bands):
        return "band level"
    if load in thresholds(bands):
        return "first load of a band"
    return "last load before a threshold"


def check(bands: list[dict], measured: dict[int, dict], baseline: dict[int, dict], margin: float = 0.10,
          weights: list[float] | None = None) -> dict:
    """The schedule's rows per load (speedup against speculation off, its interval, the band's k, the drafts per
    generated token the engine reported), the bands that lose, what replaces them, and the verdict after it."""
    rows = []
    for load in sorted(measured):
        lv, base = measured[load], baseline.get(load)
        b = band_at(bands, load)
        row = {"load": load, "from_batch": int(b["from_batch"]), "k": int(b["k"]), "role": _role(bands, load),
               "output_tps": lv.get("output_tps"), "baseline_tps": (base or {}).get("output_tps"),
               "acceptance_length": lv.get("acceptance_length"), "drafts_per_token": lv.get("drafts_per_token"),
               "speedup": None, "interval": None, "outcome": "not measured (no baseline at this load)"}
        if base and base.get("output_tps") and lv.get("output_tps"):
            row["speedup"] = lv["output_tps"] / base["output_tps"]
            iv = ratio_interval(lv.get("rounds_tps") or [], base.get("rounds_tps") or [])
            row["interval"] = list(iv) if iv else None
            top = iv[1] if iv else row["speedup"]
            row["outcome"] = "loses" if top < 1.0 else "wins" if iv and iv[0] >= 1.0 else "inside the noise"
        rows.append(row)
    losing = sorted({r["from_batch"] for r in rows if r["outcome"] == "loses"})
    zero_costs = any(r["outcome"] == "loses" and r["k"] == 0 for r in rows)
    after, replaced = [dict(b) for b in bands], []
    for b in after:
        if int(b["from_batch"]) not in losing:
            continue
        k = int(b["k"])
        new = max(0, k - 1)
        why = (f"k={k} loses at " + ", ".join(f"{r['load']} running ({r['speedup']:.2f}x, 95% top "
                                               f"{r['interval'][1] if r['interval'] else r['speedup']:.2f}x)"
                                               for r in rows if r["from_batch"] == b["from_batch"]
                                               and r["outcome"] == "loses"))
        if k > 0:
            replaced.append({"from_batch": int(b["from_batch"]), "k_was": k, "k_now": new,
                             "why": why + (f"; k={new} next (the next gate run measures it)" if new else
                                           "; k=0 next" + (", which costs here" if zero_costs else
                                                           " (its own cost not measured here)"))})
            b["k"] = new
        else:
            replaced.append({"from_batch": int(b["from_batch"]), "k_was": 0, "k_now": 0,
                             "why": why + ": k=0 is not off here (the drafter's machinery stays in the step)"})
    merged = []
    for b in after:
        if merged and merged[-1]["k"] == b["k"]:
            continue
        merged.append(b)
    out = {"loads": sorted(measured), "rows": rows, "losing_bands": losing, "replaced": replaced,
           "bands_after": merged, "zero_costs": zero_costs}
    levels = [r for r in rows if r["role"] == "band level" and r["speedup"] is not None]
    if levels:
        w = weights if weights and len(weights) == len(levels) else [1.0] * len(levels)
        sp = wmean([r["speedup"] for r in levels], w)
        lo = wmean([(r["interval"] or [r["speedup"]] * 2)[0] for r in levels], w)
        out["weighted_speedup"], out["weighted_bottom"] = sp, lo
    if not any(b["k"] for b in merged):
        out.update(verdict="disable", reason="every band ends at k=0: speculation off for the whole engine")
    elif zero_costs and any(b["k"] == 0 for b in merged):
        sp, lo = out.get("weighted_speedup"), out.get("weighted_bottom")
        if sp is not None and sp >= 1 + margin and lo >= 1.0:
            out.update(verdict="keep", reason=f"k=0 costs in its band, but the schedule measures {sp:.2f}x over "
                       f"its bands' levels (bottom {lo:.2f}x): kept with that cost")
        else:
            out.update(verdict="disable", reason="k=0 costs in its band and the schedule does not clear "
                       f"1 + {margin:.0%} over its bands' levels" + (f" ({sp:.2f}x)" if sp is not None else "")
                       + ": speculation off for the whole engine")
    elif replaced:
        out.update(verdict="keep", reason="the schedule as measured, with "
                   + "; ".join(f"from {r['from_batch']} k={r['k_was']} -> {r['k_now']}" for r in replaced))
    else:
        out.update(verdict="keep", reason="every band and threshold holds as rendered")
    return out


def report(kept: dict, url: str, engine: str, baseline: dict, requests: int | None = None,
                    max_tokens: int = 128, prompts_file: Path | None = None, api_key: str | None = None,
                    weights: list[float] | None = None, progress=None, extra: dict | None = None) -> dict:
    """``kept``'s band schedule measured as the engine at ``url`` serves it (rendered): at each band's load and both
    sides of each threshold, against ``baseline`` at the same loads (speculation/schedule.py). ``extra``: more
    fields of each request's body, as the baseline's requests had them (``ignore_eos`` against a surface's
    baseline, whose requests all run to ``max_tokens``: requests that end at different lengths leave a load-2 level
    at one running request for part of the time). Returns ``kept`` with ``schedule_check`` and the verdict and
    bands after it."""
    bands = kept.get("k_by_batch") or []
    if kept.get("verdict") not in ("keep", "reduce-k") or len(bands) < 2:
        raise SpecdeployError([Finding("error", "--schedule", "the report keeps no band schedule (a verdict of keep "
                                       "or reduce-k with bands of different k)", "give the report of a gate run "
                                       "whose verdict keeps bands")])
    want = loads(bands)
    have = {int(c): lv for c, lv in (baseline.get("levels_by_concurrency") or {}).items()}
    missing = [c for c in want if not (have.get(c) or {}).get("output_tps")]
    if missing:
        raise SpecdeployError([Finding("error", "--baseline", f"no baseline at {', '.join(map(str, missing))} "
                                       "running requests, where the schedule is measured",
                                       "measure the baseline with --concurrency " + ",".join(map(str, want)))])
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    prompts = load_prompts(prompts_file)
    model = model_name(url, headers)
    measured = {}
    for c in want:
        n = requests or max(4 * c, 16)
        if progress:
            progress(c, n)
        measured[c] = run_level(url, engine, model, prompts, c, n, max_tokens, headers, extra=extra)
    res = check(bands, measured, have, float(kept.get("margin", 0.10)), weights)
    out = {**kept, "timestamp": time.time(), "schedule_check": res, "k_by_batch_predicted": bands}
    if res["verdict"] == "disable":
        out.update(verdict="disable", recommended_k=None, k_by_batch=[],
                   reason=f"{kept.get('reason')}; measured as rendered: {res['reason']}")
    else:
        out.update(k_by_batch=res["bands_after"], reason=f"{kept.get('reason')}; measured as rendered: "
                   f"{res['reason']}")
    return out
