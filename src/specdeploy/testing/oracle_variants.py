"""The acceptance oracle's variants: trained EAGLE-3 heads for the oracle target (``oraclegen.py`` writes them) and
what an exporter may do to each (where the aux ids and the switches are written, tensors dropped or replaced, the
vocabulary map wrong, aux states switched off). Each variant is data: the exported config, the tensor edits, the
``d2t``/``t2d`` it ships; from it the generator writes real weights and :func:`tensor_specs` the names, dtypes
and shapes, so that a header-only copy (:func:`write_sparse_pair`) is the same pair as far as the doctor reads.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from specdeploy.testing import tinymodels

LAYERS = 8
VOCAB = tinymodels.VOCAB
TARGET_CONFIG = dict(copy.deepcopy(tinymodels.LLAMA), num_hidden_layers=LAYERS, intermediate_size=512,
                     max_position_embeddings=8192)
DEFAULT_TAPS = [2, LAYERS // 2, LAYERS - 3]
SPECIAL_IDS = {name: i for i, name in enumerate(tinymodels.SPECIALS)}
DRAFT = sorted({SPECIAL_IDS[s] for s in tinymodels.DRAFT_SPECIALS} | set(range(len(tinymodels.SPECIALS), VOCAB)))
FULL = list(range(VOCAB))
H = TARGET_CONFIG["hidden_size"]

# trained heads: taps (vLLM numbering; None: trained without aux states), the norms before fc, the vocabulary
HEADS = {
    "A": {"taps": [1, 4, 6]},
    "D": {"taps": list(DEFAULT_TAPS)},
    "S": {"taps": [3, 5, 7]},
    "E": {"taps": [0, 3, 7]},
    "N": {"taps": [1, 4, 6], "norm_before_fc": True},
    "F": {"taps": [1, 4, 6], "fc_norm": True},
    "X": {"taps": None},
    "V": {"taps": [1, 4, 6], "vocab": "full"},
}


def head_spec(name: str) -> dict:
    h = dict(HEADS[name])
    h.setdefault("vocab", "draft")
    h["seed"] = 3000 + list(HEADS).index(name)
    return h


def head_config(name: str) -> dict:
    """The config the head was trained with, as its exporter writes it."""
    h = head_spec(name)
    cfg = dict(copy.deepcopy(tinymodels.DRAFTER), hidden_size=H, target_hidden_size=H, vocab_size=VOCAB,
               max_position_embeddings=TARGET_CONFIG["max_position_embeddings"], torch_dtype="float32")
    if h["vocab"] == "draft":
        cfg["draft_vocab_size"] = len(DRAFT)
    if h["taps"] is None:
        cfg["eagle_config"] = {"use_aux_hidden_state": False}
    else:
        cfg["eagle_aux_hidden_state_layer_ids"] = list(h["taps"])
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [t - 1 for t in h["taps"]],
                               "use_aux_hidden_state": True}
    if h.get("norm_before_fc"):
        cfg["norm_before_fc"] = True
    if h.get("fc_norm"):
        cfg["fc_norm"] = True
    return cfg


def head_tensors(name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The trained head's tensors: name -> (safetensors dtype, shape), as oraclegen writes them."""
    h, cfg = head_spec(name), head_config(name)
    nh, nkv, hd, inter = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                          cfg["intermediate_size"])
    p = "layers.0."
    ts = {p + "self_attn.q_proj.weight": (nh * hd, 2 * H), p + "self_attn.k_proj.weight": (nkv * hd, 2 * H),
          p + "self_attn.v_proj.weight": (nkv * hd, 2 * H), p + "self_attn.o_proj.weight": (H, nh * hd),
          p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
          p + "mlp.down_proj.weight": (H, inter), p + "input_layernorm.weight": (H,),
          p + "hidden_norm.weight": (H,), p + "post_attention_layernorm.weight": (H,), "norm.weight": (H,),
          "lm_head.weight": (len(DRAFT) if h["vocab"] == "draft" else VOCAB, H), "embed_tokens.weight": (VOCAB, H)}
    if h["taps"] is not None:
        ts["fc.weight"] = (H, 3 * H)
    if h.get("norm_before_fc"):
        ts["input_norm.weight"] = (3 * H,)
    if h.get("fc_norm"):
        ts.update({f"fc_norm.{j}.weight": (H,) for j in range(3)})
    out = {n: ("F32", s) for n, s in ts.items()}
    if h["vocab"] == "draft":
        out["d2t"] = ("I64", (len(DRAFT),))
        out["t2d"] = ("BOOL", (VOCAB,))
    return out


@dataclass
class Variant:
    name: str
    head: str
    config: dict
    edits: list = field(default_factory=list)   # tensor edits, as oraclegen applies them
    d2t: list | None = None                      # offsets (target id - draft id)
    t2d: list | None = None                      # mask over the target vocabulary
    defect: tuple = ()                           # the doctor subjects that name this variant's defect

    def fingerprint(self) -> str:
        """What the pair is as far as the doctor and the engine read it (config, tensors, vocabulary maps)."""
        blob = json.dumps([self.config, sorted((n, d, list(s)) for n, (d, s) in tensor_specs(self).items()),
                           self.d2t, self.t2d, head_spec(self.head), self.edits], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tensor_specs(v: Variant) -> dict[str, tuple[str, tuple[int, ...]]]:
    ts = head_tensors(v.head)
    for e in v.edits:
        op = e[0]
        if op == "drop":
            for n in e[1:]:
                ts.pop(n, None)
        elif op == "rename":
            for n in [n for n in ts if n.startswith(e[1])]:
                ts[e[2] + n[len(e[1]):]] = ts.pop(n)
        elif op == "add_fc":
            ts["fc.weight"] = ("F32", (H, 3 * H))
        elif op == "lm_head_rows":
            ts["lm_head.weight"] = ("F32", (VOCAB, H))
    if v.d2t is None:
        ts.pop("d2t", None)
    else:
        ts["d2t"] = ("I64", (len(v.d2t),))
    if v.t2d is None:
        ts.pop("t2d", None)
    else:
        ts["t2d"] = ("BOOL", (len(v.t2d),))
    return ts


def _maps(sel: list[int]) -> tuple[list[int], list[int]]:
    mask = [0] * VOCAB
    for t in sel:
        mask[t] = 1
    return [t - i for i, t in enumerate(sel)], mask


# --- the edits ----------------------------------------------------------------------------------------------
def _aux(top, nested, extra=None):
    def f(v: Variant, taps):
        v.config.pop("eagle_aux_hidden_state_layer_ids", None)
        ec = dict(v.config.get("eagle_config") or {})
        ec.pop("eagle_aux_hidden_state_layer_ids", None)
        t, n = top(taps), nested(taps)
        if t is not None:
            v.config["eagle_aux_hidden_state_layer_ids"] = t
        if n is not None:
            ec["eagle_aux_hidden_state_layer_ids"] = n
        ec.update(extra(taps) if extra else {})
        v.config["eagle_config"] = ec
    return f


def _vllm(taps):
    return list(taps)


def _sglang(taps):
    return [t - 1 for t in taps]


def _none(taps):
    return None


AUX_FORMS = {
    "aux-both": _aux(_vllm, _sglang),
    "aux-top": _aux(_vllm, _none),
    "aux-nested": _aux(_none, _sglang),
    "aux-none": _aux(_none, _none),
    "aux-top-sglang-numbers": _aux(_sglang, _none),
    "aux-nested-vllm-numbers": _aux(_none, _vllm),
    "aux-same-numbers": _aux(_vllm, _vllm),
    "aux-top-plus-one": _aux(lambda t: [x + 1 for x in t], _none),
    "aux-v2-layer-ids-key": _aux(_none, _none, lambda t: {"layer_ids": list(t)}),
}


def _drop(*names, defect=None):
    def f(v: Variant, taps):
        v.edits.append(["drop", *names])
        v.defect = defect if defect is not None else ("missing tensors", *names)
    return f


def _cfg(**kv):
    def f(v: Variant, taps):
        for k, val in kv.items():
            if val is None:
                v.config.pop(k, None)
            else:
                v.config[k] = val
    return f


def _ec(**kv):
    def f(v: Variant, taps):
        ec = dict(v.config.get("eagle_config") or {})
        for k, val in kv.items():
            if val is None:
                ec.pop(k, None)
            else:
                ec[k] = val
        v.config["eagle_config"] = ec
    return f


def _both(*fs, defect=()):
    def f(v: Variant, taps):
        for g in fs:
            g(v, taps)
        if defect:
            v.defect = defect
    return f


def _d2t(fn, defect=("d2t",)):
    def f(v: Variant, taps):
        v.d2t = fn(list(v.d2t))
        v.defect = defect
    return f


def _t2d(fn, defect=("t2d",)):
    def f(v: Variant, taps):
        v.t2d = fn(list(v.t2d)) if fn else None
        v.defect = defect
    return f


def _no_vocab_map(v: Variant, taps):
    v.d2t = v.t2d = None


P = "layers.0."
TAPS_EDITS = {
    **AUX_FORMS,
    "nbf-spurious": _cfg(norm_before_fc=True),
    "fcn-spurious": _cfg(fc_norm=True),
    "drop-hidden_norm": _drop(P + "hidden_norm.weight"),
    "drop-input_layernorm": _drop(P + "input_layernorm.weight"),
    "drop-post_attention_layernorm": _drop(P + "post_attention_layernorm.weight"),
    "drop-norm": _drop("norm.weight"),
    "drop-q_proj": _drop(P + "self_attn.q_proj.weight"),
    "drop-v_proj": _drop(P + "self_attn.v_proj.weight"),
    "drop-o_proj": _drop(P + "self_attn.o_proj.weight"),
    "drop-down_proj": _drop(P + "mlp.down_proj.weight"),
    "drop-fc": _drop("fc.weight", defect=("fc.weight", "missing tensors")),
    "drop-lm_head": _drop("lm_head.weight", defect=("lm_head.weight",)),
    "drop-lm_head-and-vocab": _both(_drop("lm_head.weight"), _cfg(draft_vocab_size=None), _no_vocab_map,
                                    defect=("lm_head.weight",)),
    "random-lm_head": lambda v, t: (v.edits.append(["random", "lm_head.weight"]), setattr(v, "defect", ())),
    "drop-d2t": _both(lambda v, t: setattr(v, "d2t", None), defect=("d2t",)),
    "d2t-shifted": _d2t(lambda d: [x + 1 for x in d]),
    "d2t-reversed": _d2t(lambda d: [DRAFT[len(d) - 1 - i] - i for i in range(len(d))]),
    "drop-t2d": _t2d(None, defect=()),
    "t2d-wrong": _t2d(lambda m: m[1:] + m[:1]),
    "tied": _cfg(tie_word_embeddings=True),
    "drop-embed_tokens": _drop("embed_tokens.weight", defect=()),
    "vocab-undeclared": _cfg(draft_vocab_size=None),
    "aux-off": _ec(use_aux_hidden_state=False),
}
def _model_prefix(v: Variant, taps):
    """NeMo Automodel's layout: the draft module's tensors under model. (lm_head, d2t, t2d at the top)."""
    for old in ("layers.0.", "fc.", "norm.", "embed_tokens."):
        v.edits.append(["rename", old, "model." + old])
    v.defect = ("tensor names",)


EXTRA = {
    "A": {"model-prefix": _model_prefix,
          "arch-automodel": _both(_cfg(architectures=["LlamaEagle3DraftModel"]), defect=("architectures",)),
          "model-type-deepseek_v3": _both(_cfg(model_type="deepseek_v3"), defect=("model_type",)),
          "layers-from-target": _both(_cfg(num_hidden_layers=LAYERS), defect=("num_hidden_layers",))},
    "N": {"nbf-nested": _both(_cfg(norm_before_fc=None), _ec(norm_before_fc=True)),
          "nbf-missing": _cfg(norm_before_fc=None),
          "nbf-both": _ec(norm_before_fc=True),
          "drop-input_norm": _drop("input_norm.weight")},
    "F": {"fcn-nested": _both(_cfg(fc_norm=None), _ec(fc_norm=True)),
          "fcn-missing": _cfg(fc_norm=None),
          "drop-fc_norm.0": _drop("fc_norm.0.weight")},
    "X": {"as-trained": _both(),
          "aux-switch-missing": _ec(use_aux_hidden_state=None),
          "fc-kept": lambda v, t: v.edits.append(["add_fc"]),
          "ids-written": _both(_cfg(eagle_aux_hidden_state_layer_ids=[1, 4, 6]),
                               _ec(eagle_aux_hidden_state_layer_ids=[0, 3, 5])),
          "drop-hidden_norm": _drop(P + "hidden_norm.weight"),
          "drop-norm": _drop("norm.weight"),
          "drop-lm_head": _drop("lm_head.weight", defect=("lm_head.weight",))},
    "V": {"as-trained": _both(),
          "declared": _cfg(draft_vocab_size=VOCAB),
          "d2t-identity": lambda v, t: setattr(v, "d2t", [0] * VOCAB),
          "drop-lm_head": _drop("lm_head.weight", defect=("lm_head.weight",)),
          "aux-nested": AUX_FORMS["aux-nested"]},
}
TAPS_HEADS = ("A", "D", "S", "E", "N", "F")


def _base(head: str) -> Variant:
    h = head_spec(head)
    v = Variant("", head, head_config(head))
    if h["vocab"] == "draft":
        v.d2t, v.t2d = _maps(DRAFT)
    return v


def variants() -> list[Variant]:
    """Every edit on every head: the taps heads take the whole list, the others their own."""
    out = []
    for head in TAPS_HEADS + ("X", "V"):
        edits = dict(TAPS_EDITS) if head in TAPS_HEADS else {}
        edits.update(EXTRA.get(head, {}))
        for ename, edit in edits.items():
            v = _base(head)
            v.name = f"{head}-{ename}"
            edit(v, head_spec(head)["taps"])
            out.append(v)
    return out


def by_name() -> dict[str, Variant]:
    return {v.name: v for v in variants()}


def generator_spec(vs: list[Variant]) -> list[dict]:
    """What oraclegen needs per variant."""
    return [{"name": v.name, "head": head_spec(v.head), "head_config": head_config(v.head), "config": v.config,
             "edits": v.edits, "d2t": v.d2t, "t2d": v.t2d,
             "draft": DRAFT if head_spec(v.head)["vocab"] == "draft" else FULL} for v in vs]


# --- header-only pairs for the doctor ---------------------------------------------------------------------
def tokenizer_config() -> dict:
    """The tokenizer_config.json the oracle target has, as far as the doctor reads it (the special tokens and
    the chat template)."""
    return {"added_tokens_decoder": {str(i): {"content": s, "special": True}
                                     for i, s in enumerate(tinymodels.SPECIALS)},
            "chat_template": tinymodels.CHAT_TEMPLATE}


def write_target_config(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TARGET_CONFIG, indent=1))
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    return d


def write_sparse_pair(v: Variant, root: Path) -> tuple[Path, Path]:
    """(target dir, drafter dir): configs and a header-only checkpoint with the variant's tensors and its real
    d2t/t2d, the doctor's whole input."""
    import struct

    from specdeploy.checkpoint.safetensors_io import write_sparse
    t = root / "target"
    if not (t / "config.json").is_file():
        write_target_config(t)
    d = root / "drafters" / v.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(v.config, indent=1))
    data = {}
    if v.d2t is not None:
        data["d2t"] = struct.pack(f"<{len(v.d2t)}q", *v.d2t)
    if v.t2d is not None:
        data["t2d"] = bytes(v.t2d)
    write_sparse(d / "model.safetensors", tensor_specs(v), data)
    return t, d


# --- what the files or the CPU oracle cannot show ----------------------------------------------------------------
# Edit families where the doctor and the measured engine may differ for a stated reason: the defect lies outside
# what a checkpoint's files say (configs, tensor names and shapes, d2t's ids), or the oracle's construction or CPU
# build cannot show it. A difference of these families is recorded as an exclusion with both sides
# (bench/drafter_oracle_exclusions.py); convert is not held to full acceptance on them (it reads the same files).
INVISIBLE = {
    "config-misstates-taps": "the config names taps the head was not trained on (no ids, ids shifted, SGLang "
    "numbers under the vLLM key or the reverse) and nothing else in the checkpoint records the trained taps: the "
    "doctor reads each key in its documented numbering",
    "values-not-read": "the defect is in tensor values (a permuted d2t, an untrained lm_head) that the doctor, "
    "reading headers and the d2t/t2d ids only, cannot see; a d2t out of ascending order is warned about",
    "head-trained-own-shared-target": "the head was trained with its own lm_head and exported without it; vLLM "
    "then shares the target's lm_head, which is right for heads trained against the frozen target head (they "
    "ship none, e.g. TorchSpec's Kimi-K2.5 drafter): the files do not say which",
    "switch-weights-lost": "the config says the head was trained with a norm (norm_before_fc) whose weights the "
    "checkpoint lacks; a head never trained with it writes the same files (a spurious switch, which drafts as "
    "exported where the release does not read it): the doctor warns",
    "aux-switch-contradicts-fc": "use_aux_hidden_state is false but the checkpoint carries an fc over three aux "
    "states: a head trained with them and switched off (acceptance collapses) and a head trained without them that "
    "ships a stray fc (the release skips it and the head drafts) write the same files; the doctor takes the fc as "
    "trained",
    "construction-equal-scales": "the oracle's aux states all have one scale, so per-aux norms (fc_norm) left at "
    "their initial ones after a trained whole-vector norm (norm_before_fc) change nothing; real aux states differ "
    "in scale, and the head runs with norms it was not trained with",
    "uninitialised-zeros-on-cpu": "the config builds more decoder layers than the checkpoint holds; the engine "
    "leaves the extra ones uninitialised (torch.empty), which on the CPU build are fresh zero pages, so they add "
    "nothing to the residual stream and the head drafts; on a GPU they hold whatever earlier allocations left",
    "construction-q-k": "the oracle's heads carry their signal through the value path (any attention pattern gives "
    "the same value), so a missing query/key projection or its norm does not lower their acceptance; a real head "
    "loses its attention pattern",
}
_FAMILY = {
    **{e: "config-misstates-taps" for e in ("aux-none", "aux-top-plus-one", "aux-top-sglang-numbers",
                                            "aux-nested-vllm-numbers", "aux-same-numbers", "aux-v2-layer-ids-key",
                                            "ids-written")},
    "d2t-reversed": "values-not-read", "random-lm_head": "values-not-read",
    "drop-lm_head-and-vocab": "head-trained-own-shared-target",
    "drop-input_norm": "switch-weights-lost",
    "fc-kept": "aux-switch-contradicts-fc",
    "layers-from-target": "uninitialised-zeros-on-cpu",
    **{e: "construction-q-k" for e in ("drop-q_proj", "drop-q_a_proj", "drop-q_a_layernorm")},
}


def family(name: str) -> str | None:
    """The INVISIBLE family of a variant's edit (None: its defect shows in the files)."""
    head, edit = name.split("-", 1)
    if head == "V" and edit == "drop-lm_head":  # a full-vocabulary head: vLLM shares the target's in its place
        return "head-trained-own-shared-target"
    if head == "N" and edit == "fcn-spurious":  # per-aux norms after the trained whole-vector one
        return "construction-equal-scales"
    return _FAMILY.get(edit)
