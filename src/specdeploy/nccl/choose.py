"""``specdeploy nccl choose``: pool the rounds of one or more sweeps and keep NCCL's default unless a candidate
beats it on the traffic NCCL really carries, consistently across rounds, by more than the noise.

Rule: a candidate replaces the default only when (1) it ran in at least ``min_rounds`` rounds, every run ok;
(2) its traffic-weighted decode latency, relative to the default in the same round, is at least ``min_gain``
lower (geometric mean over rounds) and the 95% paired-bootstrap interval over rounds excludes no gain;
(3) that gain is larger than the A/A noise floor (the default against its own second run, where measured);
(4) no prefill size that reaches NCCL is slower beyond noise (more than ``prefill_tolerance`` and its interval
above 1). Otherwise the default stays and the reason is given. Weighted sizes are those the engine sends to NCCL
(see ``traffic.py``); without an engine, every decode size counts."""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

from specdeploy.nccl import DECODE_TOKENS
from specdeploy.nccl.traffic import ALL_SIZES, Traffic
from specdeploy.nccl.tune import AA_NAME


class ChooseError(ValueError):
    pass


def parse_batch_mix(text: str | None, available: list[int]) -> dict[int, float]:
    """``"1:0.3,8:0.5,64:0.2"`` -> weights over decode sizes (tokens per step); default: equal weights."""
    decode = [t for t in available if t <= max(DECODE_TOKENS)]
    if not text:
        return {t: 1.0 / len(decode) for t in decode}
    mix: dict[int, float] = {}
    for part in text.split(","):
        try:
            k, v = part.split(":")
            mix[int(k)] = float(v)
        except ValueError:
            raise ChooseError(f"--batch-mix entry '{part}' is not TOKENS:WEIGHT") from None
    odd = [w for w in mix.values() if not math.isfinite(w) or w < 0]
    if odd:
        raise ChooseError(f"--batch-mix weight {odd[0]} is not a finite number >= 0")
    missing = [t for t in mix if t not in available]
    if missing:
        raise ChooseError(f"--batch-mix sizes {missing} were not measured; measured: {available}")
    total = sum(mix.values())
    if total <= 0:
        raise ChooseError("--batch-mix weights must add up to more than 0")
    return {k: v / total for k, v in mix.items()}


# --- results files ------------------------------------------------------------------------------------------

@dataclass
class Round:
    source: str
    index: int
    runs: dict[str, dict]


def _finite_positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def check_results(data, source: str) -> None:
    """Raise ChooseError naming ``source`` unless ``data`` has the shape `nccl tune` writes: rounds of candidates
    (or one format-1 candidates list), each with a name, a status, an env mapping and, per mode, token counts
    mapped to finite positive median latencies."""
    def bad(what: str):
        raise ChooseError(f"{source}: not an `nccl tune` results file ({what})")
    if not isinstance(data, dict) or not ("rounds" in data or "candidates" in data):
        bad("no 'rounds' or 'candidates'")
    for key in ("gpus", "hidden"):
        v = data.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            bad(f"{key} is {v!r}, not a positive integer")
    if not isinstance(data.get("base_env", {}), dict):
        bad("base_env is not a mapping")
    rounds = data["rounds"] if "rounds" in data else [{"candidates": data["candidates"]}]
    if not isinstance(rounds, list):
        bad("'rounds' is not a list")
    for i, r in enumerate(rounds):
        if not isinstance(r, dict) or not isinstance(r.get("candidates", []), list):
            bad(f"round {i + 1} is not an object with a 'candidates' list")
        for c in r.get("candidates", []):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not isinstance(c.get("status"), str):
                bad(f"round {i + 1} has a candidate without a string 'name' and 'status'")
            if not isinstance(c.get("env", {}), dict):
                bad(f"candidate '{c['name']}': env is not a mapping")
            for mode in ("eager", "graph"):
                table = c.get(mode, {})
                if not isinstance(table, dict):
                    bad(f"candidate '{c['name']}': {mode} is not a mapping of token counts")
                for size, m in table.items():
                    if not str(size).isdigit() or not isinstance(m, dict) or \
                            ("median_us" in m and not _finite_positive(m["median_us"])):
                        bad(f"candidate '{c['name']}' {mode} size {size!r}: want a token count mapped to a "
                            "finite positive median_us")


def load_rounds(items: list[tuple[str, dict]]) -> tuple[dict, list[Round]]:
    """Pool the rounds of several results files (format 2: ``rounds``; format 1: one ``candidates`` list,
    read as one round). Files must agree on GPU count, hidden size and base environment."""
    meta: dict | None = None
    envs: dict[str, dict] = {}
    rounds: list[Round] = []
    for source, data in items:
        check_results(data, source)
        this = {"gpus": data.get("gpus"), "hidden": data.get("hidden", 7168), "base_env": data.get("base_env", {})}
        if meta is None:
            meta = dict(this, tokens=data.get("tokens"))
        else:
            for k in ("gpus", "hidden", "base_env"):
                if this[k] != meta[k]:
                    raise ChooseError(f"{source}: {k} is {this[k]!r}, but {items[0][0]} has {meta[k]!r}; "
                                      "pool only sweeps of the same host path (GPUs, hidden size, --base-env)")
        raw = data["rounds"] if "rounds" in data else [{"round": 1, "candidates": data["candidates"]}]
        for i, r in enumerate(raw):
            runs = {}
            for c in r.get("candidates", []):
                if "name" not in c or "status" not in c:
                    raise ChooseError(f"{source}: round {i + 1} has a candidate without 'name'/'status'")
                env = c.get("env", {})
                if c["status"] == "ok" and c["name"] in envs and envs[c["name"]] != env:
                    raise ChooseError(f"{source}: candidate '{c['name']}' has env {env}, elsewhere "
                                      f"{envs[c['name']]}; rename one of them")
                if c["status"] == "ok":
                    envs.setdefault(c["name"], env)
                runs[c["name"]] = c
            rounds.append(Round(source, r.get("round", i + 1), runs))
    if meta is None:
        raise ChooseError("no results files given")
    meta["envs"] = envs
    return meta, rounds


def flat_candidates(data: dict) -> list[dict]:
    """One record per candidate in the format-1 shape (name, env, status, mode -> size -> median_us), from
    either format; over rounds, each size's value is the median of the successful rounds."""
    if "rounds" not in data:
        return list(data.get("candidates") or [])
    out: dict[str, dict] = {}
    for r in data["rounds"]:
        for c in r.get("candidates", []):
            rec = out.setdefault(c["name"], {"name": c["name"], "env": c.get("env", {}), "status": "failed",
                                             "_runs": []})
            if c.get("status") == "ok":
                rec["status"] = "ok"
                rec["_runs"].append(c)
    for rec in out.values():
        runs = rec.pop("_runs")
        for mode in ("eager", "graph"):
            sizes = sorted({k for c in runs for k in c.get(mode, {})}, key=int)
            if sizes:
                rec[mode] = {k: {"median_us": statistics.median(c[mode][k]["median_us"] for c in runs
                                                                if k in c.get(mode, {})),
                                 "n_rounds": sum(k in c.get(mode, {}) for c in runs)} for k in sizes}
    return list(out.values())


# --- statistics ---------------------------------------------------------------------------------------------

def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def bootstrap_ci(ratios: list[float], n: int = 4000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the geometric mean of paired per-round ratios, resampling rounds."""
    if len(ratios) == 1:
        return ratios[0], ratios[0]
    rng = random.Random(seed)
    logs = [math.log(x) for x in ratios]
    k = len(logs)
    means = sorted(math.exp(sum(rng.choice(logs) for _ in range(k)) / k) for _ in range(n))
    a = (1 - level) / 2
    return means[int(a * (n - 1))], means[math.ceil((1 - a) * (n - 1))]


@dataclass
class Paired:
    """A candidate against the default over the rounds both ran in."""

    rounds: int
    ratio: float  # geometric mean of per-round ratios (candidate / default)
    lo: float
    hi: float
    wins: int  # rounds where the candidate was faster

    def fmt(self) -> str:
        return f"{self.ratio:.3f}x [{self.lo:.3f}-{self.hi:.3f}]"

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "ratio": self.ratio, "ci95": [self.lo, self.hi], "wins": self.wins}


def paired(ratios: list[float]) -> Paired | None:
    if not ratios:
        return None
    lo, hi = bootstrap_ci(ratios)
    return Paired(len(ratios), geomean(ratios), lo, hi, sum(r < 1 for r in ratios))


# --- the choice ---------------------------------------------------------------------------------------------

@dataclass
class Candidate:
    name: str
    env: dict[str, str]
    weighted_us: float | None = None  # median over rounds of the weighted decode latency
    decode: Paired | None = None
    prefill: dict[int, Paired] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    verdict: str = ""

    def to_dict(self) -> dict:
        return {"env": self.env, "weighted_decode_us": self.weighted_us,
                "decode_vs_default": self.decode.to_dict() if self.decode else None,
                "prefill_vs_default": {str(t): p.to_dict() for t, p in self.prefill.items()},
                "failures": self.failures, "verdict": self.verdict}


@dataclass
class Choice:
    mode: str
    chosen: str
    env: dict[str, str]
    reason: str
    candidates: dict[str, Candidate]
    aa: Candidate | None
    rounds: int
    sources: list[str]
    traffic: Traffic
    weights: dict[int, float]  # decode sizes NCCL carries -> weight
    not_nccl: list[int]  # decode sizes an engine path takes
    unknown: list[int]  # sizes whose path is not known (counted as NCCL's)
    per_size: dict[int, str]
    per_size_weighted_us: float | None
    tuner_rows: list[str] = field(default_factory=list)
    gpus: int = 0
    criteria: dict = field(default_factory=dict)

    @property
    def rejected(self) -> dict[str, str]:
        return {n: c.verdict for n, c in self.candidates.items() if n != self.chosen and c.verdict != "default"}

    @property
    def weighted_us(self) -> dict[str, float]:
        return {n: c.weighted_us for n, c in self.candidates.items() if c.weighted_us is not None}

    @property
    def prefill_ratio(self) -> dict[str, float]:
        return {n: max((p.ratio for p in c.prefill.values()), default=1.0) for n, c in self.candidates.items()}

    @property
    def aa_floor(self) -> float | None:
        """Half-width of the A/A interval around no change (fraction), the smallest gain that can be told apart."""
        if not self.aa or not self.aa.decode:
            return None
        return max(abs(1 - self.aa.decode.lo), abs(self.aa.decode.hi - 1))

    def to_dict(self) -> dict:
        w = self.weighted_us
        return {"chosen": self.chosen, "env": self.env, "reason": self.reason, "mode": self.mode,
                "rounds": self.rounds, "sources": self.sources, "gpus": self.gpus, "criteria": self.criteria,
                "traffic": {**self.traffic.to_dict(), "weights": {str(k): v for k, v in self.weights.items()},
                            "decode_sizes_not_on_nccl": self.not_nccl, "sizes_path_unknown": self.unknown},
                "aa": self.aa.to_dict() if self.aa else None, "aa_noise_floor": self.aa_floor,
                "candidates": {n: c.to_dict() for n, c in self.candidates.items()},
                "rejected": self.rejected, "weighted_decode_us": w,
                "per_size_best": {str(k): v for k, v in self.per_size.items()},
                "per_size_weighted_us": self.per_size_weighted_us,
                "per_size_gain_vs_chosen": (w[self.chosen] / self.per_size_weighted_us
                                            if self.per_size_weighted_us and self.chosen in w else None),
                "tuner_csv": self.tuner_rows}


def _lat(rec: dict, mode: str) -> dict[int, float]:
    return {int(k): v["median_us"] for k, v in rec.get(mode, {}).items()}


def _decode_weights(mix: dict[int, float], sizes: list[int], traffic: Traffic, hidden: int,
                    prefill_min_tokens: int) -> tuple[dict[int, float], list[int], list[int], list[int]]:
    """(the batch mix's weights over the sizes that reach NCCL, normalised; the mix's sizes NCCL never carries; the
    sizes whose path is unknown; the prefill sizes that may reach NCCL)."""
    reach = {t: traffic.reaches_nccl(t * hidden * 2) for t in sizes}
    weights = {t: w for t, w in mix.items() if reach[t] is not False}
    total = sum(weights.values())
    weights = {t: w / total for t, w in weights.items()} if total > 0 else {}
    return (weights, sorted(t for t in mix if reach[t] is False), sorted(t for t in sizes if reach[t] is None),
            [t for t in sizes if t >= prefill_min_tokens and reach[t] is not False])


def _measure(meta: dict, rounds: list[Round], ok_rounds: list[Round], mode: str, weights: dict[int, float],
             prefill: list[int]) -> dict[str, Candidate]:
    """Every candidate's paired ratios against the default in the same round: the weighted decode latency and
    each prefill size, with the runs that failed."""
    def weighted(lat: dict[int, float]) -> float | None:
        if not weights or any(t not in lat for t in weights):
            return None
        return sum(w * lat[t] for t, w in weights.items())

    names = []
    for r in rounds:
        names += [n for n in r.runs if n not in names]
    cands: dict[str, Candidate] = {}
    for n in names:
        c = Candidate(n, meta["envs"].get(n, next(r.runs[n] for r in rounds if n in r.runs).get("env", {})))
        dec, pre, ws = [], {t: [] for t in prefill}, []
        for r in rounds:
            rec = r.runs.get(n)
            if rec is None:
                continue
            if rec["status"] != "ok" or not rec.get(mode):
                c.failures.append(f"{r.source} round {r.index}: {rec['status']}"
                                  + (f" ({rec['detail']})" if rec.get("detail") else ""))
                continue
            if r not in ok_rounds:
                continue
            lat, base = _lat(rec, mode), _lat(r.runs["default"], mode)
            wc, wd = weighted(lat), weighted(base)
            if wc is not None and wd is not None:
                dec.append(wc / wd)
                ws.append(wc)
            for t in prefill:
                if t in lat and t in base:
                    pre[t].append(lat[t] / base[t])
        c.weighted_us = statistics.median(ws) if ws else None
        c.decode = paired(dec)
        c.prefill = {t: p for t, xs in pre.items() if (p := paired(xs))}
        cands[n] = c
    return cands


def _verdict(c: Candidate, weights: dict, floor: float | None, min_rounds: int, min_gain: float,
             prefill_tolerance: float) -> str:
    """Why a candidate may (``eligible``) or may not replace the default."""
    slow = sorted(((t, p) for t, p in c.prefill.items() if p.ratio > 1 + prefill_tolerance and p.lo > 1),
                  key=lambda tp: -tp[1].ratio)
    if c.failures:
        return f"failed in {len(c.failures)} run(s): {c.failures[0]}"
    if not weights:
        return "no weighted decode size reaches NCCL"
    if c.decode is None:
        return "missing weighted sizes"
    if c.decode.rounds < min_rounds:
        return f"only {c.decode.rounds} round(s); {min_rounds} needed to tell a gain from run-to-run noise"
    if slow:
        return f"prefill {slow[0][0]} tokens slower beyond noise: {slow[0][1].fmt()}"
    if c.decode.ratio > 1 - min_gain:
        return f"gain {100 * (1 - c.decode.ratio):.1f}% < {100 * min_gain:.0f}%"
    if c.decode.hi >= 1:
        return f"interval includes no gain (faster in {c.decode.wins}/{c.decode.rounds} rounds)"
    if floor is not None and 1 - c.decode.ratio <= floor:
        return f"gain {100 * (1 - c.decode.ratio):.1f}% within the A/A noise floor ±{100 * floor:.1f}%"
    return "eligible"


def _pick(cands: dict[str, Candidate], eligible: dict[str, float], weights: dict, n_rounds: int, min_rounds: int,
          traffic: Traffic) -> tuple[str, str]:
    """(the chosen candidate, why): the fastest eligible one, else the default and the reason none won."""
    if eligible:
        chosen = min(eligible, key=eligible.get)
        c = cands[chosen]
        c.verdict = "chosen"
        for n in eligible:
            if n != chosen:
                cands[n].verdict = f"eligible, but {chosen} is faster"
        return chosen, (f"{chosen}: weighted decode {c.decode.fmt()} of the default over {c.decode.rounds} rounds "
                        f"(faster in {c.decode.wins}), no prefill size slower beyond noise")
    if not weights:
        return "default", (f"NCCL carries none of the weighted decode sizes ({traffic.label}): "
                           "an NCCL environment cannot change decode latency, so the default stays")
    if n_rounds < min_rounds:
        return "default", (f"only {n_rounds} round(s) with a default run; at least {min_rounds} interleaved rounds "
                           "are needed to tell a gain from run-to-run noise, so the default stays")
    return "default", "no candidate beats the default consistently beyond noise, so the default stays"


def _per_size(cands: dict[str, Candidate], ok_rounds: list[Round], mode: str, sizes: list[int],
              aa: Candidate | None) -> tuple[dict[str, dict[int, float]], dict[int, str]]:
    """Each candidate's pooled median latency per size, and the fastest candidate that never failed per size."""
    pooled = {}
    for n in list(cands) + ([AA_NAME] if aa else []):
        per = [_lat(r.runs[n], mode) for r in ok_rounds if r.runs.get(n, {}).get("status") == "ok"]
        if per:
            pooled[n] = {t: statistics.median(p[t] for p in per if t in p) for t in sizes if any(t in p for p in per)}
    pooled.pop(AA_NAME, None)
    ok_names = [n for n in pooled if not cands[n].failures]
    return pooled, {t: min((n for n in ok_names if t in pooled[n]), key=lambda n: pooled[n][t]) for t in sizes}


def choose(results: dict | list, mode: str = "graph", batch_mix: str | None = None,
           prefill_tolerance: float = 0.03, prefill_min_tokens: int = 2048, min_gain: float = 0.03,
           min_rounds: int = 3, traffic: Traffic | None = None) -> Choice:
    """``results``: one results dict, or a list of (source name, results dict)."""
    items = [("results", results)] if isinstance(results, dict) else list(results)
    meta, rounds = load_rounds(items)
    traffic = traffic or ALL_SIZES
    ok_rounds = [r for r in rounds if r.runs.get("default", {}).get("status") == "ok" and r.runs["default"].get(mode)]
    if not ok_rounds:
        raise ChooseError(f"no round has a successful 'default' run in mode '{mode}' to compare against")
    sizes = sorted(_lat(ok_rounds[0].runs["default"], mode))
    weights, not_nccl, unknown, prefill = _decode_weights(parse_batch_mix(batch_mix, sizes), sizes, traffic,
                                                          meta["hidden"], prefill_min_tokens)
    cands = _measure(meta, rounds, ok_rounds, mode, weights, prefill)
    aa = cands.pop(AA_NAME, None)
    floor = max(abs(1 - aa.decode.lo), abs(aa.decode.hi - 1)) if aa and aa.decode else None
    eligible = {}
    for n, c in cands.items():
        c.verdict = "default" if n == "default" else _verdict(c, weights, floor, min_rounds, min_gain,
                                                              prefill_tolerance)
        if c.verdict == "eligible":
            eligible[n] = c.decode.ratio
    chosen, reason = _pick(cands, eligible, weights, len(ok_rounds), min_rounds, traffic)
    pooled, per_size = _per_size(cands, ok_rounds, mode, sizes, aa)
    per_size_w = sum(w * pooled[per_size[t]][t] for t, w in weights.items()) if weights else None
    ok_names = [n for n in pooled if not cands[n].failures]
    rows = tuner_rows({n: {"env": cands[n].env} for n in ok_names}, per_size, sizes, meta["hidden"],
                      meta["gpus"] or -1)
    criteria = {"min_gain": min_gain, "min_rounds": min_rounds, "prefill_tolerance": prefill_tolerance,
                "interval": "95% paired bootstrap over rounds (geometric mean of per-round ratios)"}
    return Choice(mode, chosen, dict(cands[chosen].env), reason, cands, aa, len(ok_rounds),
                  sorted({r.source for r in rounds}), traffic, weights, not_nccl, unknown, per_size, per_size_w,
                  rows, meta["gpus"] or 0, criteria)


def tuner_rows(ok: dict, per_size: dict[int, str], sizes: list[int], hidden: int, gpus: int) -> list[str]:
    """CSV rows for NCCL's example tuner plugin (NCCL_TUNER_CONFIG_FILE):
    colltype,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff.
    A size band goes from halfway below one measured size to halfway above it."""
    rows = []
    bytes_of = {t: t * hidden * 2 for t in sizes}
    for i, t in enumerate(sizes):
        env = ok[per_size[t]]["env"]
        algo, proto = env.get("NCCL_ALGO"), env.get("NCCL_PROTO")
        if not algo or not proto or "," in algo or "," in proto:
            continue  # NCCL's own choice (or a non algo/proto knob) wins here: no override
        lo = 0 if i == 0 else (bytes_of[sizes[i - 1]] + bytes_of[t]) // 2 + 1
        hi = (bytes_of[t] + bytes_of[sizes[i + 1]]) // 2 if i + 1 < len(sizes) else 2 ** 40
        rows.append(f"allreduce,{lo},{hi},{algo.lower()},{proto.lower()},-1,1,{gpus},-1,-1")
    return rows


def explain(choice: Choice) -> list[list[str]]:
    """Rows: candidate, weighted decode us, vs default [95% interval], rounds faster, worst prefill, verdict."""
    def row(n: str, c: Candidate) -> list[str]:
        d = c.decode
        worst = max(c.prefill.values(), key=lambda p: p.ratio, default=None)
        return [n, f"{c.weighted_us:.1f}" if c.weighted_us is not None else "-",
                d.fmt() if d else "-", f"{d.wins}/{d.rounds}" if d else "-",
                worst.fmt() if worst else "-", c.verdict]
    order = sorted(choice.candidates, key=lambda n: (choice.candidates[n].decode is None,
                                                     choice.candidates[n].decode.ratio
                                                     if choice.candidates[n].decode else 0))
    out = [row(n, choice.candidates[n]) for n in order]
    if choice.aa:
        out.append(row("A/A: " + AA_NAME, choice.aa)[:-1] + ["noise floor (default vs itself)"])
    return out


def evidence_lines(choice: Choice) -> list[str]:
    """What a written choice rests on, one fact per line (for host_vars comments and reports)."""
    c = choice.candidates[choice.chosen]
    lines = [f"chosen: {choice.chosen} ({choice.mode} mode): {choice.reason}",
             f"evidence: {', '.join(choice.sources)}; {choice.rounds} round(s), {choice.gpus} GPUs",
             (f"weighted sizes: {', '.join(f'{t}:{w:.2f}' for t, w in choice.weights.items()) or 'none'} "
              f"(tokens:weight; {choice.traffic.label})")]
    if choice.not_nccl:
        lines.append(f"not weighted (an engine path carries them): {choice.not_nccl} tokens")
    if c.decode and choice.chosen != "default":
        lines.append(f"weighted decode vs default: {c.decode.fmt()}, faster in {c.decode.wins}/{c.decode.rounds}")
    if choice.unknown:
        lines.append(f"path not known for {choice.unknown} tokens: counted as NCCL's")
    floor = choice.aa_floor
    if floor is not None:
        lines.append(f"A/A noise floor: ±{100 * floor:.1f}% ({choice.aa.decode.fmt()})")
    else:
        lines.append("A/A noise floor: " + ("no weighted size to compare" if not choice.weights
                                           else "not measured in these files"))
    return lines
