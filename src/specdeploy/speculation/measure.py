"""``specdeploy breakeven --measure``: the engine measures the price of speculation on this host, before any drafter
is trained (docs/speculation.md, "The measured price").

The sweep starts the host's engine once per point through a launcher the caller gives (ops/measure.py starts it from
the host's rendered plan; the tests start the real CPU build the same way) and measures each point with the gate's
own load (``gate.run_level``: the built-in chat prompts, consecutive rounds, the acceptance the engine counts):

- a baseline without speculation at each concurrency level;
- with the synthetic rejection method (engines/synthetic.py), for each k and acceptance length: the engine runs a
  drafter of the right shape (a random head, drafter/synth.py) and accepts draft tokens at the calibrated rates;
- with given drafters (``--drafter``), for each k: a point at whatever acceptance the drafter reaches.

Each point's speedup gets the gate's 95% interval against the baseline's rounds, each run its A/A line, each point
its acceptance per round (the interval of the measured AL, to hold against the one asked for) and the roofline's
prediction for the same (AL, k, load) when the target's shape is known. A release without the method, or a platform
whose build refuses it (the CPU build asserts at the first request), ends the synthetic sweep with what was refused,
by which release, and the fallback: the roofline; given drafters are still measured.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from specdeploy.engines import get_adapter, synthetic
from specdeploy.speculation import surface as S
from specdeploy.speculation.gate import _T975, aa_line, load_prompts, model_name, ratio_interval, run_level

AL_TOLERANCE = 0.03  # a measured AL interval this close to the requested length agrees with it


@dataclass
class Launched:
    """A started, ready engine: its base URL, its log so far, and how to stop it."""
    url: str
    log: Callable[[], str]
    stop: Callable[[], None]


class EngineFailed(RuntimeError):
    """The engine did not become ready; ``log`` holds what it printed."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


Launch = Callable[[dict, str], Launched]


@dataclass
class Plan:
    engine: str
    version: str
    ks: list[int]
    als: list[float]
    concurrency: list[int]
    requests: int | None = None
    max_tokens: int = 128
    margin: float = 0.10
    synthetic: bool = True                 # measure with the synthetic rejection method
    head: str | None = None                # the drafter of the right shape the synthetic points run
    drafters: list[tuple[str, str, float | None]] = field(default_factory=list)  # (name, path, expected AL)
    roofline: tuple | None = None          # (verifycost target shape, peaks) for the same points
    extra: dict = field(default_factory=lambda: {"ignore_eos": True})  # every request runs to max_tokens


def al_interval(rounds: list) -> list[float] | None:
    """95% interval of the mean acceptance length over rounds (Student's t); None below two rounds."""
    xs = [x for x in rounds or [] if isinstance(x, (int, float))]
    if len(xs) < 2:
        return None
    m, sd = statistics.mean(xs), statistics.stdev(xs)
    t = _T975[len(xs) - 2] if len(xs) - 1 <= len(_T975) else 1.96
    h = t * sd / math.sqrt(len(xs))
    return [m - h, m + h]


def _roofline(plan: Plan, k: int, c: int, al: float | None) -> dict:
    if plan.roofline is None:
        return {}
    from specdeploy.speculation.verifycost import predict
    shape, hw = plan.roofline
    row = predict(shape, hw, [int(c)], [int(k)], margin=plan.margin)[0]
    lo, hi = row.needed_al
    out = {"roofline_needed_al": [lo, hi]}
    if al is not None:
        out["roofline_speedup"] = [al / hi, al / lo]
    return out


def _run(launch: Launch, plan: Plan, overrides: dict, label: str, progress) -> tuple[list[dict], str, str]:
    """(levels, engine log, failure) of one engine start measured at every concurrency level."""
    if progress:
        progress(f"{label}: starting the engine")
    try:
        eng = launch(overrides, label)
    except EngineFailed as exc:
        return [], exc.log, str(exc)
    levels, failure = [], ""
    try:
        prompts = load_prompts(None)
        model = model_name(eng.url, {})
        for c in plan.concurrency:
            n = plan.requests or max(4 * c, 16)
            if progress:
                progress(f"{label}: concurrency {c}, {n} requests")
            lv = run_level(eng.url, plan.engine, model, prompts, c, n, plan.max_tokens, {}, extra=plan.extra)
            levels.append(lv)
            if lv["errors"] >= lv["requests"]:
                failure = f"every request failed at concurrency {c}: {(lv.get('error_samples') or [''])[0]}"
                break
    except OSError as exc:  # a peer that stopped answering (peerhttp.PeerError is an OSError)
        failure = f"the engine stopped answering: {exc}"
    finally:
        log = eng.log()
        eng.stop()
    return levels, log, failure


def _point(plan: Plan, lv: dict, base: dict | None, k: int, al_req: float | None, drafter: str | None,
           rates: list[float] | None) -> dict:
    p = {"k": k, "concurrency": int(lv["concurrency"]), "al_requested": al_req, "drafter": drafter, "rates": rates,
         "al_measured": lv.get("acceptance_length"), "al_interval": al_interval(lv.get("rounds_al") or []),
         "rounds_al": lv.get("rounds_al"), "per_position": lv.get("per_position"),
         "output_tps": lv["output_tps"], "rounds_tps": lv["rounds_tps"], "aa": lv.get("aa"),
         "errors": lv["errors"], "requests": lv["requests"], "speedup": None, "speedup_interval": None}
    if base and base.get("output_tps") and lv["output_tps"]:
        p["speedup"] = lv["output_tps"] / base["output_tps"]
        iv = ratio_interval(lv["rounds_tps"], base.get("rounds_tps") or [])
        p["speedup_interval"] = list(iv) if iv else None
    if al_req is not None and p["al_measured"] is not None:
        iv = p["al_interval"] or [p["al_measured"], p["al_measured"]]
        p["al_agrees"] = iv[0] - AL_TOLERANCE <= al_req <= iv[1] + AL_TOLERANCE
    p.update(_roofline(plan, k, lv["concurrency"], p["al_measured"]))
    return p


def spec_overrides(head_or_drafter: str, k: int, extra: dict | None = None) -> dict:
    """The inventory variables of one speculative point: EAGLE-3 with this drafter at k, no load bands."""
    out = {"specdeploy_spec_enabled": True, "specdeploy_spec_method": "eagle3",
           "specdeploy_drafter_path": str(head_or_drafter), "specdeploy_spec_num_tokens": int(k),
           "specdeploy_spec_k_by_batch": []}
    for key, v in (extra or {}).items():
        out[key] = {**out.get(key, {}), **v} if isinstance(v, dict) else v
    return out


def sweep(launch: Launch, plan: Plan, progress=None) -> dict:
    """Measure the surface; see the module's docstring."""
    a = get_adapter(plan.engine, plan.version)
    s = {"kind": S.KIND, "engine": plan.engine, "release": plan.version, "timestamp": time.time(),
         "margin": plan.margin, "concurrency": sorted(plan.concurrency), "ks": plan.ks, "als": plan.als,
         "method": "synthetic" if plan.synthetic else "drafters", "max_tokens": plan.max_tokens,
         "baseline": None, "points": [], "failures": [], "refused": None}
    if plan.roofline is not None:
        s["roofline"] = {"target": plan.roofline[0].describe(), "hardware": plan.roofline[1].name}
    runs = [(k, al) for k in plan.ks for al in plan.als if al <= k + 1] if plan.synthetic else []
    if plan.synthetic and (why := synthetic.unavailable(a)):
        s["refused"] = {"release": f"{a.label} {a.version}", "reason": why, "fallback": _fallback(plan)}
        runs = []
    pending: list[tuple[list[dict], int, float, list[float]]] = []
    if runs:  # the first synthetic point first: a build that refuses the method costs one engine start
        k, al = runs[0]
        levels = _synthetic(launch, plan, a, s, k, al, progress)
        runs = runs[1:] if s["refused"] is None else []
        if levels is not None:
            pending.append((levels, k, al, synthetic.rates(al, k)))
    if runs and not plan.head:
        raise ValueError("the synthetic points need a drafter of the right shape (Plan.head)")
    if not runs and not pending and not plan.drafters:
        return _finish(plan, s)
    levels, log, failure = _run(launch, plan, {"specdeploy_spec_enabled": False}, "baseline", progress)
    if failure:
        s["failures"].append({"label": "baseline", "failure": failure, "log_tail": log[-2000:]})
    s["baseline"] = {"levels": {str(lv["concurrency"]): {**lv, "aa": aa_line(lv["rounds_tps"])} for lv in levels}}
    base = s["baseline"]["levels"]
    for levels, k, al, rates in pending:
        s["points"] += [_point(plan, lv, base.get(str(lv["concurrency"])), k, al, None, rates) for lv in levels]
    for k, al in runs:
        levels = _synthetic(launch, plan, a, s, k, al, progress)
        if levels is None and s["refused"]:
            break
        s["points"] += [_point(plan, lv, base.get(str(lv["concurrency"])), k, al, None, synthetic.rates(al, k))
                        for lv in levels or []]
    for name, path, expect in plan.drafters:
        for k in plan.ks:
            levels, log, failure = _run(launch, plan, spec_overrides(path, k), f"{name}, k={k}", progress)
            if failure:
                s["failures"].append({"label": f"{name}, k={k}", "failure": failure, "log_tail": log[-2000:]})
            s["points"] += [_point(plan, lv, base.get(str(lv["concurrency"])), k, expect, name, None)
                            for lv in levels]
    return _finish(plan, s)


def _finish(plan: Plan, s: dict) -> dict:
    s["needed"] = S.needed(s)
    if plan.roofline is not None:  # the fallback's figures for every point asked for, measured or not
        s["roofline_needed"] = []
        for k in plan.ks:
            for c in sorted(plan.concurrency):
                pred = _roofline(plan, k, c, None)["roofline_needed_al"]
                s["roofline_needed"].append({"k": k, "concurrency": c, "breakeven": pred,
                                             "keep": [x * (1 + plan.margin) for x in pred]})
    return s


def _synthetic(launch: Launch, plan: Plan, a, s: dict, k: int, al: float, progress) -> list[dict] | None:
    """One synthetic point's levels; None when the engine refused the method (``s["refused"]`` says so) or
    failed (``s["failures"]``)."""
    run = synthetic.plan(a, al, k)
    levels, log, failure = _run(launch, plan, spec_overrides(plan.head, k, run.overrides),
                                f"synthetic AL {al:g}, k={k}", progress)
    r = synthetic.refusal(a, log) if (failure or any(lv["errors"] for lv in levels)) else None
    if r is not None:
        s["refused"] = {"release": f"{a.label} {a.version}", "platform": r.platform, "text": r.text,
                        "where": r.where, "settings": run.how,
                        "reason": f"{a.label} {a.version}'s {r.platform.upper()} build refuses the synthetic "
                                  f"rejection method (\"{r.text}\", {r.where})",
                        "fallback": _fallback(plan)}
        return None
    if failure:
        s["failures"].append({"label": f"synthetic AL {al:g}, k={k}", "failure": failure, "log_tail": log[-2000:]})
        return None
    return levels


def _fallback(plan: Plan) -> str:
    target = "the host's target" if plan.roofline is None else plan.roofline[0].describe()
    return (f"the roofline (`specdeploy breakeven --target MODEL_DIR`: {target}), or a measured surface with "
            "given drafters (--drafter) or on a platform whose build runs the method")
