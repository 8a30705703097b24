"""The acceptance oracle's MLA pairs: a DeepSeek-V3 target and EAGLE-3 heads with MLA attention
(``Eagle3DeepseekV2ForCausalLM``), written by ``oraclegen_mla.py``, and what an exporter may do to them.

vLLM's CPU build serves an MLA head only on an MLA target, in bfloat16 (its AMX MLA kernels take bfloat16
weights: a float32 head fails at weight processing; a Llama target's attention metadata refuses the head's latent
dimension), so these pairs are bfloat16 on a DeepSeek-V3 body, measured on releases with an MLA head (0.18.0 on;
0.16.0 has neither the head nor a DeepSeek EAGLE-3 target). Their record is ``vllm-<release>-mla.json``.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from specdeploy.testing import cache, oracle, tinymodels
from specdeploy.testing.oracle_variants import (
    AUX_FORMS,
    DRAFT,
    LAYERS,
    VOCAB,
    Variant,
    _both,
    _cfg,
    _d2t,
    _drop,
    _maps,
    tokenizer_config,
)

GENERATOR = Path(__file__).with_name("oraclegen_mla.py")
SET = "mla"
H = 256
TARGET_CONFIG = {k: v for k, v in copy.deepcopy(tinymodels.DEEPSEEK_V3).items() if k != "rope_scaling"}
TARGET_CONFIG.update(num_hidden_layers=LAYERS, first_k_dense_replace=LAYERS, max_position_embeddings=8192,
                     rope_theta=10000.0, torch_dtype="bfloat16")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
HEADS = {"M": {"taps": [1, 4, 6]}, "MF": {"taps": [1, 4, 6], "fc_norm": True}}


def head_spec(name: str) -> dict:
    h = dict(HEADS[name], vocab="draft", mla=True)
    h["seed"] = 3100 + list(HEADS).index(name)
    return h


def head_config(name: str) -> dict:
    h = head_spec(name)
    t = TARGET_CONFIG
    cfg = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": H,
           "target_hidden_size": H, "intermediate_size": 512, "num_hidden_layers": 1,
           "num_attention_heads": t["num_attention_heads"], "num_key_value_heads": t["num_attention_heads"],
           **{k: t[k] for k in MLA_KEYS}, "hidden_act": "silu", "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
           "draft_vocab_size": len(DRAFT), "max_position_embeddings": 8192, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "eagle_aux_hidden_state_layer_ids": list(h["taps"]),
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [x - 1 for x in h["taps"]],
                            "use_aux_hidden_state": True}}
    if h.get("fc_norm"):
        cfg["fc_norm"] = True
    return cfg


def head_tensors(name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    from specdeploy.drafter.mla import layer_params
    h, cfg = head_spec(name), head_config(name)
    ts = dict(layer_params(cfg, H, 0))
    ts.update({"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (len(DRAFT), H),
               "embed_tokens.weight": (VOCAB, H)})
    if h.get("fc_norm"):
        ts.update({f"fc_norm.{j}.weight": (H,) for j in range(3)})
    out = {n: ("BF16", s) for n, s in ts.items()}
    out["d2t"] = ("I64", (len(DRAFT),))
    out["t2d"] = ("BOOL", (VOCAB,))
    return out


@dataclass
class MlaVariant(Variant):
    def fingerprint(self) -> str:
        blob = json.dumps([SET, self.config, sorted((n, d, list(s)) for n, (d, s) in tensor_specs(self).items()),
                           self.d2t, self.t2d, head_spec(self.head), self.edits], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tensor_specs(v: Variant) -> dict[str, tuple[str, tuple[int, ...]]]:
    ts = head_tensors(v.head)
    for e in v.edits:
        if e[0] == "drop":
            for n in e[1:]:
                ts.pop(n, None)
        elif e[0] == "rename":
            for n in [n for n in ts if n.startswith(e[1])]:
                ts[e[2] + n[len(e[1]):]] = ts.pop(n)
    if v.d2t is None:
        ts.pop("d2t", None)
    if v.t2d is None:
        ts.pop("t2d", None)
    return ts


A = "layers.0.self_attn."
P = "layers.0."
EDITS = {
    "as-trained": _both(),
    **{k: AUX_FORMS[k] for k in ("aux-top", "aux-nested", "aux-none", "aux-top-plus-one")},
    **{f"drop-{n}": _drop(A + n + ".weight") for n in ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa",
                                                        "kv_a_layernorm", "kv_b_proj", "o_proj")},
    **{f"drop-{n}": _drop(P + n + ".weight") for n in ("input_layernorm", "hidden_norm",
                                                        "post_attention_layernorm")},
    "drop-down_proj": _drop(P + "mlp.down_proj.weight"),
    "drop-norm": _drop("norm.weight"),
    "drop-fc": _drop("fc.weight", defect=("fc.weight", "missing tensors")),
    "drop-lm_head": _drop("lm_head.weight", defect=("lm_head.weight",)),
    "drop-d2t": _both(lambda v, t: setattr(v, "d2t", None), defect=("d2t",)),
    "d2t-shifted": _d2t(lambda d: [x + 1 for x in d]),
    "model-type-deepseek_v3": _both(_cfg(model_type="deepseek_v3"), defect=("model_type",)),
    "model-type-kimi_k2": _cfg(model_type="kimi_k2"),  # what the published Kimi MLA heads write
    "no-q_lora_rank": _both(_cfg(q_lora_rank=None), defect=("q_lora_rank",)),
    "nbf-spurious": _cfg(norm_before_fc=True),
    "midlayer-names": lambda v, t: v.edits.append(["rename", "layers.0.", "midlayer."]),
    "vocab-undeclared": _cfg(draft_vocab_size=None),
    "tied": _cfg(tie_word_embeddings=True),
}
EXTRA = {"MF": {"as-trained": _both(),
                "fcn-missing": _cfg(fc_norm=None),
                "fcn-nested": _both(_cfg(fc_norm=None),
                                    lambda v, t: v.config["eagle_config"].update(fc_norm=True)),
                "drop-fc_norm.0": _drop("fc_norm.0.weight")}}


def variants() -> list[MlaVariant]:
    out = []
    for head in HEADS:
        edits = EDITS if head == "M" else EXTRA[head]
        for ename, edit in edits.items():
            v = MlaVariant("", head, head_config(head))
            v.d2t, v.t2d = _maps(DRAFT)
            v.name = f"{head}-{ename}"
            edit(v, head_spec(head)["taps"])
            out.append(v)
    return out


def by_name() -> dict[str, MlaVariant]:
    return {v.name: v for v in variants()}


def generator_spec(vs: list[Variant]) -> list[dict]:
    return [{"name": v.name, "head": head_spec(v.head), "head_config": head_config(v.head), "config": v.config,
             "edits": v.edits, "d2t": v.d2t, "t2d": v.t2d, "draft": DRAFT} for v in vs]


# --- building and measuring -----------------------------------------------------------------------------------
def _generate(spec: dict, out: Path, progress=None):
    oracle._generate(spec, out, progress, generator=GENERATOR)


def _key(*parts) -> str:
    return oracle._key(*parts, GENERATOR)


def target(progress=None) -> Path:
    spec = dict(oracle.target_spec(), config=TARGET_CONFIG, seed=4343)
    k = _key(spec)
    final = tinymodels.CACHE / f"oracle-mla-target-{k[:16]}"
    return cache.build_entry(final, k, lambda tmp: _generate(spec, tmp, progress), tinymodels.LOCK,
                             "oracle MLA target build", progress)


def drafters(vs: list[Variant], progress=None) -> tuple[Path, dict[str, Path]]:
    t = target(progress)
    spec = {"what": "drafters", "target": str(t), "variants": generator_spec(vs)}
    k = _key(spec, str(t))
    final = tinymodels.CACHE / f"oracle-mla-drafters-{k[:16]}"
    root = cache.build_entry(final, k, lambda tmp: _generate(spec, tmp, progress), tinymodels.LOCK,
                             f"oracle MLA drafters build ({len(vs)})", progress)
    return t, {v.name: root / v.name for v in vs}


def measure(version: str, target_dir: Path, cases: dict[str, Path], **kw) -> dict[str, dict]:
    return oracle.measure(version, target_dir, cases, dtype=TARGET_CONFIG["torch_dtype"], **kw)


# --- header-only pairs for the doctor ---------------------------------------------------------------------------
def write_sparse_pair(v: Variant, root: Path) -> tuple[Path, Path]:
    import struct

    from specdeploy.checkpoint.safetensors_io import write_sparse
    t = root / "mla-target"
    if not (t / "config.json").is_file():
        t.mkdir(parents=True, exist_ok=True)
        (t / "config.json").write_text(json.dumps(TARGET_CONFIG, indent=1))
        (t / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    d = root / "mla-drafters" / v.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(v.config, indent=1))
    data = {}
    if v.d2t is not None:
        data["d2t"] = struct.pack(f"<{len(v.d2t)}q", *v.d2t)
    if v.t2d is not None:
        data["t2d"] = bytes(v.t2d)
    write_sparse(d / "model.safetensors", tensor_specs(v), data)
    return t, d


def variant_set(rec_or_name) -> tuple[dict, object]:
    """({name: variant}, write_sparse_pair) of a record's variant set: the Llama heads, or "mla"."""
    which = rec_or_name.get("set") if isinstance(rec_or_name, dict) else rec_or_name
    if which == SET:
        return by_name(), write_sparse_pair
    from specdeploy.testing import oracle_variants
    return oracle_variants.by_name(), oracle_variants.write_sparse_pair
