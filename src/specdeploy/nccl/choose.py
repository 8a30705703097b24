"""``specdeploy nccl choose``: pick the environment that minimizes traffic-weighted decode latency without
slowing prefill-size all-reduces, and the per-size table NCCL's example tuner plugin can load."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import DECODE_TOKENS


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
    missing = [t for t in mix if t not in available]
    if missing:
        raise ChooseError(f"--batch-mix sizes {missing} were not measured; measured: {available}")
    total = sum(mix.values())
    if total <= 0:
        raise ChooseError("--batch-mix weights must add up to more than 0")
    return {k: v / total for k, v in mix.items()}


@dataclass
class Choice:
    mode: str
    chosen: str
    env: dict[str, str]
    weighted_us: dict[str, float]
    prefill_ratio: dict[str, float]
    rejected: dict[str, str]
    per_size: dict[int, str]
    per_size_weighted_us: float
    tuner_rows: list[str] = field(default_factory=list)
    gpus: int = 0

    def to_dict(self) -> dict:
        return {"mode": self.mode, "chosen": self.chosen, "env": self.env, "weighted_decode_us": self.weighted_us,
                "prefill_ratio_vs_default": self.prefill_ratio, "rejected": self.rejected,
                "per_size_best": {str(k): v for k, v in self.per_size.items()},
                "per_size_weighted_us": self.per_size_weighted_us,
                "per_size_gain_vs_chosen": (self.weighted_us[self.chosen] / self.per_size_weighted_us
                                            if self.per_size_weighted_us else None),
                "tuner_csv": self.tuner_rows}


def _lat(cand: dict, mode: str) -> dict[int, float]:
    return {int(k): v["median_us"] for k, v in cand.get(mode, {}).items()}


def choose(results: dict, mode: str = "graph", batch_mix: str | None = None,
           prefill_tolerance: float = 0.03, prefill_min_tokens: int = 2048) -> Choice:
    ok = {c["name"]: c for c in results["candidates"] if c["status"] == "ok" and c.get(mode)}
    if "default" not in ok:
        raise ChooseError("the results have no successful 'default' run to compare against")
    lat = {n: _lat(c, mode) for n, c in ok.items()}
    sizes = sorted(lat["default"])
    mix = parse_batch_mix(batch_mix, sizes)
    prefill = [t for t in sizes if t >= prefill_min_tokens]
    weighted, prefill_ratio, rejected = {}, {}, {}
    for n, l in lat.items():
        if any(t not in l for t in mix):
            rejected[n] = "missing sizes"
            continue
        weighted[n] = sum(w * l[t] for t, w in mix.items())
        ratios = [l[t] / lat["default"][t] for t in prefill if t in l]
        prefill_ratio[n] = max(ratios) if ratios else 1.0
        if prefill_ratio[n] > 1 + prefill_tolerance:
            rejected[n] = f"prefill {100 * (prefill_ratio[n] - 1):.0f}% slower than default"
    for c in results["candidates"]:
        if c["name"] not in ok:
            rejected[c["name"]] = c["status"] + (f": {c.get('detail', '')}" if c.get("detail") else "")
    feasible = {n: w for n, w in weighted.items() if n not in rejected}
    chosen = min(feasible, key=feasible.get)
    # Per-size: the fastest candidate at each size; only algo/proto pairs can go into the tuner table.
    per_size = {t: min((n for n in lat if t in lat[n]), key=lambda n: lat[n][t]) for t in sizes}
    per_size_w = sum(w * lat[per_size[t]][t] for t, w in mix.items())
    rows = tuner_rows(ok, per_size, sizes, results.get("hidden", 7168), results.get("gpus", -1))
    return Choice(mode, chosen, dict(ok[chosen]["env"]), weighted, prefill_ratio, rejected, per_size, per_size_w,
                  rows, results.get("gpus", 0))


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


def explain(choice: Choice, results: dict) -> list[list[str]]:
    """Rows for a short table: candidate, weighted decode latency, vs default, prefill, verdict."""
    base = choice.weighted_us["default"]
    out = []
    for n in sorted(choice.weighted_us, key=choice.weighted_us.get):
        verdict = "chosen" if n == choice.chosen else choice.rejected.get(n, "")
        out.append([n, f"{choice.weighted_us[n]:.1f}", f"{choice.weighted_us[n] / base:.2f}x",
                    f"{choice.prefill_ratio.get(n, 1):.2f}x", verdict])
    for n, why in choice.rejected.items():
        if n not in choice.weighted_us:
            out.append([n, "-", "-", "-", why])
    return out
