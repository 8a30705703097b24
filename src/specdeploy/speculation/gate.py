"""Speculation gate: measure whether speculation pays on this host and workload, and say what to do.

speedup = AL x T_base / T_spec (AL: mean acceptance length, bonus token included). Speculation pays only when
AL exceeds the step-time ratio T_spec / T_base; the gate keeps it only when the measured speedup clears
1 + margin, predicts whether a smaller k would do better, and otherwise disables it.

Noise is measured, not assumed away. Each concurrency level runs in ``ROUNDS`` consecutive rounds (each of at
least ``concurrency`` requests), and every report carries the rounds' throughputs. The speedup gets a 95%
interval from the two runs' rounds (:func:`ratio_interval`, on the log scale, Welch's t), and every run an A/A
line: its later rounds against its earlier ones, which shows what "no change" measures on this host. A verdict
is drawn only when the effect is larger than that spread: ``keep`` needs the point at or above 1 + margin and the
interval's bottom at or above 1; ``disable`` needs the interval's top below 1 + margin; anything between is no
decision.

It refuses to decide (verdict None, ``refused`` set) when more than ``MAX_FAILED`` of the requests failed, in
this run or in its baseline, when nothing was measured, when either run has a single round (no spread), or when
the interval straddles the keep threshold: throughput over failing requests says nothing about speculation, a
difference inside the noise says nothing either, and the previous decision then stays in force.
"""
from __future__ import annotations

import json
import math
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specdeploy.values import peerhttp
from specdeploy.engines import get
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.speculation.exporter import ParseError, Sample, parse_engine_metrics
from specdeploy.speculation.kbands import bands_text, k_by_band, measured_weights, single_k, wmean

PROMPTS = Path(__file__).resolve().parents[1] / "data" / "prompts.jsonl"
MAX_FAILED = 0.01  # failed / sent requests above which the gate refuses to decide
ROUNDS = 4  # rounds per concurrency level: the spread between them is the noise a verdict has to beat
# two-sided 95% quantiles of Student's t by degrees of freedom (1..30); 1.96 beyond
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


# ---- arithmetic ---------------------------------------------------------------------------------------
@dataclass
class Breakeven:
    acceptance_length: float
    step_ratio: float
    speedup: float
    breakeven_al: float
    verdict: str
    margin: float

    def to_dict(self) -> dict:
        return asdict(self)


def breakeven(acceptance_length: float, step_ratio: float, margin: float = 0.10) -> Breakeven:
    """``keep`` when AL / (T_spec/T_base) clears 1 + margin, else ``disable``."""
    if not acceptance_length >= 1 or math.isinf(acceptance_length):  # NaN fails every comparison: refuse it
        raise ValueError("acceptance length counts the bonus token, so it is a finite number of at least 1")
    if not step_ratio > 0 or math.isinf(step_ratio):
        raise ValueError("the step-time ratio T_spec / T_base must be a finite positive number")
    if not margin >= 0 or math.isinf(margin):
        raise ValueError("the margin must be a finite number of at least 0")
    speedup = acceptance_length / step_ratio
    verdict = "keep" if speedup >= 1 + margin else "disable"
    return Breakeven(acceptance_length, step_ratio, speedup, step_ratio * (1 + margin), verdict, margin)


def ratio_interval(num: list[float], den: list[float]) -> tuple[float, float] | None:
    """95% interval of mean(num) / mean(den) from two sets of independent rounds (throughputs), on the log scale
    with Welch's t; None when either side has fewer than two positive rounds (no spread to measure)."""
    a = [math.log(x) for x in num if x > 0]
    b = [math.log(x) for x in den if x > 0]
    if len(a) < 2 or len(b) < 2 or len(a) < len(num) or len(b) < len(den):
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.mean(a) - statistics.mean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return math.exp(d), math.exp(d)
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if va else 0) + (vb ** 2 / (len(b) - 1) if vb else 0))
    t = _T975[max(1, int(df)) - 1] if df < len(_T975) else 1.96
    return math.exp(d - t * se), math.exp(d + t * se)


def aa_line(rounds: list[float]) -> dict | None:
    """A run against itself: its later rounds over its earlier ones, with the interval :func:`ratio_interval`
    gives (None below four rounds). Its distance from 1 is what noise alone measures on this host."""
    if len(rounds) < 4:
        return None
    h = len(rounds) // 2
    iv = ratio_interval(rounds[h:], rounds[:h])
    if iv is None:
        return None
    return {"ratio": statistics.mean(rounds[h:]) / statistics.mean(rounds[:h]), "interval": list(iv)}


def failures(levels: list[dict]) -> tuple[int, int]:
    """(failed, sent) requests over all levels."""
    return (sum(int(lv.get("errors") or 0) for lv in levels),
            sum(int(lv.get("requests") or 0) for lv in levels))


def refusal(levels: list[dict], baseline: dict | None = None, max_failed: float = MAX_FAILED,
            measured: bool = True) -> str | None:
    """Why no verdict can be drawn from these levels (and their baseline), or None when one can; with
    ``measured`` False (a run without a baseline, which measures no speedup) only failed requests count."""
    for name, lvs in (("this run", levels), ("the baseline", (baseline or {}).get("levels", []))):
        failed, sent = failures(lvs)
        if sent and failed / sent > max_failed:
            return (f"{failed} of {sent} requests failed in {name} ({failed / sent:.0%}, limit {max_failed:.0%}): "
                    "throughput over failing requests says nothing about speculation")
    if measured and not any(lv.get("speedup") is not None for lv in levels):
        return "nothing measured: no level has both a speculative and a baseline throughput"
    return None


def decide(levels: list[dict], k: int, margin: float = 0.10,
           weights: list[float] | None = None) -> tuple[str | None, int | None, str]:
    """Verdict from per-concurrency results, each level weighted by its share of the traffic (equal unless
    ``weights``): keep, reduce-k or disable; None (with the reason) when nothing was measured or the effect is
    inside the measured spread."""
    measured, w = measured_weights(levels, weights)
    if not measured:
        return None, None, "nothing measured: no level has both a speculative and a baseline throughput"
    speedup = wmean([lv["speedup"] for lv in measured], w)
    als = [lv["acceptance_length"] for lv in measured if lv.get("acceptance_length") is not None]
    if als and max(als) <= 1.0:
        # No draft token was accepted at any level: every step yields the one token a plain decode yields, and
        # pays for the drafter and a wider verify on top. A faster measured run is noise (the machine's load
        # between the two runs), not speculation.
        return "disable", None, (f"no draft token accepted (acceptance length {max(als):.2f}): speculation cannot "
                                 f"pay; the measured {speedup:.2f}x is noise between the runs")
    ivs = [lv.get("speedup_interval") for lv in measured]
    if any(not iv for iv in ivs):
        return None, None, (f"speculation measured at {speedup:.2f}x in a single round: no spread to compare the "
                            "effect with; give --requests of at least twice the concurrency")
    # the levels' intervals averaged as the speedups are (no narrower than the interval of the mean)
    lo, hi = wmean([iv[0] for iv in ivs], w), wmean([iv[1] for iv in ivs], w)
    span = f"{speedup:.2f}x (95% interval {lo:.2f}-{hi:.2f}x)"
    one = single_k(levels, k, weights, margin)
    kp, best = (one["k"], one["weighted_speedup"]) if one else (k, speedup)
    # a prediction carries the measurement's relative spread: reduce k only when its bottom still beats 1x
    if kp < k and best >= 1 + margin and best * lo / speedup >= 1.0:
        return "reduce-k", kp, (f"k={kp} is predicted at {best:.2f}x against {span} measured at k={k}")
    if speedup >= 1 + margin and lo >= 1.0:
        return "keep", None, f"speculation measured at {span}, margin {margin:.0%}"
    if hi < 1 + margin:
        return "disable", None, f"speculation measured at {span}: even the top is below 1 + {margin:.0%}"
    return None, None, (f"speculation measured at {span}: the spread between rounds is larger than the distance "
                        f"to the keep threshold {1 + margin:.2f}x; measure again with more --requests, on a "
                        "quieter host")


def verdict_overrides(report: dict, per_batch: bool = False) -> dict:
    """Inventory variables that apply a gate report's verdict. ``per_batch``: the engine release takes a
    speculation length per batch size, so a verdict that keeps speculation sets the report's k per load band
    where the bands differ (the drafter's k then the largest band's); without it, the report's single k."""
    v = report.get("verdict")
    if v == "disable":
        return {"specdeploy_spec_enabled": False}
    bands = report.get("k_by_batch") or []
    if v in ("keep", "reduce-k") and per_batch and len(bands) > 1:
        return {"specdeploy_spec_num_tokens": max(int(b["k"]) for b in bands),
                "specdeploy_spec_k_by_batch": [{"from_batch": int(b["from_batch"]), "k": int(b["k"])}
                                               for b in bands]}
    if v == "reduce-k" and report.get("recommended_k"):
        return {"specdeploy_spec_num_tokens": int(report["recommended_k"])}
    return {}


# ---- measurement --------------------------------------------------------------------------------------
def load_prompts(path: Path | None = None) -> list[list[dict]]:
    """JSON lines, each a list of chat messages or an object with ``messages``; a bad file is a finding that
    names --prompts and the line."""
    from specdeploy.hostvars.argcheck import read_text
    from specdeploy.values.bounded import loads
    from specdeploy.values.errors import Finding, SpecdeployError
    p = path or PROMPTS
    what = "JSON lines of chat messages ([{\"role\": \"user\", \"content\": ...}] or {\"messages\": [...]})"
    out = []
    for n, line in enumerate(read_text(p, "--prompts", what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = loads(line)
        except ValueError:  # not JSON, or nested beyond bounded.MAX_DEPTH
            obj = None
        msgs = obj.get("messages") if isinstance(obj, dict) else obj
        if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                        for m in msgs)):
            raise SpecdeployError([Finding("error", "--prompts", f"{p} line {n} is not a list of chat messages",
                                           f"give {what}")])
        out.append(msgs)
    if not out:
        raise SpecdeployError([Finding("error", "--prompts", f"{p} holds no prompts", f"give {what}")])
    return out


def check_baseline(base, path) -> None:
    """A --baseline report as `specdeploy gate` writes it: levels_by_concurrency maps concurrency levels to
    levels with a finite output_tps >= 0; levels is a list of such levels. Raises SpecdeployError otherwise."""
    import math

    from specdeploy.values.errors import Finding, SpecdeployError

    def bad(what: str):
        raise SpecdeployError([Finding("error", "--baseline", f"{path} is not a gate report ({what})",
                                       "give the report.json of a `specdeploy gate` run without speculation")])

    def number(v, name, where):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v < 0):
            bad(f"{where}: {name} is {v!r}, not a finite number >= 0")

    lbc, levels = base.get("levels_by_concurrency"), base.get("levels", [])
    if not isinstance(lbc, dict) or not isinstance(levels, list):
        bad("no levels_by_concurrency")
    for c, lv in list(lbc.items()) + [(f"levels[{i}]", lv) for i, lv in enumerate(levels)]:
        if not str(c).isdigit() and not str(c).startswith("levels["):
            bad(f"level '{c}' is not a concurrency")
        if not isinstance(lv, dict):
            bad(f"level {c} is not an object")
        for name in ("output_tps", "errors", "requests"):
            number(lv.get(name), name, f"level {c}")
        rounds = lv.get("rounds_tps")
        if rounds is not None:
            if not isinstance(rounds, list) or len(rounds) > 10000:
                bad(f"level {c}: rounds_tps is not a list of throughputs")
            for i, v in enumerate(rounds):
                number(v, f"rounds_tps[{i}]", f"level {c}")


def read_metrics(url: str, engine: str, headers: dict | None = None) -> Sample:
    """The engine's speculative counters or gauges and its inter-token latency sums, read by the exporter's parser
    (names from the adapter; acceptance gauges averaged over the ranks that report one). The engine is an untrusted
    peer: every request goes through peerhttp (total deadline, size cap); a failure is a PeerError (an OSError)."""
    text = peerhttp.text(url.rstrip("/") + "/metrics", 10, headers=headers)
    try:
        return parse_engine_metrics(engine, text, time.time())
    except ParseError as exc:
        raise SpecdeployError([Finding("error", "--engine", f"{url.rstrip('/')}/metrics: {exc}",
                                       "give the --engine that serves --url")]) from None


def _chat(url: str, model: str, messages, max_tokens: int, headers: dict, extra: dict | None = None) -> int:
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       **(extra or {})}).encode()
    resp = peerhttp.json_object(url.rstrip("/") + "/v1/chat/completions", 600,
                                headers={"content-type": "application/json", **headers}, body=body)
    usage = resp.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise peerhttp.PeerError(url, "a chat completion without usage.completion_tokens")
    return tokens


def model_name(url: str, headers: dict) -> str:
    models = url.rstrip("/") + "/v1/models"
    data = peerhttp.json_object(models, 30, headers=headers).get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or not isinstance(data[0].get("id"),
                                                                                                  str):
        raise peerhttp.PeerError(models, "no served model in the answer (data[0].id)")
    return data[0]["id"]


def run_level(url: str, engine: str, model: str, prompts, concurrency: int, requests: int, max_tokens: int,
              headers: dict, rounds: int = ROUNDS, extra: dict | None = None) -> dict:
    """One concurrency level in ``rounds`` consecutive rounds: throughput per round, the acceptance the engine
    reports (per round too where it counts drafts), failures. ``extra``: more fields of each request's body (e.g.
    ``ignore_eos`` where every request must run to ``max_tokens``)."""
    before = read_metrics(url, engine)
    sg_samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll():  # gauges cover a window of recent batches: sample them while the level runs
        while not stop.wait(0.5):
            try:
                s = read_metrics(url, engine)
                if s.al is not None:
                    sg_samples.append((s.al, s.rate or 0.0))
            except Exception:  # noqa: BLE001
                pass

    counting = bool(get(engine).metrics.spec_counters)  # else acceptance gauges of recent batches
    poller = threading.Thread(target=poll, daemon=True)
    if not counting:
        poller.start()
    tokens, errors, idx, limit = [], [], {"i": 0}, {"n": requests}
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = idx["i"]
                if i >= limit["n"]:
                    return
                idx["i"] += 1
            try:
                tokens.append(_chat(url, model, prompts[i % len(prompts)], max_tokens, headers, extra))
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc)[:200])

    n_rounds = max(1, min(rounds, requests // concurrency))
    rounds_tps, rounds_al, wall, mark = [], [], 0.0, before
    for r in range(n_rounds):  # consecutive rounds: the spread between them is this run's noise
        limit["n"] = requests * (r + 1) // n_rounds
        done = sum(tokens)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        wall += dt
        rounds_tps.append((sum(tokens) - done) / dt if dt else 0.0)
        if counting:  # the acceptance of this round alone (the counters at its ends)
            now = read_metrics(url, engine)
            d = now.drafts - mark.drafts
            rounds_al.append(1 + (now.accepted - mark.accepted) / d if d > 0 else None)
            mark = now
    stop.set()
    after = read_metrics(url, engine)
    lv = {"concurrency": concurrency, "requests": requests, "errors": len(errors), "wall_s": wall,
          "output_tokens": sum(tokens), "output_tps": sum(tokens) / wall if wall else 0.0,
          "rounds_tps": rounds_tps, "aa": aa_line(rounds_tps)}
    d_itl = after.itl_count - before.itl_count
    lv["itl_ms"] = 1000 * (after.itl_sum - before.itl_sum) / d_itl if d_itl > 0 else None
    if counting:
        d = after.drafts - before.drafts
        dt = after.draft_tokens - before.draft_tokens
        a = after.accepted - before.accepted
        lv["acceptance_length"] = 1 + a / d if d > 0 else None
        lv["acceptance_rate"] = a / dt if dt > 0 else None
        lv["drafts_per_token"] = d / sum(tokens) if tokens and sum(tokens) else None  # 0: no drafting at this load
        lv["counts"] = {"drafts": d, "draft_tokens": dt, "accepted": a}
        keys = sorted(after.per_pos, key=lambda x: int(x))
        lv["per_position"] = [(after.per_pos[p] - before.per_pos.get(p, 0.0)) / d for p in keys] if d > 0 else []
        lv["rounds_al"] = rounds_al
    else:
        if sg_samples:
            lv["acceptance_length"] = statistics.mean(s[0] for s in sg_samples)
            lv["acceptance_rate"] = statistics.mean(s[1] for s in sg_samples)
        else:
            lv["acceptance_length"] = after.al
            lv["acceptance_rate"] = after.rate
        lv["per_position"] = []
    if errors:
        lv["error_samples"] = errors[:3]
    return lv


def gate(url: str, engine: str, concurrency: list[int], requests: int | None = None, max_tokens: int = 128,
         prompts_file: Path | None = None, baseline: dict | None = None, k: int | None = None,
         margin: float = 0.10, api_key: str | None = None, progress=None,
         weights: list[float] | None = None) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    prompts = load_prompts(prompts_file)
    model = model_name(url, headers)
    levels = []
    for c in concurrency:
        n = requests or max(4 * c, 16)
        if progress:
            progress(c, n)
        lv = run_level(url, engine, model, prompts, c, n, max_tokens, headers)
        base = (baseline or {}).get("levels_by_concurrency", {}).get(str(c))
        if base and base.get("output_tps") and lv["output_tps"]:
            lv["baseline_tps"] = base["output_tps"]
            lv["speedup"] = lv["output_tps"] / base["output_tps"]
            iv = ratio_interval(lv["rounds_tps"], base.get("rounds_tps") or [])
            lv["speedup_interval"] = list(iv) if iv else None
            lv["baseline_aa"] = aa_line(base.get("rounds_tps") or [])
            if lv.get("acceptance_length"):
                lv["step_ratio"] = lv["acceptance_length"] / lv["speedup"]
                lv["breakeven_al"] = lv["step_ratio"] * (1 + margin)
        else:
            lv["speedup"] = None
        levels.append(lv)
    spec_on = any(lv.get("acceptance_length") for lv in levels)
    k = k or max((len(lv.get("per_position") or []) for lv in levels), default=0) or None
    report = {"engine": engine, "url": url, "model": model, "timestamp": time.time(), "margin": margin,
              "speculation": spec_on, "k": k, "levels": levels,
              "levels_by_concurrency": {str(lv["concurrency"]): lv for lv in levels}}
    failed, sent = failures(levels)
    report.update(failed_requests=failed, sent_requests=sent)
    # failing requests void any run, a baseline run too: its throughput would mislead every later comparison
    refused = refusal(levels, baseline, measured=bool(baseline))
    if baseline and not spec_on and not refused:
        refused = "nothing measured: the engine reported no speculative acceptance"
    if refused:
        report.update(verdict=None, recommended_k=None, refused=refused,
                      reason=f"no decision: {refused}; the previous decision stays")
    elif spec_on and baseline:
        verdict, rk, why = decide(levels, k or 1, margin, weights)
        report.update(verdict=verdict, recommended_k=rk, reason=why)
        if verdict is None:
            report.update(refused=why, reason=f"no decision: {why}; the previous decision stays")
        elif verdict != "disable":
            bands, one = k_by_band(levels, k or 1, margin), single_k(levels, k or 1, weights, margin)
            report.update(k_by_batch=bands, single_k=one, weights=one["weights"] if one else None)
            if len(bands) > 1:
                why += f"; by load: {bands_text(bands)}"
                if one and one["loses"]:
                    lose = max(one["loses"], key=lambda x: x["own_speedup"] / x["speedup_at_single_k"])
                    why += (f"; with one k for every load (k={one['k']}), concurrency {lose['concurrency']} loses: "
                            f"{lose['speedup_at_single_k']:.2f}x against {lose['own_speedup']:.2f}x at its "
                            f"k={lose['k']}")
                report["reason"] = why
    elif not spec_on:
        report.update(verdict=None, reason="baseline run: speculation is off")
    else:
        report.update(verdict=None, reason="no baseline given: figures only")
    return report


def command_line(s: dict, out: str, baseline: str | None = None, surface: str | None = None) -> list[str]:
    """``specdeploy gate`` arguments for one of the gate role's two measurements: the baseline (``baseline``
    None) or the speculative run against it (with the price measured on the host, ``surface``, where it has one).
    ``s`` holds the host's address and port, the engine, and the role's settings (concurrency, requests,
    max_tokens, k, margin, api_key_file)."""
    from specdeploy.values.peerhttp import host_port
    argv = ["gate", "--url", f"http://{host_port(s['address'], int(s['port']))}", "--engine", str(s["engine"]),
            "--concurrency", str(s["concurrency"]), "--max-tokens", str(int(s["max_tokens"])), "--out", str(out)]
    if int(s.get("requests") or 0) > 0:
        argv += ["--requests", str(int(s["requests"]))]
    if baseline is not None:
        argv += ["--k", str(int(s["k"])), "--margin", str(s["margin"]), "--baseline", str(baseline)]
        if str(s.get("weights") or "").strip():
            argv += ["--weights", str(s["weights"]).strip()]
        if str(s.get("target") or "").strip() and s.get("hardware") and s["hardware"] != "custom":
            argv += ["--target", str(s["target"]), "--hardware", str(s["hardware"])]
        if surface:
            argv += ["--surface", str(surface)]
    if s.get("api_key_file"):
        argv += ["--api-key-file", str(s["api_key_file"])]
    return argv


def chart(report: dict, out: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:  # hosts without matplotlib still get the JSON report
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for lv in report["levels"]:
        pp = lv.get("per_position") or []
        if pp:
            a1.plot(range(len(pp)), pp, marker="o", label=f"c={lv['concurrency']}")
    a1.set_xlabel("draft position")
    a1.xaxis.get_major_locator().set_params(integer=True)
    a1.set_ylabel("acceptance (accepted at position / drafts)")
    a1.set_ylim(0, 1)
    a1.set_title("acceptance per position")
    if a1.lines:
        a1.legend()
    else:
        a1.text(0.5, 0.5, "engine reports no per-position counters", ha="center", transform=a1.transAxes)
    cs = [str(lv["concurrency"]) for lv in report["levels"]]
    sp = [lv.get("speedup") or 0 for lv in report["levels"]]
    colors = ["tab:green" if s >= 1 + report["margin"] else "tab:red" for s in sp]
    ivs = [lv.get("speedup_interval") or [s, s] for s, lv in zip(sp, report["levels"])]
    err = [[max(0.0, s - iv[0]) for s, iv in zip(sp, ivs)], [max(0.0, iv[1] - s) for s, iv in zip(sp, ivs)]]
    a2.bar(cs, sp, color=colors, yerr=err, capsize=6, label="speculative / baseline, 95% interval")
    for i, lv in enumerate(report["levels"]):  # the A/A line: the baseline against itself
        aa = lv.get("baseline_aa") or lv.get("aa")
        if aa:
            a2.errorbar([i + 0.3], [aa["ratio"]], yerr=[[aa["ratio"] - aa["interval"][0]],
                                                       [aa["interval"][1] - aa["ratio"]]],
                        fmt="s", color="tab:blue", capsize=4, label="A/A (baseline vs itself)" if i == 0 else None)
    band_k = {}
    for b in report.get("k_by_batch") or []:
        for c in [b["concurrency"], *b.get("merged", [])]:
            band_k[str(c)] = b["k"]
    if len(report.get("k_by_batch") or []) > 1:  # the k each load band gets, over its bar
        for i, c in enumerate(cs):
            if c in band_k:
                a2.annotate(f"band: k={band_k[c]}", (i, 0), textcoords="offset points", xytext=(0, 6),
                            ha="center", fontsize=9, color="white", weight="bold")
    a2.axhline(1.0, color="black", lw=1)
    a2.axhline(1 + report["margin"], color="grey", ls="--", lw=1, label=f"keep threshold {1 + report['margin']:.2f}x")
    a2.set_xlabel("concurrency")
    a2.set_ylabel("speedup vs no speculation")
    if report.get("refused"):
        title = "no decision: " + ("inside the noise" if report.get("failed_requests", 0) == 0 else
                                   f"{report['failed_requests']} of {report.get('sent_requests', 0)} requests failed")
    else:
        title = f"verdict: {report.get('verdict')}" + (f" (k={report['recommended_k']})"
                                                       if report.get("recommended_k") else "")
    a2.set_title(title)
    a2.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
