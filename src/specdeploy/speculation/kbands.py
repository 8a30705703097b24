"""k per load: the speedup each k is predicted at from a level's acceptance per position and step-time ratio, the k
each load band gets, and the one k for every load that maximises the traffic-weighted speedup (the gate's
``k_by_batch`` and ``single_k``; docs/speculation.md, "k per load band")."""
from __future__ import annotations

import math


def predict_k(per_position: list[float], step_ratio: float, k: int) -> dict[int, float]:
    """Predicted speedup for each k' <= k: AL(k') = 1 + sum of the first k' per-position acceptance rates;
    the step-time ratio's speculative overhead is taken as proportional to the draft tokens."""
    out = {}
    for kp in range(1, k + 1):
        al = 1 + sum(per_position[:kp])
        ratio = 1 + (step_ratio - 1) * kp / k
        out[kp] = al / ratio
    return out


def wmean(values: list[float], weights: list[float]) -> float:
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def level_weights(levels: list[dict], weights: list[float] | None) -> list[float]:
    """Each level's share of the traffic: ``weights`` aligned with ``levels`` (the gate's --weights), else equal."""
    if weights is None:
        return [1.0] * len(levels)
    if len(weights) != len(levels) or not all(w >= 0 and math.isfinite(w) for w in weights) or not sum(weights):
        raise ValueError("traffic weights: one finite number >= 0 per concurrency level, not all 0")
    return [float(w) for w in weights]


def measured_weights(levels: list[dict], weights: list[float] | None) -> tuple[list[dict], list[float]]:
    """The levels with a measured speedup, and their shares of the traffic (:func:`level_weights`)."""
    pairs = [(lv, w) for lv, w in zip(levels, level_weights(levels, weights)) if lv.get("speedup") is not None]
    return [lv for lv, _ in pairs], [w for _, w in pairs]


def level_predictions(lv: dict, k: int) -> dict[int, float]:
    """Speedup of this level at each k' <= k: the measured one at k, predicted (:func:`predict_k`) below it."""
    out = {}
    if lv.get("per_position") and lv.get("step_ratio"):
        out.update({kp: s for kp, s in predict_k(lv["per_position"], lv["step_ratio"], k).items() if kp < k})
    if lv.get("speedup") is not None:
        out[k] = lv["speedup"]
    return out


def best_k(preds: dict[int, float], k: int, margin: float) -> int:
    """The k to run: the measured k unless a smaller one is predicted to beat it by more than the margin (the
    prediction's own error); from the smallest k up, each k taken must beat the one taken before it so."""
    chosen, best = k, preds.get(k, 0.0)
    for kp in sorted(preds):
        if kp < k and preds[kp] > best * (1 + margin):
            chosen, best = kp, preds[kp]
    return chosen


def band_starts(concurrency: list[int]) -> list[int]:
    """The first batch size of each measured level's band: 1, then one past the geometric mean of neighbouring
    levels (levels 1, 8, 32: bands 1-2, 3-16, 17 and up), so each batch size goes to the nearest level on a log
    scale."""
    out = [1]
    for a, b in zip(concurrency, concurrency[1:]):
        out.append(max(out[-1] + 1, math.isqrt(a * b) + 1))
    return out


def k_by_band(levels: list[dict], k: int, margin: float = 0.10) -> list[dict]:
    """k per load band: for each measured level, the k of :func:`best_k`, or 0 where speculation clearly loses at
    that load (the top of its interval, carried to that k, below 1). Neighbouring bands with one k merge. Empty
    when a level lacks a measured speedup with its interval."""
    measured = sorted((lv for lv in levels if lv.get("speedup") is not None), key=lambda lv: lv["concurrency"])
    if not measured or any(not lv.get("speedup_interval") for lv in measured):
        return []
    starts = band_starts([int(lv["concurrency"]) for lv in measured])
    bands: list[dict] = []
    for start, lv in zip(starts, measured):
        preds = level_predictions(lv, k)
        kp = best_k(preds, k, margin)
        top = lv["speedup_interval"][1] * preds[kp] / lv["speedup"]
        band = {"from_batch": start, "k": 0 if top < 1.0 else kp, "concurrency": int(lv["concurrency"]),
                "predicted_speedup": 1.0 if top < 1.0 else preds[kp]}
        if bands and bands[-1]["k"] == band["k"]:
            bands[-1].setdefault("merged", []).append(band["concurrency"])
            continue
        bands.append(band)
    return bands


def single_k(levels: list[dict], k: int, weights: list[float] | None = None, margin: float = 0.10) -> dict | None:
    """The one k that maximises the traffic-weighted speedup (:func:`best_k` over the weighted predictions), and
    the levels that lose by it: those whose own best k is predicted faster than the chosen k by more than the
    margin."""
    measured, w = measured_weights(levels, weights)
    if not measured:
        return None
    per = [level_predictions(lv, k) for lv in measured]
    common = set.intersection(*(set(p) for p in per))
    weighted = {kp: wmean([p[kp] for p in per], w) for kp in common}
    chosen = best_k(weighted, k, margin)
    loses = []
    for lv, p in zip(measured, per):
        own = best_k(p, k, margin)
        if own != chosen and p[own] > p[chosen] * (1 + margin):
            loses.append({"concurrency": int(lv["concurrency"]), "k": own, "own_speedup": p[own],
                          "speedup_at_single_k": p[chosen]})
    return {"k": chosen, "weighted_speedup": weighted[chosen], "weights": w, "loses": loses}


def bands_text(bands: list[dict]) -> str:
    parts = []
    for i, b in enumerate(bands):
        upto = f"{b['from_batch']}-{bands[i + 1]['from_batch'] - 1}" if i + 1 < len(bands) else f"{b['from_batch']}+"
        parts.append(f"k={b['k']} at {upto} running requests")
    return ", ".join(parts)
