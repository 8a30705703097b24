"""Drafter doctor: validate an EAGLE-3 drafter against its target for one engine version, and convert it.

Reads config.json and safetensors headers (through the safetensors library), plus only the small d2t/t2d
tensors; never the weights. Every engine-specific rule comes from the engine adapter: its ``DRAFTER`` table
(engines/vllm.py, engines/sglang.py), keyed by version, and its aux-layer hooks (``drafter_taps``).

Aux-layer numbering: vLLM and speculators number a tap L as the input of layer L and read the top-level
``eagle_aux_hidden_state_layer_ids``; SGLang, SpecForge and TorchSpec number it as the output of layer L
(vLLM id - 1) and read ``eagle_config.eagle_aux_hidden_state_layer_ids``. Internally taps are vLLM numbers.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path


from .engines import EngineAdapter, UnsupportedVersion, get, get_adapter, names
from .errors import Finding, Report, SpecdeployError
from .modelcfg import TargetModel, load_json
from .safetensors_io import (
    BIN_CONVERT,
    INDEX_FILE,
    SafetensorsError,
    TensorInfo,
    bin_only,
    checkpoint_tensors,
    read_array,
    rewrite_names,
)

META_FILE = "specdeploy-conversion.json"
CONVERT = "run `specdeploy drafter convert --engine {engine}`"
LAYER_RE = re.compile(r"^(?:layers\.(\d+)|midlayer)\.")
EOT_RE = re.compile(r"im_end|eot|end_of_turn|<\|end\|>|<\|return\|>|<\|call\|>|eom_id|end_of_message", re.IGNORECASE)


def is_convertible(f: Finding) -> bool:
    """Findings that `drafter convert` fixes (the drafter role converts before the engine starts)."""
    return f.fix.startswith("run `specdeploy drafter convert")


def _unknown_engine(engine: str) -> Finding:
    return Finding("error", "--engine", f"unknown engine '{engine}'", f"use {' or '.join(names())}")


def resolve_version(engine: str, version: str | None) -> str:
    try:
        versions = get(engine).versions
    except UnsupportedVersion:
        raise SpecdeployError([_unknown_engine(engine)]) from None
    if version is None:
        return versions[-1]
    if version not in versions:
        raise SpecdeployError([Finding("error", "--engine-version", f"{engine} {version} is not a version "
                                       "specdeploy knows", f"use one of {', '.join(versions)}")])
    return version


@dataclass
class Drafter:
    path: Path
    config: dict
    fmt: str  # llama | speculators | mla | unknown
    layer: dict  # the decoder-layer config
    tensors: dict[str, TensorInfo]
    bin_files: list[str]

    @classmethod
    def load(cls, path: Path) -> Drafter:
        cfg = load_json(path / "config.json", "drafter config.json")
        if not isinstance(cfg, dict):
            raise SpecdeployError([Finding("error", "drafter config.json", f"{path / 'config.json'} is not a "
                                           "JSON object", "restore the drafter's config.json")])
        raw_archs = cfg.get("architectures")
        if raw_archs is not None and not isinstance(raw_archs, list):
            raise SpecdeployError([Finding("error", "drafter config.json architectures", f"{path / 'config.json'}: "
                                           f"architectures is a {type(raw_archs).__name__}, not a list",
                                           "restore the drafter's config.json")])
        archs = [a for a in (raw_archs or []) if isinstance(a, str)]
        if cfg.get("speculators_model_type") == "eagle3":
            tlc = cfg.get("transformer_layer_config")
            fmt, layer = "speculators", dict(tlc) if isinstance(tlc, dict) else {}
        elif any("Deepseek" in a and "Eagle3" in a for a in archs):
            fmt, layer = "mla", cfg
        elif any("eagle3" in a.lower() for a in archs) or "LlamaForCausalLM" in archs:
            fmt, layer = "llama", cfg
        else:
            fmt, layer = "unknown", cfg
        try:
            ts = checkpoint_tensors(path)
        except SafetensorsError as exc:
            raise SpecdeployError([Finding("error", "safetensors", str(exc),
                                           "re-download or re-export the drafter checkpoint")]) from None
        # vLLM and SGLang both strip a leading "model." when loading
        ts = {n.removeprefix("model."): t for n, t in ts.items()}
        return cls(path, cfg, fmt, layer, ts, bin_only(path))

    def _int(self, key: str, *sources) -> int:
        for src in sources:
            v = src.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return 0

    @property
    def hidden(self) -> int:
        return self._int("hidden_size", self.layer, self.config)

    @property
    def target_hidden(self) -> int:
        return self._int("target_hidden_size", self.config, self.layer) or self.hidden

    @property
    def vocab(self) -> int:
        return self._int("vocab_size", self.layer, self.config)

    @property
    def draft_vocab(self) -> int:
        return self._int("draft_vocab_size", self.config, self.layer) or self.vocab

    @property
    def declares_draft_vocab(self) -> bool:
        return isinstance(self.config.get("draft_vocab_size") or self.layer.get("draft_vocab_size"), int)

    @property
    def num_layers(self) -> int:
        return self._int("num_hidden_layers", self.layer) or 1

    @property
    def heads(self) -> int:
        return self._int("num_attention_heads", self.layer)

    @property
    def head_dim(self) -> int:
        return self._int("head_dim", self.layer) or (self.hidden // self.heads if self.heads else 0)

    def tensor_layers(self) -> set[int]:
        out = set()
        for n in self.tensors:
            m = LAYER_RE.match(n)
            if m:
                out.add(int(m.group(1) or 0))
        return out

    def top_aux(self):
        return self.config.get("eagle_aux_hidden_state_layer_ids")

    def nested_aux(self):
        ec = self.config.get("eagle_config")
        return ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None

    def norm_before_residual(self, engine: str) -> bool:
        """The value the engine runs with (a speculators config without the key: the speculators loader's
        default, as the engine's table records it; True where it records none)."""
        if "norm_before_residual" in self.config:
            return bool(self.config["norm_before_residual"])
        return self.fmt == "speculators" and get(engine).DRAFTER.get("speculators_norm_before_residual_default", True)


def default_aux(layers: int) -> list[int]:
    return [2, layers // 2, layers - 3]


def _ids_ok(ids) -> bool:
    return isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, int) and not isinstance(i, bool)
                                                            for i in ids)


def end_of_turn_ids(t: TargetModel) -> tuple[set[int], dict[int, str]]:
    """(end-of-turn token ids of the chat template, names of the target's special tokens) as far as the
    target's tokenizer_config.json tells; empty when the target directory carries no tokenizer files."""
    names: dict[int, str] = {}
    template = ""
    tc = t.path / "tokenizer_config.json"
    if tc.is_file():
        try:
            data = json.loads(tc.read_text())
            for k, v in (data.get("added_tokens_decoder") or {}).items():
                if isinstance(v, dict) and isinstance(v.get("content"), str) and str(k).isdigit():
                    names[int(k)] = v["content"]
            ct = data.get("chat_template")
            template = ct if isinstance(ct, str) else ""
        except (ValueError, AttributeError, UnicodeDecodeError):
            pass
    jinja = t.path / "chat_template.jinja"
    if jinja.is_file():
        template += jinja.read_text(errors="replace")
    eot = {i for i, n in names.items() if EOT_RE.search(n) and (not template or n in template)}
    return eot, names


# ---------------------------------------------------------------------------------------------------------
def check(drafter_dir: Path, target_dir: Path, engine: str, version: str | None = None) -> Report:
    rep = Report()
    if engine not in names():
        rep.findings.append(_unknown_engine(engine))
        return rep
    version = resolve_version(engine, version)
    a = get_adapter(engine, version)
    if not a.DRAFTER:
        rep.add("warning", "engine", f"{a.label} {version}: specdeploy records no EAGLE-3 drafter conventions for "
                "this engine, so the drafter is not checked against it", "check the drafter on the engine itself")
        return rep
    target = TargetModel.load(target_dir)
    d = Drafter.load(drafter_dir)
    rep.add("info", "engine", f"rules of {engine} {version}")
    if not _check_format(d, a, rep):
        return rep
    _check_sizes(d, target, rep)
    if d.tensors:
        _check_layers(d, a, rep)
        _check_shapes(d, rep)
        _check_lm_head(d, target, a, rep)
        _check_vocab(d, target, rep)
        _check_names(d, a, rep)
    elif d.bin_files:
        rep.add("warning", "safetensors", f"only PyTorch pickle weights ({', '.join(d.bin_files[:3])}): tensor "
                "shapes, layer count, lm_head and d2t cannot be inspected without executing the pickle",
                f"convert them once, in the drafter directory: {BIN_CONVERT}")
    else:
        rep.add("warning", "safetensors", f"no *.safetensors in {drafter_dir}: a config-only copy, so tensor "
                "shapes, d2t/t2d and weight names were not checked", "the drafter role checks the full "
                "checkpoint on the host; or point the check at the full drafter")
    _check_aux(d, target, engine, version, rep)
    _check_norm(d, a, rep)
    return rep


def _or_fallback(a: EngineAdapter) -> str:
    return f", or {a.drafter_fallback}" if a.drafter_fallback else ""


def _check_format(d: Drafter, a: EngineAdapter, rep: Report) -> bool:
    facts, version = a.DRAFTER, a.version
    fix = CONVERT.format(engine=a.name)
    if d.fmt == "unknown":
        rep.add("error", "architectures", f"{d.config.get('architectures')} is not an EAGLE-3 drafter format",
                "use LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM, a speculators eagle3 config, or "
                "Eagle3DeepseekV2ForCausalLM")
        return False
    rep.add("info", "format", {"llama": "flat Llama EAGLE-3", "speculators": "speculators eagle3",
                               "mla": "MLA EAGLE-3 (DeepSeek-style)"}[d.fmt])
    archs = [x for x in (d.config.get("architectures") or []) if isinstance(x, str)]
    if d.fmt == "speculators":
        _check_speculators(d, a, rep)
        if not facts["reads_speculators"]:
            rep.add("error", "speculators_model_type", f"{a.label} does not read the speculators format "
                    "(transformer_layer_config is ignored)",
                    f"{fix} (writes a flat {facts['convert_archs']['llama']} config)")
        return True
    prefixed = facts["eagle3_prefix"]
    resolved = [x if x.startswith("Eagle3") or x.endswith("Eagle3") else "Eagle3" + x for x in archs] if prefixed \
        else archs
    if [x for x in resolved if x in facts["archs"] and facts["archs"][x].contains(version)]:
        return True
    want = facts["convert_archs"].get(d.fmt) or facts["convert_archs"]["llama"]
    mla = a.capabilities.get("mla_eagle3_drafter")
    if d.fmt == "mla" and (mla is None or not mla.contains(version) or not facts["convert_archs"].get("mla")):
        fix = f"use {a.label} {mla.since} or later{_or_fallback(a)}" if mla is not None and mla.since else \
            f"serve this drafter with an engine that has an MLA EAGLE-3 drafter{_or_fallback(a)}"
        rep.add("error", "architectures", f"{a.label} {version} has no MLA EAGLE-3 drafter"
                + (f" ({archs} -> {resolved})" if prefixed else ""), fix)
    elif prefixed:
        rep.add("error", "architectures", f"{archs} resolve to {resolved} for method eagle3, none of "
                f"which {a.label} {version} registers", f"{fix} (writes {want})")
    else:
        rep.add("error", "architectures", f"{a.label} loads EAGLE-3 drafters only as {want}; {archs} "
                "does not match any model class", f"{fix} (writes {want})")
    return True


def _check_speculators(d: Drafter, a: EngineAdapter, rep: Report):
    cfg = d.config
    if not isinstance(cfg.get("transformer_layer_config"), dict):
        rep.add("error", "transformer_layer_config", "missing or not an object: the decoder layer is "
                "undefined", "re-export the drafter with speculators")
        return
    sc = cfg.get("speculators_config")
    methods = sc.get("proposal_methods") if isinstance(sc, dict) else None
    if not (isinstance(methods, list) and methods and isinstance(methods[0], dict)
            and isinstance(methods[0].get("speculative_tokens"), int)):
        rep.add("error", "speculators_config.proposal_methods", "missing, or its first entry has no "
                "speculative_tokens: vLLM refuses the config (Invalid speculators config structure)",
                "re-export with speculators, or add proposal_methods: [{proposal_type: greedy, "
                "speculative_tokens: 3}]")
    if not a.DRAFTER["reads_speculators"]:
        return
    verifier = sc.get("verifier") if isinstance(sc, dict) else None
    if not (isinstance(verifier, dict) and isinstance(verifier.get("name_or_path"), str)):
        rep.add("error", "speculators_config.verifier", f"no verifier.name_or_path: {a.label} refuses the config "
                "(Invalid speculators config structure)", CONVERT.format(engine=a.name) +
                " (records the target as the verifier)")
    mt = d.layer.get("model_type", "llama")
    types = a.DRAFTER["speculators_model_types"]
    span = types.get(mt)
    if span is None or not span.contains(a.version):
        rep.add("error", "transformer_layer_config.model_type", f"{a.label} {a.version} builds speculators "
                f"EAGLE-3 drafters only for model_type " + ", ".join(
                    k for k, sp in types.items() if sp.contains(a.version))
                + f", not {mt!r}", f"use a {a.label} version that supports it")


def _check_sizes(d: Drafter, t: TargetModel, rep: Report):
    if d.target_hidden != t.hidden:
        key = "target_hidden_size" if "target_hidden_size" in d.config else "hidden_size"
        rep.add("error", key, f"drafter expects target hidden size {d.target_hidden}, the target has {t.hidden}",
                "use a drafter trained for this target (or set target_hidden_size correctly)")
    if d.vocab != t.vocab:
        rep.add("error", "vocab_size", f"drafter vocab_size {d.vocab} differs from the target's {t.vocab}",
                f"set vocab_size: {t.vocab}; the draft vocabulary goes in draft_vocab_size")
    if d.draft_vocab > d.vocab:
        rep.add("error", "draft_vocab_size", f"draft_vocab_size {d.draft_vocab} exceeds vocab_size {d.vocab}",
                "draft_vocab_size must be at most vocab_size")


def _check_layers(d: Drafter, a: EngineAdapter, rep: Report):
    have = d.tensor_layers()
    n = d.num_layers
    if not have:
        rep.add("error", "layers", "no decoder-layer weights (neither layers.N.* nor midlayer.*)",
                "export the decoder layer weights")
        return
    if have != set(range(len(have))):
        rep.add("error", "layers", f"decoder layers {sorted(have)} are not numbered 0..{len(have) - 1}",
                "re-export the drafter")
        return
    if len(have) != n:
        what = ("the engines build all of them and run the missing ones with uninitialised weights, without "
                "an error" if len(have) < n else "the engines build only those and ignore or reject the rest")
        rep.add("error", "num_hidden_layers", f"the config says {n} decoder layer(s), the checkpoint holds "
                f"weights for {len(have)}: {what}",
                CONVERT.format(engine=a.name) + f" (sets num_hidden_layers: {len(have)})")
        n = len(have)
    if n > 1:
        mla_max, multi = a.DRAFTER.get("mla_max_layers"), a.DRAFTER.get("llama_multi_layer")
        if d.fmt == "mla" and mla_max and n > mla_max:
            rep.add("error", "num_hidden_layers", f"{a.label}'s MLA EAGLE-3 drafter supports exactly "
                    f"{mla_max} layer; this one has {n}", f"serve this drafter with {a.drafter_fallback}")
        elif d.fmt != "mla" and multi is not None and not multi.contains(a.version):
            rep.add("error", "num_hidden_layers", f"{a.label} {a.version}'s Llama EAGLE-3 drafter supports exactly "
                    f"1 layer; this one has {n}", f"use {a.label} {multi.since} or later{_or_fallback(a)}")


def _shape(d: Drafter, *names):
    for n in names:
        if n in d.tensors:
            return n, d.tensors[n].shape
    return None, None


def _check_shapes(d: Drafter, rep: Report):
    h, th = d.hidden, d.target_hidden
    name, shape = _shape(d, "fc.weight")
    if shape is None:
        rep.add("error", "fc.weight", "missing", "the drafter checkpoint must contain fc.weight")
    elif len(shape) == 2 and shape[1] == 4 * th:
        rep.add("error", "fc.weight", f"shape {list(shape)} fuses 4 hidden states; EAGLE-3 engines build fc "
                f"for 3 (expected [{h}, {3 * th}])",
                "retrain/export without the final-layer state in fc (3 aux layers)")
    elif tuple(shape) != (h, 3 * th):
        rep.add("error", "fc.weight", f"shape {list(shape)}, expected [{h}, {3 * th}]",
                "export the drafter for this target's hidden size")
    if d.fmt == "mla":
        return  # MLA projections (q_a/kv_a/...) are checked by the engine's own loader
    heads, hd = d.heads, d.head_dim
    kv = d._int("num_key_value_heads", d.layer) or heads
    inter = d._int("intermediate_size", d.layer)
    bad = []
    for i in sorted(d.tensor_layers()):
        pre = [f"layers.{i}."] + (["midlayer."] if i == 0 else [])
        width = 2 * h if i == 0 else h
        want = {"self_attn.q_proj.weight": (heads * hd, width), "self_attn.k_proj.weight": (kv * hd, width),
                "self_attn.v_proj.weight": (kv * hd, width), "self_attn.o_proj.weight": (h, heads * hd),
                "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
                "mlp.down_proj.weight": (h, inter)}
        for suffix, shp in want.items():
            name, got = _shape(d, *(p + suffix for p in pre))
            if got is None:
                rep.add("error", f"{pre[0]}{suffix}", "missing: the engine leaves it uninitialised",
                        "export every decoder-layer weight")
            elif tuple(got) != shp:
                bad.append(f"{name} {list(got)} != {list(shp)}")
    if bad:
        rep.add("error", "layer shapes", f"{len(bad)} weight(s) do not match the config (heads {heads} x head_dim "
                f"{hd}, kv heads {kv}, intermediate {inter}, hidden {h}; layer 0 reads 2*hidden): "
                + "; ".join(bad[:3]), "fix num_attention_heads / num_key_value_heads / head_dim / "
                "intermediate_size to the trained values, or re-export")


def _check_lm_head(d: Drafter, t: TargetModel, a: EngineAdapter, rep: Report):
    _, shape = _shape(d, "lm_head.weight")
    h = d.hidden
    if shape is not None:
        if tuple(shape) != (d.draft_vocab, h):
            rep.add("error", "lm_head.weight", f"shape {list(shape)}, expected [{d.draft_vocab}, {h}]",
                    "make draft_vocab_size match the lm_head rows")
        return
    if d.draft_vocab < t.vocab:
        rep.add("error", "lm_head.weight", f"missing, but the draft vocabulary ({d.draft_vocab}) is smaller than "
                f"the target's ({t.vocab}): the target's head cannot stand in", "include lm_head.weight")
        return
    if h != t.hidden:
        rep.add("error", "lm_head.weight", f"missing, and the target's lm_head is [{t.vocab}, {t.hidden}], not "
                f"[{t.vocab}, {h}]", "include lm_head.weight")
        return
    shares = a.DRAFTER.get("shares_missing_lm_head")
    if shares is not None and shares.contains(a.version):
        rep.add("info", "lm_head.weight", f"not in the checkpoint: {a.label} shares the target's lm_head (the draft "
                "vocabulary is the target's)")
        return
    from_target = a.DRAFTER.get("lm_head_from_target_without_draft_vocab_size")
    if d.fmt == "mla" or from_target is None or not from_target.contains(a.version):
        what = f"{a.label}'s MLA drafter" if d.fmt == "mla" else f"{a.label} {a.version}"
        rep.add("warning", "lm_head.weight", f"not in the checkpoint: whether {what} takes the "
                "target's lm_head is not verified", "include lm_head.weight"
                + (f", or serve with {a.drafter_fallback}" if a.drafter_fallback else ""))
    elif d.declares_draft_vocab and d.fmt != "speculators":
        rep.add("error", "lm_head.weight", f"not in the checkpoint and draft_vocab_size is set: {a.label} then "
                "builds its own lm_head and leaves it uninitialised (it loads the target's only when "
                "draft_vocab_size is absent)", CONVERT.format(engine=a.name) + " (drops draft_vocab_size, which "
                "equals vocab_size)")
    else:
        rep.add("info", "lm_head.weight", f"not in the checkpoint: {a.label} loads the target's lm_head")


def _check_vocab(d: Drafter, t: TargetModel, rep: Report):
    d2t = d.tensors.get("d2t")
    t2d = d.tensors.get("t2d")
    if d.draft_vocab < t.vocab and d2t is None:
        rep.add("error", "d2t", f"draft vocabulary {d.draft_vocab} < target {t.vocab} but there is no d2t map: "
                "the engines then map draft id i to target id i and accept almost nothing",
                "export the d2t tensor (draft id -> target id offset) with the drafter")
        return
    if d2t is None:
        return
    if d2t.dtype != "I64":
        rep.add("error", "d2t", f"dtype {d2t.dtype}, the engines load it as int64", "save d2t as int64")
        return
    if d2t.shape != (d.draft_vocab,):
        rep.add("error", "d2t", f"shape {list(d2t.shape)}, expected [{d.draft_vocab}]", "rebuild the vocab map")
        return
    import numpy as np  # only here: a config-only drafter (preflight's usual case) never needs it
    vocab = t.vocab
    ids = np.arange(d.draft_vocab, dtype=np.int64) + read_array(d2t)
    inside = (ids >= 0) & (ids < vocab)
    if not inside.all():
        rep.add("error", "d2t", f"{int((~inside).sum())} target ids out of range [0, {vocab}), e.g. "
                f"{ids[~inside][:3].tolist()}", "d2t holds offsets (target id - draft id), not absolute ids")
    dups = len(ids) - len(np.unique(ids))
    if dups:
        rep.add("error", "d2t", f"{dups} duplicate target ids", "rebuild the vocab map")
    if t2d is not None:
        if t2d.shape != (vocab,):
            rep.add("error", "t2d", f"shape {list(t2d.shape)}, expected [{vocab}]", "rebuild the vocab map")
        elif t2d.dtype not in ("BOOL", "U8", "I8", "I32", "I64"):
            rep.add("error", "t2d", f"dtype {t2d.dtype} is not a mask type", "save t2d as bool")
        else:
            mask = read_array(t2d).astype(bool)
            if int(mask.sum()) != d.draft_vocab or not mask[ids[inside]].all():
                rep.add("error", "t2d", "t2d does not agree with d2t", "rebuild t2d from the same selection as d2t")
    _check_eos(set(ids.tolist()), t, rep)


def _check_eos(ids: set[int], t: TargetModel, rep: Report):
    eos = t.eos_ids()
    eot, names = end_of_turn_ids(t)
    stops = eot or eos  # without tokenizer files every stop id of the target counts as an end of turn
    if not stops:
        return
    def label(xs) -> str:
        return ", ".join(f"{x} {names[x]!r}" if x in names else str(x) for x in sorted(xs))
    if not stops & ids:
        rep.add("error", "d2t", f"no end-of-turn token of the target ({label(stops)}) is in the draft "
                "vocabulary: drafts never propose the end of a turn", "rebuild d2t with the chat template's "
                "end-of-turn and special tokens forced in")
        return
    doc = sorted(eos - ids - (eot & ids))
    if doc:
        rep.add("info", "d2t", f"document EOS id(s) {label(doc)} are not in the draft vocabulary (the "
                f"end-of-turn token {label(stops & ids)} is): chat turns end normally; raw completions that stop "
                "only at the document EOS are verified by the target")


def _legacy_layer_names(d: Drafter, a: EngineAdapter) -> bool:
    """This release's Llama EAGLE-3 loader matches only midlayer.* (one layer, the legacy layout)."""
    multi = a.DRAFTER.get("llama_multi_layer")
    return d.fmt in ("llama", "speculators") and multi is not None and not multi.contains(a.version)


def _check_names(d: Drafter, a: EngineAdapter, rep: Report):
    if not _legacy_layer_names(d, a):
        return
    engine, version = a.name, a.version
    legacy = [n for n in d.tensors if n.startswith("layers.0.")]
    if legacy:
        rep.add("error", "layers.0.*", f"{len(legacy)} tensors are named layers.0.*; {a.label} {version}'s Llama "
                "EAGLE-3 loader only matches midlayer.* and silently drops the rest (random decoder layer)",
                CONVERT.format(engine=engine) + " (renames layers.0. -> midlayer.)")


# --- aux layers -------------------------------------------------------------------------------------------
def trained_taps(d: Drafter) -> tuple[list[int] | None, str]:
    """The taps the drafter was trained on, in vLLM numbering, and where they were read."""
    top, nested = d.top_aux(), d.nested_aux()
    if _ids_ok(top):
        return list(top), "top-level eagle_aux_hidden_state_layer_ids (vLLM numbering)"
    if _ids_ok(nested):
        return [x + 1 for x in nested], "eagle_config.eagle_aux_hidden_state_layer_ids (SGLang numbering)"
    return None, "no aux ids in the config"


def engine_taps(d: Drafter, t: TargetModel, engine: str, version: str) -> tuple[list[int] | None, str]:
    """The taps (vLLM numbering) the engine version captures for this config; None when not pinned down."""
    top, nested = d.top_aux(), d.nested_aux()
    return get_adapter(engine, version).drafter_taps(top if _ids_ok(top) else None, nested if _ids_ok(nested) else None,
                                                     default_aux(t.layers), t.is_kimi_or_deepseek)


def _check_aux(d: Drafter, t: TargetModel, engine: str, version: str, rep: Report):
    top, nested = d.top_aux(), d.nested_aux()
    n = t.layers
    for key, ids, limit in (("eagle_aux_hidden_state_layer_ids", top, n - 1),
                            ("eagle_config.eagle_aux_hidden_state_layer_ids", nested, n - 2)):
        if ids is None:
            continue
        if not _ids_ok(ids):
            rep.add("error", key, f"{ids} is not three integer layer ids", "fc takes exactly three aux hidden "
                    "states; give three ids")
            return
        out = [i for i in ids if not 0 <= i <= limit]
        if out:
            rep.add("error", key, f"{out} out of range: the target has {n} layers, so "
                    + (f"vLLM captures layer inputs 0..{n - 1}; a higher id is never captured" if limit == n - 1 else
                       f"SGLang ids (layer outputs) go up to {limit}; the final layer's output is never captured"),
                    "use the taps the drafter was trained on; an id equal to the layer count is never captured")
            return
    if _ids_ok(top) and _ids_ok(nested) and [x - 1 for x in top] != list(nested):
        same = list(top) == list(nested)
        taps, how = engine_taps(d, t, engine, version)
        if taps != list(top):
            msg = (f"the same numbers {top} under both keys: one of them is off by one (vLLM counts layer inputs, "
                   "SGLang layer outputs)" if same else f"top-level {top} and nested {nested} disagree")
            rep.add("error", "aux layers", f"{msg}; {engine} {version} would capture {taps} ({how})",
                    "keep only the key the trainer wrote and re-run convert")
            return
    trained, source = trained_taps(d)
    taps, how = engine_taps(d, t, engine, version)
    fix = CONVERT.format(engine=engine) + " (writes both keys explicitly)"
    key = get(engine).DRAFTER["aux_key"]
    if trained is None:
        rep.add("info", key, f"no aux ids in the config: {engine} captures {taps} (vLLM numbering), the target "
                "default every trainer uses when none are given")
        return
    if taps is None:
        rep.add("warning", key, f"trained taps {trained} (from {source}); {how}: not pinned down for this "
                "version", fix)
    elif taps != trained:
        rep.add("error", key, f"{engine} {version} captures {taps} ({how}), but the drafter was trained on "
                f"{trained} (from {source}, vLLM numbering)", fix)
    elif not _ids_ok(top if key == "eagle_aux_hidden_state_layer_ids" else nested):
        rep.add("info", key, f"not set; {engine} captures {taps} ({how}), which equals the trained taps")


def _check_norm(d: Drafter, a: EngineAdapter, rep: Report):
    nbr = d.norm_before_residual(a.name)
    if a.DRAFTER.get("norm_before_residual") is False and d.fmt in ("llama", "speculators") and nbr:
        why = "" if "norm_before_residual" in d.config else " (speculators configs default it to True)"
        rep.add("error", "norm_before_residual", f"True{why}, but {a.label}'s Llama EAGLE-3 drafter implements only "
                "False: the drafter would run with the wrong residual math",
                f"serve this drafter with {a.drafter_fallback}")


# ---------------------------------------------------------------------------------------------------------
def _link_or_copy(src: Path, dst: Path):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def convert(drafter_dir: Path, target_dir: Path, engine: str, out: Path, version: str | None = None) -> dict:
    """Write an engine-ready copy of the drafter in ``out``; refuse, saying why, when no correct conversion
    exists. Fixes: architecture name, speculators verifier / flattening, aux-id keys, num_hidden_layers from
    the tensors, draft_vocab_size for a shared lm_head, and the layers.0./midlayer. layout."""
    version = resolve_version(engine, version)
    a = get_adapter(engine, version)
    facts = a.DRAFTER
    pre = check(drafter_dir, target_dir, engine, version)
    blocking = [f for f in pre.errors if not is_convertible(f)]
    if blocking:
        raise SpecdeployError([Finding("error", f.subject, f"cannot convert: {f.message}", f.fix)
                               for f in blocking])
    d, t = Drafter.load(drafter_dir), TargetModel.load(target_dir)
    trained, source = trained_taps(d)
    taps = trained or default_aux(t.layers)
    nbr = d.norm_before_residual(engine)
    cfg = json.loads(json.dumps(d.config))
    actions = []
    if d.fmt == "speculators" and not facts["reads_speculators"]:
        flat = dict(d.layer)
        flat.update({"architectures": [facts["convert_archs"]["llama"]], "draft_vocab_size": d.draft_vocab,
                     "target_hidden_size": d.target_hidden})
        cfg = flat
        actions.append(f"flattened the speculators config into {facts['convert_archs']['llama']} for {a.label}")
    elif d.fmt == "speculators":
        sc = cfg.setdefault("speculators_config", {})
        if not isinstance(sc.get("verifier"), dict) or not isinstance(sc["verifier"].get("name_or_path"), str):
            sc["verifier"] = {"name_or_path": str(target_dir.resolve()), "architectures": t.architectures}
            actions.append(f"recorded the target {target_dir} as speculators_config.verifier")
    elif any(f.subject == "architectures" for f in pre.errors):
        want = facts["convert_archs"].get(d.fmt) or facts["convert_archs"]["llama"]
        actions.append(f"architectures {cfg.get('architectures')} -> [{want}]")
        cfg["architectures"] = [want]
    as_speculators = d.fmt == "speculators" and facts["reads_speculators"]
    layer_cfg = cfg["transformer_layer_config"] if as_speculators else cfg
    have = d.tensor_layers()
    if d.tensors and have and len(have) != d.num_layers:
        layer_cfg["num_hidden_layers"] = len(have)
        actions.append(f"num_hidden_layers {d.num_layers} -> {len(have)} (the layers the checkpoint holds)")
    if any(f.subject == "lm_head.weight" and is_convertible(f) for f in pre.errors):
        cfg.pop("draft_vocab_size", None)
        actions.append(f"dropped draft_vocab_size (= vocab_size) so {a.label} loads the target's lm_head")
    nested = a.drafter_nested_ids(taps, t.is_kimi_or_deepseek)
    if as_speculators:
        cfg["eagle_aux_hidden_state_layer_ids"] = taps
    else:
        cfg["eagle_aux_hidden_state_layer_ids"] = taps
        ec = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
        cfg["eagle_config"] = dict(ec, eagle_aux_hidden_state_layer_ids=nested, use_aux_hidden_state=True)
    actions.append(f"aux layers from {source if trained else 'the target default'}: vLLM ids {taps} (top level)"
                   + ("" if as_speculators else f", SGLang ids {nested} (eagle_config)"))
    if "norm_before_residual" not in d.config or d.fmt == "speculators":
        cfg["norm_before_residual"] = nbr
        actions.append(f"norm_before_residual written explicitly as {nbr}")
    rename = _legacy_layer_names(d, a)

    def renamed(s: str) -> str:
        return ("midlayer." + s[len("layers.0."):] if s.startswith("layers.0.") else
                "model.midlayer." + s[len("model.layers.0."):] if s.startswith("model.layers.0.") else s)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    renamed_total = 0
    for f in sorted(drafter_dir.iterdir()):
        if f.name in ("config.json", META_FILE) or not f.is_file():
            continue
        if f.suffix == ".safetensors" and rename:
            n = rewrite_names(f, tmp / f.name, renamed)
            if n == 0:
                (tmp / f.name).unlink()
                _link_or_copy(f, tmp / f.name)
            renamed_total += n
        elif f.name == INDEX_FILE and rename:
            idx = json.loads(f.read_text())
            idx["weight_map"] = {renamed(k): v for k, v in idx.get("weight_map", {}).items()}
            (tmp / f.name).write_text(json.dumps(idx, indent=1))
        else:
            _link_or_copy(f, tmp / f.name)
    if renamed_total:
        actions.append(f"renamed {renamed_total} tensors layers.0.* -> midlayer.* for {a.label} {version}")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    meta = {"engine": engine, "engine_version": version, "source": str(drafter_dir.resolve()),
            "target": str(target_dir.resolve()), "format": d.fmt, "actions": actions,
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    post = check(out, target_dir, engine, version)
    if not post.ok:
        raise SpecdeployError([Finding("error", f.subject, f"converted drafter still fails: {f.message}", f.fix)
                               for f in post.errors])
    meta["check"] = post.to_dict()
    return meta
