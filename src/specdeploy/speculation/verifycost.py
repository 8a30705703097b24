"""The price of verification, predicted from the target's config before any drafter exists.

A decode step of a memory-bound target costs the bytes of the weights it touches over the memory bandwidth. A
dense target touches every weight once per step whatever the number of tokens, so verifying B x (k+1) tokens
costs about what decoding B tokens does. A MoE target touches only the experts its tokens route to: a verify
step's B x (k+1) tokens reach more distinct experts than a decode step's B tokens, and the step ratio
T_verify / T_decode grows with them. This module counts those bytes (and the flops, for the compute bound
max(bytes / BW, flops / peak)), from the expected distinct experts under two routing models that bracket real
routing, or from a routing trace an engine dumped; docs/speculation.md derives it.

Pure Python: no torch or numpy at import.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError

DEFAULT_LOCALITY = 0.75  # a draft position keeps 6 of the previous position's 8 experts
BF16_BITS = 16.0


def _err(subject: str, message: str, fix: str = "") -> SpecdeployError:
    return SpecdeployError([Finding("error", subject, message, fix)])


# ---- distinct experts -------------------------------------------------------------------------------------
def distinct_uniform(experts: int, top_k: float, tokens: float) -> float:
    """Expected distinct experts of ``tokens`` tokens each drawing ``top_k`` of ``experts`` uniformly:
    E * (1 - (1 - k/E)^n) (an expert is missed by one token with probability 1 - k/E, independently)."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def distinct_per_sequence(experts: int, top_k: float, positions: int, locality: float | None) -> float:
    """Expected distinct experts of one sequence's ``positions`` consecutive tokens. ``locality`` None: each
    position draws top-k uniformly. Else position j keeps ``locality * top_k`` of position j-1's experts and
    draws the other ``new = (1 - locality) * top_k`` uniformly from the E - k experts position j-1 did not use;
    of those, E - U are not yet in the union U, so E[U_j] = E[U_{j-1}] + new * (E - E[U_{j-1}]) / (E - k)
    (linear in U, so exact in expectation)."""
    if locality is None:
        return distinct_uniform(experts, top_k, positions)
    new = (1 - locality) * top_k
    u = float(top_k)
    for _ in range(positions - 1):
        u += new * (experts - u) / (experts - top_k)
    return u


def distinct_experts(experts: int, top_k: float, batch: int, positions: int, locality: float | None) -> float:
    """Expected distinct experts of a step over ``batch`` independent sequences of ``positions`` tokens each.
    By symmetry one sequence's union holds a given expert with probability m / E (m: its expected size), and
    sequences route independently, so the step touches E * (1 - (1 - m/E)^B)."""
    m = distinct_per_sequence(experts, top_k, positions, locality)
    return experts * (1 - (1 - m / experts) ** batch)


# ---- the target's shape -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TargetShape:
    """Weights per step component, in parameters, and the bits each is stored in."""
    name: str
    hidden: int
    layers: int
    dense_layers: int          # layers with a dense MLP
    moe_layers: int            # layers with routed experts
    vocab: int
    attn_params: int           # one layer's attention projections (MLA: q_a, q_b, kv_a, kv_b, o)
    dense_mlp_params: int      # one dense layer's MLP (gate, up, down)
    experts: int = 0
    top_k: int = 0
    expert_params: int = 0     # one routed expert (gate, up, down)
    shared_params: int = 0     # one layer's shared experts
    router_params: int = 0     # one layer's router
    kv_bytes_per_token: float = 0.0  # one layer's KV cache entry for one token of context
    attn_flops_per_ctx: float = 0.0  # one layer's attention flops per query token per token of context
    bits: dict = field(default_factory=dict)  # component -> bits per weight (scales included)

    @property
    def moe(self) -> bool:
        return self.moe_layers > 0 and self.experts > 0

    def b(self, part: str) -> float:
        return self.bits.get(part, BF16_BITS) / 8

    def fixed_bytes(self) -> float:
        """Bytes every step reads whatever its tokens: attention, dense MLPs, shared experts, routers, lm_head
        (the embedding reads one row per token: left out)."""
        return (self.layers * self.attn_params * self.b("attn")
                + self.dense_layers * self.dense_mlp_params * self.b("dense_mlp")
                + self.moe_layers * (self.shared_params * self.b("shared") + self.router_params * BF16_BITS / 8)
                + self.vocab * self.hidden * self.b("lm_head"))

    def expert_bytes(self) -> float:
        return self.expert_params * self.b("experts")

    def flops_per_token(self) -> float:
        """2 flops per weight a token meets: attention projections, dense MLPs, shared and its top-k experts,
        routers, lm_head."""
        params = (self.layers * self.attn_params + self.dense_layers * self.dense_mlp_params
                  + self.moe_layers * (self.shared_params + self.router_params + self.top_k * self.expert_params)
                  + self.vocab * self.hidden)
        return 2.0 * params

    def one_moe_layer(self, bits: float | None = BF16_BITS) -> "TargetShape":
        """One MoE layer (attention, router, shared and routed experts; no lm_head), as bench/verify_cost.py
        builds it; ``bits`` None keeps the config's."""
        nb = self.bits if bits is None else {k: bits for k in ("attn", "dense_mlp", "shared", "experts")}
        return replace(self, name=self.name + " (one MoE layer)", layers=1, dense_layers=0, moe_layers=1,
                       vocab=0, bits=dict(nb))

    def describe(self) -> str:
        bits = ", ".join(f"{k} {v:g}" for k, v in sorted(self.bits.items()))
        if not self.moe:
            return f"{self.name}: dense, {self.layers} layers, hidden {self.hidden}; bits: {bits or '16'}"
        return (f"{self.name}: MoE, {self.experts} experts top-{self.top_k}, expert width "
                f"{self.expert_params // (3 * self.hidden)}, {self.shared_params // (3 * self.hidden)} shared "
                f"width, {self.dense_layers} dense + {self.moe_layers} MoE of {self.layers} layers, hidden "
                f"{self.hidden}; bits: {bits or '16'}")


def _num(cfg: dict, key: str, where: str, default=None, required: bool = True, minimum: int = 1) -> int:
    if key not in cfg or cfg[key] is None:
        if default is not None or not required:
            return default
        raise _err(f"{where}: {key}", "missing", f"give {key} as a positive integer")
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and
                                                                  (math.isnan(v) or not v.is_integer())):
        raise _err(f"{where}: {key}", f"{v!r} is not an integer", f"give {key} as an integer >= {minimum}")
    if v < minimum:
        raise _err(f"{where}: {key}", f"{v!r} is below {minimum}", f"give {key} as an integer >= {minimum}")
    from specdeploy.checkpoint.modelcfg import BOUNDS
    top = BOUNDS.get(key, 1 << 30)  # beyond any real model: refused before the roofline loops over layers
    if v > top:
        raise _err(f"{where}: {key}", f"{v!r} is beyond any real model (at most {top:,})",
                   "give the model's real config.json")
    return int(v)


def _quant_bits(q: dict, where: str) -> tuple[float, list[str]]:
    """(bits per quantized weight, scales included; the ignore list) from a quantization_config."""
    if not isinstance(q, dict):
        raise _err(f"{where}: quantization_config", f"{q!r} is not a mapping", "give a mapping or remove it")
    ignore = q.get("ignore") or q.get("modules_to_not_convert") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise _err(f"{where}: quantization_config.ignore", f"{ignore!r} is not a list of module names",
                   "give a list of names or 're:' patterns")
    wq = None
    for name, group in (q.get("config_groups") or {}).items():
        if isinstance(group, dict) and isinstance(group.get("weights"), dict):
            wq = group["weights"]
            where_w = f"{where}: quantization_config.config_groups.{name}.weights"
            break
    if wq is None:  # GPTQ/AWQ style (bits), fp8 (quant_method)
        wq, where_w = q, f"{where}: quantization_config"
    bits = wq.get("num_bits", wq.get("bits"))
    if bits is None and str(q.get("quant_method", "")).startswith("fp8"):
        bits = 8
    if bits is None:
        raise _err(f"{where_w}: num_bits", "missing", "give num_bits (or bits) of the quantized weights")
    if isinstance(bits, bool) or not isinstance(bits, (int, float)) or math.isnan(bits) or not 1 <= bits <= 32:
        raise _err(f"{where_w}: num_bits", f"{bits!r} is not a bit width", "give an integer from 1 to 32")
    gs = wq.get("group_size")
    if gs is not None and (isinstance(gs, bool) or not isinstance(gs, (int, float)) or math.isnan(gs) or gs == 0):
        raise _err(f"{where_w}: group_size", f"{gs!r} is not a group size", "give a positive integer or -1")
    if gs and gs > 0:  # one 16-bit scale per group, and a 16-bit zero point when asymmetric
        bits = bits + 16 / gs * (1 if wq.get("symmetric", True) else 2)
    return float(bits), ignore


def _ignored(module: str, ignore: list[str]) -> bool:
    for pat in ignore:
        if pat.startswith("re:"):
            if re.match(pat[3:], module):
                return True
        elif module == pat or module.endswith("." + pat):
            return True
    return False


def shape_from_config(cfg: dict, where: str = "config.json") -> TargetShape:
    """Read a Hugging Face config (a wrapped multimodal config through its ``text_config``)."""
    if not isinstance(cfg, dict):
        raise _err(where, "is not a JSON object", "give the model's config.json")
    outer_q = cfg.get("quantization_config")
    if "text_config" in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise _err(f"{where}: text_config", "is not a mapping", "give the language model's config there")
        cfg, where = cfg["text_config"], f"{where}: text_config"
    hidden = _num(cfg, "hidden_size", where)
    layers = _num(cfg, "num_hidden_layers", where)
    vocab = _num(cfg, "vocab_size", where)
    heads = _num(cfg, "num_attention_heads", where)
    inter = _num(cfg, "intermediate_size", where, required=False) or 0
    if cfg.get("kv_lora_rank") is not None:  # MLA
        kv = _num(cfg, "kv_lora_rank", where)
        ql = _num(cfg, "q_lora_rank", where, required=False, minimum=0) or 0
        nope = _num(cfg, "qk_nope_head_dim", where)
        rope = _num(cfg, "qk_rope_head_dim", where)
        vd = _num(cfg, "v_head_dim", where)
        q = hidden * ql + ql * heads * (nope + rope) if ql else hidden * heads * (nope + rope)
        attn = q + hidden * (kv + rope) + kv * heads * (nope + vd) + heads * vd * hidden
        kv_tok = (kv + rope) * 2.0
        attn_flops = 2.0 * heads * (2 * kv + rope)  # absorbed MLA: scores over kv+rope, values over kv
    else:
        kvh = _num(cfg, "num_key_value_heads", where, default=heads)
        hd = _num(cfg, "head_dim", where, default=max(1, hidden // heads))
        attn = hidden * heads * hd + 2 * hidden * kvh * hd + heads * hd * hidden
        kv_tok = 2 * kvh * hd * 2.0
        attn_flops = 2.0 * heads * hd * 2
    experts = 0
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if cfg.get(key) is not None:
            experts = _num(cfg, key, where, minimum=0)
            break
    shape = dict(name=str(cfg.get("model_type") or "model"), hidden=hidden, layers=layers, vocab=vocab,
                 attn_params=attn, dense_mlp_params=3 * hidden * inter, kv_bytes_per_token=kv_tok,
                 attn_flops_per_ctx=attn_flops)
    if experts:
        top_k = _num(cfg, "num_experts_per_tok", where)
        if top_k > experts:
            raise _err(f"{where}: num_experts_per_tok", f"{top_k} is above the {experts} experts",
                       "give the experts each token routes to")
        width = _num(cfg, "moe_intermediate_size", where, default=inter or None)
        n_shared = _num(cfg, "n_shared_experts", where, default=0, minimum=0)
        shared_w = _num(cfg, "shared_expert_intermediate_size", where, default=0, minimum=0) or n_shared * width
        first = _num(cfg, "first_k_dense_replace", where, default=0, minimum=0)
        freq = _num(cfg, "moe_layer_freq", where, default=1)
        if first > layers:
            raise _err(f"{where}: first_k_dense_replace", f"{first} is above num_hidden_layers {layers}",
                       "give the number of leading dense layers")
        moe_layers = sum(1 for i in range(first, layers) if i % freq == 0)
        shape.update(experts=experts, top_k=top_k, expert_params=3 * hidden * width, shared_params=3 * hidden *
                     shared_w, router_params=experts * hidden, moe_layers=moe_layers,
                     dense_layers=layers - moe_layers)
        if not inter and layers - moe_layers:
            raise _err(f"{where}: intermediate_size", "missing, and the config has dense layers",
                       "give the dense layers' MLP width")
    else:
        if not inter:
            raise _err(f"{where}: intermediate_size", "missing", "give the MLP width")
        shape.update(moe_layers=0, dense_layers=layers)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    base = 32.0 if dtype in ("float32", "float") else BF16_BITS
    bits = {p: base for p in ("attn", "dense_mlp", "shared", "experts", "lm_head")}
    q = cfg.get("quantization_config", outer_q)
    if q is not None:
        qbits, ignore = _quant_bits(q, where)
        probe = {"attn": "model.layers.1.self_attn.o_proj", "dense_mlp": "model.layers.0.mlp.gate_proj",
                 "shared": "model.layers.1.mlp.shared_experts.gate_proj",
                 "experts": "model.layers.1.mlp.experts.0.gate_proj", "lm_head": "lm_head"}
        for part, module in probe.items():
            if not _ignored(module, ignore):
                bits[part] = qbits
    if not experts:
        bits = {k: v for k, v in bits.items() if k not in ("shared", "experts")}
    shape["bits"] = bits
    return TargetShape(**shape)


def load_target(model_dir: str | Path) -> TargetShape:
    p = Path(model_dir)
    cfg_path = p / "config.json" if p.is_dir() else p
    if not cfg_path.is_file():
        raise _err("--target", f"{cfg_path} does not exist", "give the model directory holding config.json")
    from specdeploy.values.bounded import loads, read_regular
    try:
        cfg = loads(read_regular(cfg_path))
    except (OSError, ValueError) as exc:  # bounded.Refused is a ValueError: too large, too deep, not a file
        raise _err(str(cfg_path), f"cannot be read as JSON ({exc})", "give the model's config.json") from None
    return shape_from_config(cfg, str(cfg_path))


# ---- the hardware -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Peaks:
    name: str
    gpus: int
    bandwidth_gbs: float  # per GPU
    tflops: float         # per GPU, dense BF16

    @property
    def bw(self) -> float:  # bytes/s over the host (tensor parallel: every GPU reads its share)
        return self.gpus * self.bandwidth_gbs * 1e9

    @property
    def peak(self) -> float:
        return self.gpus * self.tflops * 1e12


def peaks(profile_name: str, gpus: int | None = None) -> Peaks:
    from specdeploy.values.hardware import PROFILES
    if profile_name not in PROFILES:
        raise _err("--hardware", f"'{profile_name}' is not a named profile", f"use one of {', '.join(PROFILES)}")
    p = PROFILES[profile_name]
    if not p.hbm_bandwidth_gbs or not p.bf16_dense_tflops:
        raise _err(f"--hardware {profile_name}", "has no hbm_bandwidth_gbs / bf16_dense_tflops",
                   "add the vendor figures to the profile in hardware.py")
    return Peaks(p.name, gpus or p.gpu_count, p.hbm_bandwidth_gbs, p.bf16_dense_tflops)


# ---- the roofline -----------------------------------------------------------------------------------------
@dataclass
class Step:
    tokens: int
    distinct: float       # distinct experts per MoE layer
    bytes: float
    flops: float
    seconds: float
    bound: str            # "memory" or "compute"


def step(shape: TargetShape, hw: Peaks, batch: int, positions: int, distinct: float, context: int = 0) -> Step:
    """One forward step of ``batch`` sequences x ``positions`` tokens: max(bytes / BW, flops / peak). Weights
    are read once per step; with ``context`` > 0 each sequence also reads its KV cache once (all its positions
    attend to it in one pass) and every token attends over it."""
    n = batch * positions
    byt = shape.fixed_bytes() + shape.moe_layers * distinct * shape.expert_bytes()
    byt += shape.layers * batch * context * shape.kv_bytes_per_token
    fl = n * shape.flops_per_token() + shape.layers * n * context * shape.attn_flops_per_ctx
    t_mem, t_cmp = byt / hw.bw, fl / hw.peak
    return Step(n, distinct, byt, fl, max(t_mem, t_cmp), "memory" if t_mem >= t_cmp else "compute")


def expected_distinct(shape: TargetShape, batch: int, positions: int, locality: float | None) -> float:
    if not shape.moe:
        return 0.0
    return distinct_experts(shape.experts, shape.top_k, batch, positions, locality)


def draft_step_seconds(shape: TargetShape, hw: Peaks, batch: int, draft_bytes: float | None) -> float:
    """One draft position: by default one of the target's dense layers' weights (attention + dense MLP, at
    16 bits; an EAGLE-3 head is one such layer) over the bandwidth, with its flops as the compute bound."""
    if draft_bytes is None:
        width = shape.dense_mlp_params or shape.expert_params * max(1, shape.top_k)
        draft_bytes = (shape.attn_params + width) * BF16_BITS / 8
    return max(draft_bytes / hw.bw, batch * draft_bytes / hw.peak)  # 16-bit weights: 1 flop per byte per token


@dataclass
class Row:
    batch: int
    k: int
    ratio_local: float            # T_verify / T_decode, local routing (the low end)
    ratio_uniform: float          # uniform routing (the high end)
    ratio_trace: float | None
    draft_ratio: float            # k draft positions over one decode step
    needed_al: tuple              # (low, high): AL for 1.0x, drafter included
    needed_al_margin: tuple       # (low, high): AL for 1 + margin
    reachable: bool               # the high end's margin AL is at most k + 1
    decode_ms: float
    verify_ms: tuple              # (local, uniform)
    distinct: dict                # decode / local / uniform (/ trace) distinct experts per MoE layer
    bound: str

    def to_dict(self) -> dict:
        return asdict(self)


def predict(shape: TargetShape, hw: Peaks, batches: list[int], ks: list[int], locality: float = DEFAULT_LOCALITY,
            margin: float | None = None, draft_cost: float | None = None, draft_bytes: float | None = None,
            context: int = 0, trace: "Trace | None" = None) -> list[Row]:
    """One row per batch and k. ``draft_cost``: one draft position's cost as a fraction of a decode step
    (overrides ``draft_bytes`` and the default dense layer)."""
    margin = gate_margin() if margin is None else margin
    _check_fraction(locality, "--locality")
    rows = []
    for b in batches:
        d_dec = expected_distinct(shape, b, 1, None)
        t_dec = step(shape, hw, b, 1, d_dec, context)
        for k in ks:
            d_loc = expected_distinct(shape, b, k + 1, locality)
            d_uni = expected_distinct(shape, b, k + 1, None)
            s_loc, s_uni = step(shape, hw, b, k + 1, d_loc, context), step(shape, hw, b, k + 1, d_uni, context)
            distinct = {"decode": d_dec, "local": d_loc, "uniform": d_uni}
            r_trace = None
            if trace is not None:
                td, tv = trace.distinct(b, k)
                distinct.update(trace_decode=td, trace_verify=tv)
                r_trace = step(shape, hw, b, k + 1, tv, context).seconds / step(shape, hw, b, 1, td, context).seconds
            if draft_cost is not None:
                dr = k * draft_cost
            else:
                dr = k * draft_step_seconds(shape, hw, b, draft_bytes) / t_dec.seconds
            lo, hi = s_loc.seconds / t_dec.seconds, s_uni.seconds / t_dec.seconds
            need = (lo + dr, hi + dr)
            need_m = (need[0] * (1 + margin), need[1] * (1 + margin))
            rows.append(Row(b, k, lo, hi, r_trace, dr, need, need_m, need_m[1] <= k + 1, t_dec.seconds * 1e3,
                            (s_loc.seconds * 1e3, s_uni.seconds * 1e3), distinct,
                            "compute" if "compute" in (t_dec.bound, s_uni.bound) else "memory"))
    return rows


def add_predictions(report: dict, shape, hw) -> dict:
    """The roofline's step-time ratio for each measured level at the report's k (``verifycost.predict``: verify
    plus draft over one decode step, local and uniform routing), beside the one the gate measured, and the
    acceptance length it needs for 1.0x (the same range). ``report``: what ``gate.gate`` returns; ``shape``: the
    target's (:func:`load_target`); ``hw``: the host's (:func:`peaks`)."""
    k = report.get("k")
    if not k or not report.get("speculation"):
        return report
    for lv in report["levels"]:
        row = predict(shape, hw, [int(lv["concurrency"])], [int(k)], margin=report["margin"])[0]
        lv["predicted_step_ratio"] = [row.needed_al[0], row.needed_al[1]]
    report["prediction"] = {"target": shape.describe(), "hardware": hw.name, "k": int(k)}
    return report


def gate_margin() -> float:
    """The gate's default margin: the one `specdeploy breakeven` and the gate keep speculation with."""
    import inspect

    from specdeploy.speculation.gate import breakeven
    return float(inspect.signature(breakeven).parameters["margin"].default)


def _check_fraction(v: float, subject: str) -> None:
    if not isinstance(v, (int, float)) or math.isnan(v) or not 0 <= v <= 1:
        raise _err(subject, f"{v!r} is not a fraction from 0 to 1", "give e.g. 0.75 (6 of 8 experts kept)")


# ---- routing traces ---------------------------------------------------------------------------------------
@dataclass
class Trace:
    """Expert ids per token per MoE layer, grouped by sequence in position order (docs/speculation.md)."""
    sequences: dict  # seq id -> list of tokens, each a list (per MoE layer) of expert-id lists
    layers: int
    source: str = ""

    def windows(self, k: int) -> list[list]:
        """Non-overlapping windows of k + 1 consecutive tokens, taken round-robin across sequences so a batch
        mixes sequences before it takes a second window of one."""
        per_seq = [[toks[i:i + k + 1] for i in range(0, len(toks) - k, k + 1)] for toks in self.sequences.values()]
        out = []
        for j in range(max((len(w) for w in per_seq), default=0)):
            out.extend(w[j] for w in per_seq if j < len(w))
        return out

    def distinct(self, batch: int, k: int) -> tuple[float, float]:
        """Mean distinct experts per MoE layer of a decode step (the first token of ``batch`` windows) and of
        a verify step (all k + 1 tokens of the same windows), over the trace's full batches and its layers."""
        wins = self.windows(k)
        if len(wins) < batch:
            raise _err("--routing-trace", f"{self.source} holds {len(wins)} windows of {k + 1} consecutive tokens, "
                       f"fewer than batch {batch}", "dump more tokens or sequences, or give a smaller --batch")
        dec = ver = 0.0
        groups = len(wins) // batch
        for g in range(groups):
            grp = wins[g * batch:(g + 1) * batch]
            for layer in range(self.layers):
                dec += len({e for w in grp for e in w[0][layer]})
                ver += len({e for w in grp for t in w for e in t[layer]})
        n = groups * self.layers
        return dec / n, ver / n

    def locality(self) -> float | None:
        """Mean fraction of a token's experts the previous position of its sequence also used."""
        num = den = 0
        for toks in self.sequences.values():
            for a, b in zip(toks, toks[1:]):
                for la, lb in zip(a, b):
                    num += len(set(la) & set(lb))
                    den += len(lb)
        return num / den if den else None


def load_trace(path: str | Path, experts: int | None = None) -> Trace:
    """JSON lines, one token per line, or a JSON list of the same objects (or {"tokens": [...]}):
    {"seq": <id>, "pos": <int>, "experts": [[ids of MoE layer 0], [ids of MoE layer 1], ...]}."""
    p = Path(path)
    subj = f"--routing-trace {p}"
    if not p.is_file():
        raise _err(subj, "does not exist", "give a routing trace file (docs/speculation.md has the format)")
    from specdeploy.values.bounded import loads, read_regular
    try:
        text = read_regular(p, 256 << 20).decode("utf-8")
    except (OSError, ValueError) as exc:
        raise _err(subj, f"cannot be read ({exc})", "give a routing trace file (UTF-8 JSON lines)") from None
    records: list[tuple[str, object]] = []
    try:
        whole = loads(text)
        if isinstance(whole, dict) and "tokens" not in whole:
            whole = [whole]  # JSON lines of one line
        items = whole.get("tokens") if isinstance(whole, dict) else whole
        if not isinstance(items, list):
            raise _err(subj, "is neither a list of tokens nor {\"tokens\": [...]}", "see docs/speculation.md")
        records = [("line 1" if len(items) == 1 and not text.lstrip().startswith("[") else f"token {i}", t)
                   for i, t in enumerate(items)]
    except ValueError:
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append((f"line {n}", loads(line)))
                except ValueError as exc:
                    raise _err(f"{subj}: line {n}", f"is not JSON ({getattr(exc, 'msg', exc)})",
                               "one JSON object a line") from None
    seqs: dict = {}
    layers = None
    for where, t in records:
        if not isinstance(t, dict):
            raise _err(f"{subj}: {where}", "is not an object", 'give {"seq": .., "pos": .., "experts": [[..]]}')
        for key in ("seq", "pos", "experts"):
            if key not in t:
                raise _err(f"{subj}: {where}: {key}", "missing", 'give {"seq": .., "pos": .., "experts": [[..]]}')
        pos, ex = t["pos"], t["experts"]
        if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
            raise _err(f"{subj}: {where}: pos", f"{pos!r} is not a position", "give the token's position, >= 0")
        if not isinstance(ex, list) or not ex or not all(isinstance(la, list) and la for la in ex):
            raise _err(f"{subj}: {where}: experts", "is not a non-empty list of expert-id lists",
                       "give one list of expert ids per MoE layer")
        for la in ex:
            for e in la:
                if isinstance(e, bool) or not isinstance(e, int) or e < 0 or (experts and e >= experts):
                    raise _err(f"{subj}: {where}: experts", f"{e!r} is not an expert id" +
                               (f" below {experts}" if experts else ""), "give the routed experts' indices")
        if layers is None:
            layers = len(ex)
        elif len(ex) != layers:
            raise _err(f"{subj}: {where}: experts", f"has {len(ex)} layers, earlier tokens {layers}",
                       "give every token the same MoE layers")
        seqs.setdefault(str(t["seq"]), []).append((pos, ex))
    if not seqs:
        raise _err(subj, "holds no tokens", "dump the routing of some decoded tokens")
    ordered = {}
    for s, toks in seqs.items():
        toks.sort(key=lambda x: x[0])
        if any(b[0] != a[0] + 1 for a, b in zip(toks, toks[1:])):
            raise _err(f"{subj}: seq {s}: pos", "positions are not consecutive",
                       "dump every decoded token of a sequence")
        ordered[s] = [ex for _, ex in toks]
    return Trace(ordered, layers, str(p))
