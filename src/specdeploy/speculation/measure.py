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
    """A started, ready engine: its base URL, its log so far, how to stop it, and (for paired measurements) how to
    freeze and thaw it (an idle engine still polls its queue and takes CPU from the one being measured)."""
    url: str
    log: Callable[[], str]
    stop: Callable[[], None]
    freeze: Callable[[], None] = lambda: None
    thaw: Callable[[], None] = lambda: None


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
    paired: bool = False                   # keep the baseline engine up, frozen, and alternate rounds with it


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


def merge(parts: list[dict]) -> dict:
    """One level from rounds measured one ``run_level`` call each (a paired measurement's alternating rounds)."""
    tokens, wall = sum(p["output_tokens"] for p in parts), sum(p["wall_s"] for p in parts)
    lv = {"concurrency": parts[0]["concurrency"], "requests": sum(p["requests"] for p in parts),
          "errors": sum(p["errors"] for p in parts), "wall_s": wall, "output_tokens": tokens,
          "output_tps": tokens / wall if wall else 0.0, "rounds_tps": [p["output_tps"] for p in parts]}
    lv["aa"] = aa_line(lv["rounds_tps"])
    counts = [p["counts"] for p in parts if p.get("counts")]
    if counts:
        d = sum(c["drafts"] for c in counts)
        a = sum(c["accepted"] for c in counts)
        dt = sum(c["draft_tokens"] for c in counts)
        lv.update(counts={"drafts": d, "accepted": a, "draft_tokens": dt},
                  acceptance_length=1 + a / d if d else None, acceptance_rate=a / dt if dt else None,
                  drafts_per_token=d / tokens if tokens else None,
                  rounds_al=[p.get("acceptance_length") for p in parts])
        width = max(len(p.get("per_position") or []) for p in parts)
        lv["per_position"] = [sum((p.get("per_position") or [0] * width)[i] * (p["counts"]["drafts"] or 0)
                                  for p in parts if p.get("counts")) / d for i in range(width)] if d else []
    samples = [e for p in parts for e in p.get("error_samples", [])]
    if samples:
        lv["error_samples"] = samples[:3]
    return lv


def paired_interval(num: list[float], den: list[float]) -> tuple[float, list[float]] | None:
    """(geometric mean of the per-round ratios, its 95% interval) of rounds measured in pairs, back to back: the
    drift of a shared host falls on both sides of each pair. None below two pairs."""
    logs = [math.log(a / b) for a, b in zip(num, den) if a > 0 and b > 0]
    if len(logs) < 2 or len(logs) < len(num):
        return None
    m, sd = statistics.mean(logs), statistics.stdev(logs)
    t = _T975[len(logs) - 2] if len(logs) - 1 <= len(_T975) else 1.96
    h = t * sd / math.sqrt(len(logs))
    return math.exp(m), [math.exp(m - h), math.exp(m + h)]


class _Session:
    """The engine starts of one sweep; with ``plan.paired`` the baseline engine stays up (frozen while idle) and
    every round of a point is measured right after a round of the baseline."""

    def __init__(self, launch: Launch, plan: Plan, progress):
        self.launch, self.plan, self.progress = launch, plan, progress
        self.base: Launched | None = None
        self.base_model = ""
        self.base_parts: dict[int, list[dict]] = {}

    def say(self, text: str):
        if self.progress:
            self.progress(text)

    def start_baseline(self) -> str:
        """Paired: start the baseline engine and keep it (frozen); '' or why it failed."""
        self.say("baseline: starting the engine (kept up, frozen while idle)")
        try:
            self.base = self.launch({"specdeploy_spec_enabled": False}, "baseline")
        except EngineFailed as exc:
            return f"{exc}\n{exc.log[-2000:]}"
        try:
            self.base_model = model_name(self.base.url, {})  # asked while it runs: a frozen engine answers nothing
        except OSError as exc:
            return f"the baseline engine stopped answering: {exc}"
        finally:
            self.base.freeze()
        return ""

    def close(self):
        if self.base is not None:
            self.base.thaw()
            self.base.stop()
            self.base = None

    def baseline_levels(self) -> dict:
        return {str(c): merge(parts) for c, parts in self.base_parts.items() if parts}

    def run(self, overrides: dict, label: str, smoke: bool = False) -> tuple[list[dict], list[dict], str, str]:
        """(levels, paired baseline levels, engine log, failure) of one engine start measured at every level;
        ``smoke``: one short request only (does the engine serve the method at all)."""
        self.say(f"{label}: starting the engine")
        try:
            eng = self.launch(overrides, label)
        except EngineFailed as exc:
            return [], [], exc.log, str(exc)
        levels, bases, failure = [], [], ""
        try:
            prompts = load_prompts(None)
            model = model_name(eng.url, {})
            for c in ([1] if smoke else self.plan.concurrency):
                n = 1 if smoke else self.plan.requests or max(4 * c, 16)
                self.say(f"{label}: concurrency {c}, {n} requests" + (", paired" if self.base and not smoke else ""))
                if self.base is not None and not smoke:
                    lv, bl = self._paired(eng, model, prompts, c, n)
                    bases.append(bl)
                else:
                    lv = run_level(eng.url, self.plan.engine, model, prompts, c, n,
                                   8 if smoke else self.plan.max_tokens, {}, extra=self.plan.extra)
                levels.append(lv)
                if lv["errors"] >= lv["requests"]:
                    failure = f"every request failed at concurrency {c}: {(lv.get('error_samples') or [''])[0]}"
                    break
        except OSError as exc:  # a peer that stopped answering (peerhttp.PeerError is an OSError)
            failure = f"the engine stopped answering: {exc}"
        finally:
            log = eng.log()
            eng.stop()
        return levels, bases, log, failure

    def _paired(self, eng: Launched, model: str, prompts, c: int, n: int) -> tuple[dict, dict]:
        pp, bp = paired_rounds(self.base, self.base_model, eng.url, model, self.plan.engine, prompts, c, n,
                               self.plan.max_tokens, self.plan.extra)
        self.base_parts.setdefault(c, []).extend(bp)
        return merge(pp), merge(bp)


def paired_rounds(base, base_model: str, url: str, model: str, engine: str, prompts, c: int, n: int,
                  max_tokens: int, extra: dict | None = None) -> tuple[list[dict], list[dict]]:
    """One level of the engine at ``url`` measured in pairs with ``base`` (anything with ``url``, ``freeze`` and
    ``thaw``; frozen while idle): the gate's rounds, each a round of the baseline (thawed for it) right before a
    round of the engine. (the engine's rounds, the baseline's rounds), for :func:`merge` and
    :func:`paired_interval`."""
    from specdeploy.speculation.gate import ROUNDS
    rounds = max(1, min(ROUNDS, n // c))
    per = max(c, n // rounds)
    pp, bp = [], []
    for _ in range(rounds):
        base.thaw()
        try:
            bp.append(run_level(base.url, engine, base_model, prompts, c, per, max_tokens, {}, rounds=1,
                                extra=extra))
        finally:
            base.freeze()
        pp.append(run_level(url, engine, model, prompts, c, per, max_tokens, {}, rounds=1, extra=extra))
    return pp, bp


def _point(plan: Plan, lv: dict, base: dict | None, k: int, al_req: float | None, drafter: str | None,
           rates: list[float] | None, paired: bool = False) -> dict:
    p = {"k": k, "concurrency": int(lv["concurrency"]), "al_requested": al_req, "drafter": drafter, "rates": rates,
         "al_measured": lv.get("acceptance_length"), "al_interval": al_interval(lv.get("rounds_al") or []),
         "rounds_al": lv.get("rounds_al"), "per_position": lv.get("per_position"),
         "drafts_per_token": lv.get("drafts_per_token"),
         "output_tps": lv["output_tps"], "rounds_tps": lv["rounds_tps"], "aa": lv.get("aa"),
         "errors": lv["errors"], "requests": lv["requests"], "speedup": None, "speedup_interval": None,
         "paired": paired}
    if base and base.get("output_tps") and lv["output_tps"]:
        p["baseline_rounds_tps"] = base.get("rounds_tps")
        if paired:
            got = paired_interval(lv["rounds_tps"], base.get("rounds_tps") or [])
            p["speedup"], p["speedup_interval"] = got if got else (lv["output_tps"] / base["output_tps"], None)
        else:
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
         "paired": plan.paired, "baseline": None, "points": [], "failures": [], "refused": None}
    if plan.roofline is not None:
        s["roofline"] = {"target": plan.roofline[0].describe(), "hardware": plan.roofline[1].name}
    runs = [(k, al) for k in plan.ks for al in plan.als if al <= k + 1] if plan.synthetic else []
    if plan.synthetic and (why := synthetic.unavailable(a)):
        s["refused"] = {"release": f"{a.label} {a.version}", "reason": why, "fallback": _fallback(plan)}
        runs = []
    if runs and not plan.head:
        raise ValueError("the synthetic points need a drafter of the right shape (Plan.head)")
    sess = _Session(launch, plan, progress)
    pending = []
    if runs:  # the first synthetic point first: a build that refuses the method costs one engine start
        k, al = runs[0]
        got = _synthetic(sess, a, s, k, al, smoke=plan.paired)
        if s["refused"] is not None:
            runs = []
        elif got is None or not plan.paired:  # failed (recorded), or measured already (unpaired)
            if got is not None:
                pending.append((got[0], k, al))
            runs = runs[1:]
    if not runs and not pending and not plan.drafters:
        return _finish(plan, s)
    try:
        if plan.paired:
            why = sess.start_baseline()
            if why:
                s["failures"].append({"label": "baseline", "failure": why})
                return _finish(plan, s)
        else:
            levels, _, log, failure = sess.run({"specdeploy_spec_enabled": False}, "baseline")
            if failure:
                s["failures"].append({"label": "baseline", "failure": failure, "log_tail": log[-2000:]})
            s["baseline"] = {"levels": {str(lv["concurrency"]): {**lv, "aa": aa_line(lv["rounds_tps"])}
                                        for lv in levels}}
        for levels, k, al in pending:
            s["points"] += _points(plan, s, levels, [], k, al, None, synthetic.rates(al, k))
        for k, al in runs:
            got = _synthetic(sess, a, s, k, al)
            if got is None and s["refused"]:
                break
            s["points"] += _points(plan, s, *(got or ([], [])), k, al, None, synthetic.rates(al, k))
        for name, path, expect in plan.drafters:
            for k in plan.ks:
                levels, bases, log, failure = sess.run(spec_overrides(path, k), f"{name}, k={k}")
                if failure:
                    s["failures"].append({"label": f"{name}, k={k}", "failure": failure, "log_tail": log[-2000:]})
                s["points"] += _points(plan, s, levels, bases, k, expect, name, None)
    finally:
        if plan.paired:
            s["baseline"] = {"levels": sess.baseline_levels()}
        sess.close()
    return _finish(plan, s)


def _points(plan: Plan, s: dict, levels: list[dict], bases: list[dict], k: int, al: float | None,
            drafter: str | None, rates) -> list[dict]:
    if bases:  # paired: each level against the baseline rounds measured beside it
        return [_point(plan, lv, bl, k, al, drafter, rates, paired=True) for lv, bl in zip(levels, bases)]
    base = (s.get("baseline") or {}).get("levels") or {}
    return [_point(plan, lv, base.get(str(lv["concurrency"])), k, al, drafter, rates) for lv in levels]


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


def _synthetic(sess: _Session, a, s: dict, k: int, al: float, smoke: bool = False):
    """One synthetic point: (levels, paired baseline levels); None when the engine refused the method
    (``s["refused"]`` says so) or failed (``s["failures"]``). ``smoke``: one short request only."""
    plan = sess.plan
    run = synthetic.plan(a, al, k)
    levels, bases, log, failure = sess.run(spec_overrides(plan.head, k, run.overrides),
                                           f"synthetic AL {al:g}, k={k}", smoke)
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
    return levels if smoke else (levels, bases)


def _fallback(plan: Plan) -> str:
    target = "the host's target" if plan.roofline is None else plan.roofline[0].describe()
    return (f"the roofline (`specdeploy breakeven --target MODEL_DIR`: {target}), or a measured surface with "
            "given drafters (--drafter) or on a platform whose build runs the method")
