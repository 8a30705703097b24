"""Drafter doctor: validate an EAGLE-3 drafter against its target for one engine, and convert it.

Reads config.json and safetensors headers, plus only the small d2t/t2d tensors; never the weights.
Conventions (see the project's research notes): vLLM and speculators number an aux layer L as the input of
layer L and read the top-level ``eagle_aux_hidden_state_layer_ids``; SGLang, SpecForge and TorchSpec number it
as the output of layer L (vLLM id - 1) and read ``eagle_config.eagle_aux_hidden_state_layer_ids``.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import Report, SpecdeployError, Finding
from .modelcfg import TargetModel, load_json
from .safetensors_io import SafetensorsError, TensorInfo, checkpoint_tensors, read_tensor, rewrite_names

LLAMA_ARCHS = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"}
MLA_ARCHS = {"Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM"}
META_FILE = "specdeploy-conversion.json"


@dataclass
class Drafter:
    path: Path
    config: dict
    fmt: str  # llama | speculators | mla | unknown
    layer: dict  # the decoder-layer config
    tensors: dict[str, TensorInfo]

    @classmethod
    def load(cls, path: Path) -> "Drafter":
        cfg = load_json(path / "config.json", "drafter config.json")
        archs = set(cfg.get("architectures") or [])
        if cfg.get("speculators_model_type") == "eagle3":
            fmt, layer = "speculators", dict(cfg.get("transformer_layer_config") or {})
        elif archs & MLA_ARCHS:
            fmt, layer = "mla", cfg
        elif archs & LLAMA_ARCHS:
            fmt, layer = "llama", cfg
        else:
            fmt, layer = "unknown", cfg
        try:
            ts = checkpoint_tensors(path)
        except SafetensorsError as exc:
            raise SpecdeployError([Finding("error", "safetensors", str(exc), "re-export the drafter checkpoint")])
        # vLLM and SGLang both strip a leading "model." when loading
        ts = {(n[6:] if n.startswith("model.") else n): t for n, t in ts.items()}
        return cls(path, cfg, fmt, layer, ts)

    @property
    def hidden(self) -> int:
        return int(self.layer.get("hidden_size") or self.config.get("hidden_size") or 0)

    @property
    def target_hidden(self) -> int:
        return int(self.config.get("target_hidden_size") or self.layer.get("target_hidden_size") or self.hidden)

    @property
    def vocab(self) -> int:
        return int(self.layer.get("vocab_size") or self.config.get("vocab_size") or 0)

    @property
    def draft_vocab(self) -> int:
        return int(self.config.get("draft_vocab_size") or self.layer.get("draft_vocab_size") or self.vocab)

    def top_aux(self):
        return self.config.get("eagle_aux_hidden_state_layer_ids")

    def nested_aux(self):
        ec = self.config.get("eagle_config") or {}
        return ec.get("eagle_aux_hidden_state_layer_ids")

    def norm_before_residual(self):
        """(value, explicit): the value the engine will use, and whether the config states it."""
        if "norm_before_residual" in self.config:
            return bool(self.config["norm_before_residual"]), True
        # vLLM's speculators loader defaults True, its flat loader False.
        return (self.fmt == "speculators"), False


def default_aux(layers: int) -> list[int]:
    return [2, layers // 2, layers - 3]


def check(drafter_dir: Path, target_dir: Path, engine: str) -> Report:
    rep = Report()
    if engine not in ("vllm", "sglang"):
        rep.add("error", "--engine", f"unknown engine '{engine}'", "use vllm or sglang")
        return rep
    target = TargetModel.load(target_dir)
    d = Drafter.load(drafter_dir)
    _check_format(d, rep)
    if d.fmt == "unknown":
        return rep
    _check_sizes(d, target, rep)
    if d.tensors:
        _check_shapes(d, target, rep)
        _check_vocab(d, target, rep)
        _check_names(d, engine, rep)
    else:
        rep.add("warning", "safetensors", f"no *.safetensors in {drafter_dir}: a config-only copy, so tensor "
                "shapes, d2t/t2d and weight names were not checked", "the drafter role checks the full "
                "checkpoint on the host; or point the check at the full drafter")
    _check_aux(d, target, engine, rep)
    _check_norm(d, engine, rep)
    return rep


def _check_format(d: Drafter, rep: Report):
    if d.fmt == "unknown":
        rep.add("error", "architectures", f"{d.config.get('architectures')} is not an EAGLE-3 drafter format",
                "use LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM, a speculators eagle3 config, or "
                "Eagle3DeepseekV2ForCausalLM")
        return
    rep.add("info", "format", {"llama": "flat Llama EAGLE-3", "speculators": "speculators eagle3",
                               "mla": "MLA EAGLE-3 (DeepSeek-style)"}[d.fmt])
    n = int(d.layer.get("num_hidden_layers") or 1)
    if d.fmt == "mla" and n != 1:
        rep.add("error", "num_hidden_layers", f"the MLA drafter has {n} layers; the engines require exactly 1",
                "re-export the drafter with num_hidden_layers: 1")


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


def _shape(d: Drafter, *names):
    for n in names:
        if n in d.tensors:
            return n, d.tensors[n].shape
    return None, None


def _check_shapes(d: Drafter, t: TargetModel, rep: Report):
    h = d.hidden
    name, shape = _shape(d, "fc.weight")
    if shape is None:
        rep.add("error", "fc.weight", "missing", "the drafter checkpoint must contain fc.weight")
    elif shape[1] == 4 * d.target_hidden:
        rep.add("error", "fc.weight", f"shape {list(shape)} fuses 4 hidden states; EAGLE-3 engines build fc "
                f"for 3 (expected [{h}, {3 * d.target_hidden}])",
                "retrain/export without the final-layer state in fc (3 aux layers)")
    elif tuple(shape) != (h, 3 * d.target_hidden):
        rep.add("error", "fc.weight", f"shape {list(shape)}, expected [{h}, {3 * d.target_hidden}]",
                "export the drafter for this target's hidden size")
    name, shape = _shape(d, "lm_head.weight")
    if shape is None:
        rep.add("error", "lm_head.weight", "missing: with a draft vocabulary the engines need the drafter's lm_head",
                "include lm_head.weight in the checkpoint")
    elif tuple(shape) != (d.draft_vocab, h):
        rep.add("error", "lm_head.weight", f"shape {list(shape)}, expected [{d.draft_vocab}, {h}]",
                "make draft_vocab_size match the lm_head rows")
    if d.fmt in ("llama", "speculators"):
        name, shape = _shape(d, "layers.0.self_attn.q_proj.weight", "midlayer.self_attn.q_proj.weight")
        if shape is None:
            rep.add("error", "layers.0.self_attn.q_proj.weight", "missing (neither layers.0.* nor midlayer.*)",
                    "export the decoder layer weights")
        elif shape[1] != 2 * h:
            rep.add("error", name, f"input width {shape[1]}, expected 2*hidden = {2 * h} (embeddings + fc output)",
                    "this is not an EAGLE-3 first layer; re-export the drafter")


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
    offsets = read_tensor(d2t)
    ids = [i + o for i, o in enumerate(offsets)]
    bad = [x for x in ids if not 0 <= x < t.vocab]
    if bad:
        rep.add("error", "d2t", f"{len(bad)} target ids out of range [0, {t.vocab}), e.g. {bad[:3]}",
                "d2t holds offsets (target id - draft id), not absolute ids")
    if len(set(ids)) != len(ids):
        rep.add("error", "d2t", f"{len(ids) - len(set(ids))} duplicate target ids", "rebuild the vocab map")
    if t2d is not None:
        if t2d.shape != (t.vocab,):
            rep.add("error", "t2d", f"shape {list(t2d.shape)}, expected [{t.vocab}]", "rebuild the vocab map")
        else:
            mask = read_tensor(t2d)
            if sum(bool(x) for x in mask) != d.draft_vocab or not all(mask[x] for x in ids if 0 <= x < t.vocab):
                rep.add("error", "t2d", "t2d does not agree with d2t", "rebuild t2d from the same selection as d2t")
    eos = t.eos_ids()
    missing = sorted(eos - set(ids))
    if missing:
        rep.add("error", "d2t", f"the target's EOS token(s) {missing} are not in the draft vocabulary: drafts "
                "never propose the end of a turn", "force-include the EOS and chat-template special tokens")


def _check_names(d: Drafter, engine: str, rep: Report):
    legacy = [n for n in d.tensors if n.startswith("layers.0.")]
    if engine == "sglang" and d.fmt in ("llama", "speculators") and legacy:
        rep.add("error", "layers.0.*", f"{len(legacy)} tensors are named layers.0.*; SGLang's Llama EAGLE-3 "
                "loader only matches midlayer.* and silently drops the rest (random decoder layer)",
                "run `specdeploy drafter convert --engine sglang` (renames layers.0. -> midlayer.)")


def _check_aux(d: Drafter, t: TargetModel, engine: str, rep: Report):
    top, nested = d.top_aux(), d.nested_aux()
    dflt = default_aux(t.layers)
    for key, ids in (("eagle_aux_hidden_state_layer_ids", top),
                     ("eagle_config.eagle_aux_hidden_state_layer_ids", nested)):
        if ids is not None and (len(ids) != 3 or not all(isinstance(i, int) and 0 <= i <= t.layers for i in ids)):
            rep.add("error", key, f"{ids} is not three layer ids within the target's {t.layers} layers",
                    "fc takes exactly three aux hidden states; give three ids")
            return
    if top is not None and nested is not None:
        if [x - 1 for x in top] == list(nested):
            rep.add("info", "aux layers", f"vLLM ids {top} and SGLang ids {nested} describe the same taps")
        elif list(top) == list(nested):
            rep.add("error", "aux layers", f"the same numbers {top} under both keys: one of them is off by one "
                    "(vLLM counts layer inputs, SGLang layer outputs)",
                    "keep the key of the convention the drafter was trained with and re-run convert")
            return
        else:
            rep.add("error", "aux layers", f"top-level {top} and nested {nested} disagree",
                    "keep only the key written by the trainer and re-run convert")
            return
    if engine == "vllm":
        if top is None and nested is not None:
            equiv = [x + 1 for x in nested]
            if equiv == dflt:
                rep.add("warning", "eagle_aux_hidden_state_layer_ids", f"vLLM does not read the nested key; it "
                        f"falls back to its default {dflt}, which equals the nested {nested} +1",
                        "run `specdeploy drafter convert --engine vllm` to make it explicit")
            else:
                rep.add("error", "eagle_aux_hidden_state_layer_ids", f"vLLM ignores the nested SGLang-style ids "
                        f"{nested} and uses its default {dflt}, not the trained taps {equiv}",
                        "run `specdeploy drafter convert --engine vllm` (writes the top-level ids)")
        elif top is None:
            rep.add("warning", "eagle_aux_hidden_state_layer_ids", f"not set: vLLM uses the target default {dflt}",
                    "state the trained taps explicitly (convert writes them)")
    else:
        if nested is None and top is not None:
            if list(top) == dflt:
                rep.add("warning", "eagle_config.eagle_aux_hidden_state_layer_ids", "SGLang reads only the "
                        f"nested key; its default capture equals vLLM ids {dflt}, so {top} still holds",
                        "run `specdeploy drafter convert --engine sglang` to make it explicit")
            else:
                rep.add("error", "eagle_config.eagle_aux_hidden_state_layer_ids", f"SGLang ignores the top-level "
                        f"vLLM ids {top} and captures its default instead",
                        f"run `specdeploy drafter convert --engine sglang` (writes nested {[x - 1 for x in top]})")
        elif nested is None:
            rep.add("warning", "eagle_config.eagle_aux_hidden_state_layer_ids", "not set: SGLang uses the target "
                    "default", "state the trained taps explicitly (convert writes them)")


def _check_norm(d: Drafter, engine: str, rep: Report):
    value, explicit = d.norm_before_residual()
    if engine == "sglang" and d.fmt in ("llama", "speculators") and value:
        rep.add("error", "norm_before_residual", "True, but SGLang's Llama EAGLE-3 drafter implements only False: "
                "the drafter would run with the wrong residual math", "serve this drafter with vLLM")
    elif not explicit:
        rep.add("warning", "norm_before_residual", f"not set: {'the speculators loader assumes True' if value else 'vLLM assumes False'}"
                " and the engines disagree on the default", "state the trained value (convert writes it)")


# ---------------------------------------------------------------------------------------------------------
def _aux_vllm_ids(d: Drafter, t: TargetModel) -> tuple[list[int], str]:
    top, nested = d.top_aux(), d.nested_aux()
    if top is not None and nested is not None and list(top) == list(nested):
        raise SpecdeployError([Finding("error", "aux layers", f"ambiguous: {top} under both keys",
                                       "remove the key that does not match the training convention")])
    if top is not None:
        return list(top), "top-level (vLLM convention)"
    if nested is not None:
        return [x + 1 for x in nested], "eagle_config (SGLang convention)"
    return default_aux(t.layers), "target default"


def _link_or_copy(src: Path, dst: Path):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def convert(drafter_dir: Path, target_dir: Path, engine: str, out: Path) -> dict:
    """Write an engine-ready copy of the drafter in ``out``; refuse when no correct conversion exists."""
    pre = check(drafter_dir, target_dir, engine)
    fixable = {"layers.0.*", "eagle_aux_hidden_state_layer_ids", "eagle_config.eagle_aux_hidden_state_layer_ids"}
    blocking = [f for f in pre.errors if f.subject not in fixable]
    if blocking:
        raise SpecdeployError([Finding("error", f.subject, f"cannot convert: {f.message}", f.fix)
                               for f in blocking])
    d, t = Drafter.load(drafter_dir), TargetModel.load(target_dir)
    vllm_ids, source = _aux_vllm_ids(d, t)
    nbr, _ = d.norm_before_residual()
    cfg = json.loads(json.dumps(d.config))
    actions = []
    if d.fmt == "speculators" and engine == "sglang":
        flat = dict(d.layer)
        flat.update({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": d.draft_vocab,
                     "target_hidden_size": d.target_hidden})
        cfg = flat
        actions.append("flattened the speculators config into LlamaForCausalLMEagle3 for SGLang")
    cfg["eagle_aux_hidden_state_layer_ids"] = vllm_ids
    cfg.setdefault("eagle_config", {})
    cfg["eagle_config"] = dict(cfg["eagle_config"], eagle_aux_hidden_state_layer_ids=[x - 1 for x in vllm_ids],
                               use_aux_hidden_state=True)
    cfg["norm_before_residual"] = nbr
    actions.append(f"aux layers from {source}: vLLM ids {vllm_ids} (top level), SGLang ids "
                   f"{[x - 1 for x in vllm_ids]} (eagle_config)")
    actions.append(f"norm_before_residual written explicitly as {nbr}")
    rename_layers = engine == "sglang" and d.fmt in ("llama", "speculators")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    renamed_total = 0
    for f in sorted(drafter_dir.iterdir()):
        if f.name in ("config.json", META_FILE) or not f.is_file():
            continue
        if f.suffix == ".safetensors" and rename_layers:
            n = rewrite_names(f, tmp / f.name, lambda s: ("midlayer." + s[len("layers.0."):]
                                                          if s.startswith("layers.0.") else
                                                          "model.midlayer." + s[len("model.layers.0."):]
                                                          if s.startswith("model.layers.0.") else s))
            if n == 0:
                (tmp / f.name).unlink()
                _link_or_copy(f, tmp / f.name)
            renamed_total += n
        elif f.name == "model.safetensors.index.json" and rename_layers:
            idx = json.loads(f.read_text())
            idx["weight_map"] = {k.replace("layers.0.", "midlayer.", 1): v for k, v in idx.get("weight_map", {}).items()}
            (tmp / f.name).write_text(json.dumps(idx, indent=1))
        else:
            _link_or_copy(f, tmp / f.name)
    if renamed_total:
        actions.append(f"renamed {renamed_total} tensors layers.0.* -> midlayer.* for SGLang")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    meta = {"engine": engine, "source": str(drafter_dir.resolve()), "target": str(target_dir.resolve()),
            "format": d.fmt, "actions": actions, "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    post = check(out, target_dir, engine)
    if not post.ok:
        raise SpecdeployError([Finding("error", f.subject, f"converted drafter still fails: {f.message}", f.fix)
                               for f in post.errors])
    meta["check"] = post.to_dict()
    return meta
