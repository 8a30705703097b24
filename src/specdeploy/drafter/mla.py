"""The MLA EAGLE-3 head (DeepSeek-style multi-latent attention, the Kimi/DeepSeek heads) an engine release builds,
from the adapter's ``DRAFTER["mla"]`` table: the parameters its loader places (per decoder layer: the latent
projections ``q_a_proj``/``kv_a_proj_with_mqa`` with their norms, ``q_b_proj``, ``kv_b_proj``, ``o_proj``, the
dense MLP and the three norms; ``fc``, ``fc_norm.K``, ``norm``), the switches it reads and where, and what it does
with a tensor it has no parameter for. :func:`view` gives the rest of the doctor an adapter whose ``DRAFTER`` is
the MLA head's, so the Llama head's rules (switches, names, shapes, vocabulary) run on the MLA facts unchanged.
"""
from __future__ import annotations

from specdeploy.engines import EngineAdapter
from specdeploy.values.errors import Report

# the loaders' stacked shards: a name with one of these parts goes to a fused parameter (KeyError when none)
STACKED = (".gate_proj.", ".up_proj.", ".q_a_proj.", ".kv_a_proj_with_mqa.")


class _View:
    """An adapter whose DRAFTER table is the MLA head's (its keys over the engine's)."""

    def __init__(self, a: EngineAdapter, facts: dict):
        self._a = a
        self.DRAFTER = {**a.DRAFTER, **facts}

    def __getattr__(self, name):
        return getattr(self._a, name)


def read(a: EngineAdapter) -> dict | None:
    """The MLA head's facts for this release; None where the release's MLA loader was not read."""
    facts = a.DRAFTER.get("mla")
    if not facts or not facts["read"].contains(a.version):
        return None
    return facts


def view(a: EngineAdapter):
    """``a`` seen through its MLA head's table, or ``a`` itself where that head was not read."""
    facts = read(a)
    return _View(a, facts) if facts is not None else a


def _int(cfg: dict, key: str) -> int | None:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def layer_params(cfg: dict, h: int, i: int) -> dict[str, tuple[int, ...]]:
    """Decoder layer ``i``'s parameters in the checkpoint's spelling (the fused shards by their own names), as
    the engines' MLA head builds them for this config; layer 0 reads embeddings and hidden states side by side."""
    width = 2 * h if i == 0 else h
    heads = _int(cfg, "num_attention_heads") or 0
    ql, kvl = _int(cfg, "q_lora_rank"), _int(cfg, "kv_lora_rank") or 0
    nope, rope, vd = (_int(cfg, k) or 0 for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    inter = _int(cfg, "intermediate_size") or 0
    p, a = f"layers.{i}.", f"layers.{i}.self_attn."
    out: dict[str, tuple[int, ...]] = {}
    if ql:
        out.update({a + "q_a_proj.weight": (ql, width), a + "q_a_layernorm.weight": (ql,),
                    a + "q_b_proj.weight": (heads * (nope + rope), ql)})
    else:
        out[a + "q_proj.weight"] = (heads * (nope + rope), width)
    out.update({a + "kv_a_proj_with_mqa.weight": (kvl + rope, width), a + "kv_a_layernorm.weight": (kvl,),
                a + "kv_b_proj.weight": (heads * (nope + vd), kvl), a + "o_proj.weight": (h, heads * vd),
                p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,), p + "hidden_norm.weight": (h,)})
    return out


def check(d, a, rep: Report):
    """What the MLA head needs from the config before any tensor is placed."""
    facts = read(a)
    if facts is None:
        return
    need = facts.get("needs_q_lora_rank")
    if need is not None and need.contains(a.version) and _int(d.layer, "q_lora_rank") is None:
        rep.add("error", "q_lora_rank", f"not set: {a.label} {a.version}'s MLA EAGLE-3 head takes the latent query "
                "projection (q_a_proj) only; without q_lora_rank it fails to load ("
                + facts.get("q_lora_rank_failure", "the load fails") + ")",
                "set q_lora_rank to the rank the head was trained with (the rows of q_a_proj.weight)")
    if d.layer.get("index_topk") is not None:
        rep.add("warning", "index_topk", f"set: {a.label} builds a sparse-attention indexer for such an MLA head, "
                "whose parameters specdeploy does not record", "check the drafter on the engine itself")


def unknown_split(names: list[str], a) -> tuple[list[str], list[str]]:
    """(names the loader raises on, the rest) where the release drops unknown names but its stacked-shard
    mapping raises on a shard with no fused parameter."""
    span = a.DRAFTER.get("unknown_stacked_raises")
    if span is None or not span.contains(a.version):
        return [], names
    raising = [n for n in names if any(s in "." + n for s in STACKED)]
    return raising, [n for n in names if n not in raising]
