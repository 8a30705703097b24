"""Drafter variants for the doctor-versus-probe agreement: small config-and-header targets, a good EAGLE-3 drafter
for each, and variants that change one property at a time (the eagle_config switches, tensor names present,
missing or renamed, shapes, architectures, aux layer ids, layer counts, vocabulary maps, tied embeddings, the
target's model class and its end-of-turn tokens). The weights are holes; the probe reads only the headers.

``verdicts`` puts the doctor's errors and the probe's errors into the same few classes, the part of a verdict
the engine can give before it serves a token:

- ``target``: the engine refuses the target as an EAGLE-3 target (model-type list, SupportsEagle3);
- ``config``: the engine refuses the drafter's config (architecture, speculators keys);
- ``names``: checkpoint tensors the drafter has no parameter for (the loader raises);
- ``shapes``: tensors whose shape the loader rejects;
- ``missing``: parameters no tensor reaches (uninitialised, or the loader's own check fails);
- ``d2t``: no draft-to-target map for a smaller draft vocabulary.

The doctor's findings about drafting quality (trained taps against captured ones, end-of-turn tokens in the draft
vocabulary, residual math, vocab sizes) are outside what the engine judges at load time and are not compared.

    python -m specdeploy.testing.drafter_variants 0.32.0 --venv DIR     # prints the agreement
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specdeploy.values.errors import SpecdeployError
from specdeploy.checkpoint.safetensors_io import write_sparse
from specdeploy.testing.realengine import ENGINE

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
         "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
         "vocab_size": 1000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
         "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}
TARGETS = {
    "llama": LLAMA,
    "qwen3": {**LLAMA, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
    "mixtral": {**LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                "num_experts_per_tok": 2},
    # as the real repository ships it: model_type kimi_k2 with its own configuration class (auto_map)
    "kimi_k2": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
                "num_hidden_layers": 61, "vocab_size": 163840, "num_attention_heads": 64, "eos_token_id": 163585,
                "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
                    "num_hidden_layers": 61, "vocab_size": 129280, "num_attention_heads": 128, "eos_token_id": 1},
}
# the configuration class a target ships (trust_remote_code): Kimi-K2's is DeepSeek-V3's under its own model_type
REMOTE_CODE = {"kimi_k2": ("configuration_deepseek.py", "from transformers import DeepseekV3Config as _Base\n\n\n"
                           "class DeepseekV3Config(_Base):\n    model_type = \"kimi_k2\"\n")}
# tokenizer files beside a target's config.json: what the chat template ends a turn with
TOKENIZERS = {
    "eot-in-template": {"added_tokens_decoder": {"2": {"content": "</s>"}, "7": {"content": "<|eot_id|>"}},
                        "chat_template": "{{ m }}<|eot_id|>"},
    "config-only": None,
}


def _big(t: dict) -> bool:
    return t["hidden_size"] > 1024


def drafter_config(t: dict, **over) -> dict:
    h = t["hidden_size"]
    heads = 4 if not _big(t) else 64
    n = t["num_hidden_layers"]
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
           "target_hidden_size": h, "intermediate_size": 2 * h, "num_hidden_layers": 1,
           "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": h // heads,
           "vocab_size": t["vocab_size"], "draft_vocab_size": t["vocab_size"] // 2, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "max_position_embeddings": 2048, "norm_before_residual": False,
           "tie_word_embeddings": False, "eagle_aux_hidden_state_layer_ids": [2, n // 2, n - 3],
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, n // 2 - 1, n - 4],
                            "use_aux_hidden_state": True}, "torch_dtype": "bfloat16"}
    cfg.update(over)
    return cfg


def drafter_tensors(cfg: dict, prefix: str = "layers.0.") -> dict[str, tuple[str, tuple[int, ...]]]:
    h, th = cfg["hidden_size"], cfg.get("target_hidden_size", cfg["hidden_size"])
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter, dv = cfg["intermediate_size"], cfg.get("draft_vocab_size") or cfg["vocab_size"]
    p = prefix
    return {
        f"{p}self_attn.q_proj.weight": ("BF16", (heads * hd, 2 * h)),
        f"{p}self_attn.k_proj.weight": ("BF16", (kv * hd, 2 * h)),
        f"{p}self_attn.v_proj.weight": ("BF16", (kv * hd, 2 * h)),
        f"{p}self_attn.o_proj.weight": ("BF16", (h, heads * hd)),
        f"{p}mlp.gate_proj.weight": ("BF16", (inter, h)),
        f"{p}mlp.up_proj.weight": ("BF16", (inter, h)),
        f"{p}mlp.down_proj.weight": ("BF16", (h, inter)),
        f"{p}input_layernorm.weight": ("BF16", (h,)),
        f"{p}post_attention_layernorm.weight": ("BF16", (h,)),
        f"{p}hidden_norm.weight": ("BF16", (h,)),
        "fc.weight": ("BF16", (h, 3 * th)),
        "norm.weight": ("BF16", (h,)),
        "lm_head.weight": ("BF16", (dv, h)),
        "d2t": ("I64", (dv,)),
        "t2d": ("BOOL", (cfg["vocab_size"],)),
    }


Edit = Callable[[dict, dict], None]  # (config, tensor specs) -> edits in place


@dataclass
class Variant:
    name: str
    target: str  # a TARGETS key, optionally "+tokenizer" (a TOKENIZERS key)
    edit: Edit


def write_target(root: Path, key: str) -> Path:
    base, _, tok = key.partition("+")
    d = root / "targets" / key
    if (d / "config.json").is_file():
        return d
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TARGETS[base], indent=1))
    if base in REMOTE_CODE:
        name, text = REMOTE_CODE[base]
        (d / name).write_text(text)
    if tok and TOKENIZERS.get(tok):
        (d / "tokenizer_config.json").write_text(json.dumps(TOKENIZERS[tok]))
    if base == "llama":
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    return d


def write_variant(root: Path, v: Variant) -> tuple[Path, Path]:
    """(target dir, drafter dir) of a variant, written under ``root``."""
    t = TARGETS[v.target.partition("+")[0]]
    cfg = drafter_config(t)
    specs = drafter_tensors(cfg)
    v.edit(cfg, specs)
    d = root / "drafters" / v.name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    data = {}
    vocab = cfg.get("vocab_size", t["vocab_size"])
    if "d2t" in specs and specs["d2t"][0] == "I64" and len(specs["d2t"][1]) == 1:
        dv = specs["d2t"][1][0]
        keep = [2, 7] if not v.name.startswith("eot-lost") else []
        sel = sorted(set(keep) | set(range(10, 10 + dv - len(keep))))[:dv]
        data["d2t"] = struct.pack(f"<{dv}q", *[x - i for i, x in enumerate(sel)])
        if "t2d" in specs and specs["t2d"][1] == (vocab,):
            mask = bytearray(vocab)
            for x in sel:
                if x < vocab:
                    mask[x] = 1
            data["t2d"] = bytes(mask)
    write_sparse(d / "model.safetensors", specs, data)
    return write_target(root, v.target), d


# --- the edits --------------------------------------------------------------------------------------------
def _set(**kv) -> Edit:
    def f(cfg, specs):
        for k, val in kv.items():
            if val is None:
                cfg.pop(k, None)
            else:
                cfg[k] = val
    return f


def _ec(**kv) -> Edit:
    def f(cfg, specs):
        ec = dict(cfg.get("eagle_config") or {})
        for k, val in kv.items():
            if val is None:
                ec.pop(k, None)
            else:
                ec[k] = val
        cfg["eagle_config"] = ec
    return f


def _drop(*names) -> Edit:
    def f(cfg, specs):
        for n in names:
            specs.pop(n, None)
    return f


def _add(name, shape_of: Callable[[dict], tuple], dtype="BF16") -> Edit:
    def f(cfg, specs):
        specs[name] = (dtype, shape_of(cfg))
    return f


def _rename(old_prefix, new_prefix) -> Edit:
    def f(cfg, specs):
        for n in [n for n in specs if n.startswith(old_prefix)]:
            specs[new_prefix + n[len(old_prefix):]] = specs.pop(n)
    return f


def _reshape(name, shape_of: Callable[[dict], tuple]) -> Edit:
    def f(cfg, specs):
        specs[name] = (specs[name][0], shape_of(cfg))
    return f


def _both(*edits: Edit) -> Edit:
    def f(cfg, specs):
        for e in edits:
            e(cfg, specs)
    return f


def _second_layer(cfg, specs):
    h = cfg["hidden_size"]
    for n, (dt, shp) in list(specs.items()):
        if n.startswith("layers.0."):
            shp = tuple(h if (i == 1 and n.endswith("_proj.weight") and "self_attn" in n and "o_proj" not in n)
                        else s for i, s in enumerate(shp))
            specs["layers.1." + n[len("layers.0."):]] = (dt, shp)


def _h(c):
    return c["hidden_size"]


def _heads_x_dim(c):
    return (c["num_attention_heads"] * c["head_dim"],)


def _th(c):
    return c.get("target_hidden_size", c["hidden_size"])


EDITS: dict[str, Edit] = {
    "good": _both(),
    # the eagle_config switches, with and without the tensors they build
    "no-aux": _both(_ec(use_aux_hidden_state=False), _drop("fc.weight")),
    "no-aux-fc-kept": _ec(use_aux_hidden_state=False),
    "aux-explicit-true": _ec(use_aux_hidden_state=True),
    "nbf-top": _both(_set(norm_before_fc=True), _add("input_norm.weight", lambda c: (3 * _th(c),))),
    "nbf-top-no-tensor": _set(norm_before_fc=True),
    "nbf-nested": _both(_ec(norm_before_fc=True), _add("input_norm.weight", lambda c: (3 * _th(c),))),
    "nbf-nested-no-tensor": _ec(norm_before_fc=True),
    "input-norm-only": _add("input_norm.weight", lambda c: (3 * _th(c),)),
    "nbf-false-input-norm": _both(_set(norm_before_fc=False), _add("input_norm.weight", lambda c: (3 * _th(c),))),
    "nbf-top-bad-shape": _both(_set(norm_before_fc=True), _add("input_norm.weight", lambda c: (_th(c),))),
    "fc-norm-top": _both(_set(fc_norm=True), *[_add(f"fc_norm.{k}.weight", lambda c: (_th(c),)) for k in range(3)]),
    "fc-norm-top-no-tensor": _set(fc_norm=True),
    "fc-norm-tensors-only": _both(*[_add(f"fc_norm.{k}.weight", lambda c: (_th(c),)) for k in range(3)]),
    "fc-norm-nested": _both(_ec(fc_norm=True), *[_add(f"fc_norm.{k}.weight", lambda c: (_th(c),)) for k in range(3)]),
    "norm-output-top": _set(norm_output=True),
    "norm-output-nested": _ec(norm_output=True),
    "norm-output-false": _set(norm_output=False),
    # tensor names
    **{f"drop-{n.split('.', 2)[-1] if n.startswith('layers.') else n}": _drop(n) for n in (
        "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.o_proj.weight",
        "layers.0.mlp.gate_proj.weight", "layers.0.mlp.down_proj.weight", "layers.0.input_layernorm.weight",
        "layers.0.post_attention_layernorm.weight", "layers.0.hidden_norm.weight", "fc.weight", "norm.weight",
        "lm_head.weight", "t2d")},
    "drop-d2t": _drop("d2t"),
    "midlayer": _rename("layers.0.", "midlayer."),
    "model-prefix": _rename("", "model."),
    "extra-unknown": _add("foo.weight", lambda c: (4,)),
    "extra-layer-unknown": _add("layers.0.self_attn.q_norm.weight", lambda c: (c["head_dim"],)),
    "rotary-inv-freq": _add("layers.0.self_attn.rotary_emb.inv_freq", lambda c: (c["head_dim"] // 2,), "F32"),
    "embed-tokens": _add("embed_tokens.weight", lambda c: (c["vocab_size"], _h(c))),
    "renamed-hidden-norm": _rename("layers.0.hidden_norm.", "layers.0.hnorm."),
    "renamed-fc": _rename("fc.", "fusion."),
    # shapes
    "fc-4x": _reshape("fc.weight", lambda c: (_h(c), 4 * _th(c))),
    "fc-2x": _reshape("fc.weight", lambda c: (_h(c), 2 * _th(c))),
    "q-proj-1x": _reshape("layers.0.self_attn.q_proj.weight", lambda c: (_h(c), _h(c))),
    "o-proj-wrong": _reshape("layers.0.self_attn.o_proj.weight", lambda c: (_h(c), 2 * _h(c))),
    "norm-wrong": _reshape("norm.weight", lambda c: (2 * _h(c),)),
    "lm-head-rows": _reshape("lm_head.weight", lambda c: (c["draft_vocab_size"] + 8, _h(c))),
    "d2t-short": _reshape("d2t", lambda c: (c["draft_vocab_size"] - 8,)),
    "target-hidden-wrong": _set(target_hidden_size=128),
    "down-proj-wrong": _reshape("layers.0.mlp.down_proj.weight", lambda c: (_h(c), _h(c))),
    # architectures
    "arch-eagle3llama": _set(architectures=["Eagle3LlamaForCausalLM"]),
    "arch-llama": _set(architectures=["LlamaForCausalLM"]),
    "arch-qwen3": _set(architectures=["Qwen3ForCausalLM"]),
    "arch-mistral": _set(architectures=["MistralForCausalLM"]),
    "arch-unknown": _set(architectures=["FooForCausalLM"]),
    # aux ids
    "aux-top-only": _ec(eagle_aux_hidden_state_layer_ids=None),
    "aux-nested-only": _set(eagle_aux_hidden_state_layer_ids=None),
    "aux-none": _both(_set(eagle_aux_hidden_state_layer_ids=None), _ec(eagle_aux_hidden_state_layer_ids=None)),
    "aux-top-custom": _both(_set(eagle_aux_hidden_state_layer_ids=[1, 3, 5]),
                            _ec(eagle_aux_hidden_state_layer_ids=None)),
    "aux-nested-custom": _both(_set(eagle_aux_hidden_state_layer_ids=None),
                               _ec(eagle_aux_hidden_state_layer_ids=[0, 2, 4])),
    # layer counts
    "layers-2-config": _set(num_hidden_layers=2),
    "layers-2": _both(_set(num_hidden_layers=2), _second_layer),
    "layers-2-tensors-only": _second_layer,
    # vocabulary maps, tied embeddings
    "full-vocab": _both(_set(draft_vocab_size=None), _drop("d2t", "t2d"),
                        _reshape("lm_head.weight", lambda c: (c["vocab_size"], _h(c)))),
    "full-vocab-no-lm-head": _both(_set(draft_vocab_size=None), _drop("d2t", "t2d", "lm_head.weight")),
    "full-vocab-declared-no-lm-head": _both(_set(draft_vocab_size="=vocab"), _drop("d2t", "t2d", "lm_head.weight")),
    "tied": _set(tie_word_embeddings=True),
    "tied-no-lm-head": _both(_set(tie_word_embeddings=True, draft_vocab_size=None),
                             _drop("d2t", "t2d", "lm_head.weight")),
    "eot-lost": _both(),  # d2t without the end-of-turn ids 2 and 7
    # attention bias (all heads here have as many kv heads as heads)
    "attention-bias": _both(_set(attention_bias=True), *[_add(f"layers.0.self_attn.{x}_proj.bias", _heads_x_dim)
                                                         for x in "qkv"]),
    "bias-tensors-only": _both(*[_add(f"layers.0.self_attn.{x}_proj.bias", _heads_x_dim) for x in "qkv"]),
    "norm-before-residual": _set(norm_before_residual=True),
}


def _resolve_vocab(cfg):
    if cfg.get("draft_vocab_size") == "=vocab":
        cfg["draft_vocab_size"] = cfg["vocab_size"]


def variants() -> list[Variant]:
    """Every edit on the small Llama target, the tokenizer and target-class variants, and the switch, name and
    architecture edits on the other targets."""
    out = []

    def wrap(e: Edit) -> Edit:
        def f(cfg, specs):
            e(cfg, specs)
            _resolve_vocab(cfg)
        return f
    for name, e in EDITS.items():
        out.append(Variant(f"{name}@llama", "llama", wrap(e)))
    for tok in TOKENIZERS:
        for name in ("good", "eot-lost", "drop-d2t"):
            out.append(Variant(f"{name}@llama+{tok}", f"llama+{tok}", wrap(EDITS[name])))
    others = ("good", "no-aux", "no-aux-fc-kept", "nbf-top", "nbf-nested", "input-norm-only", "fc-norm-top",
              "fc-norm-tensors-only", "norm-output-top", "drop-fc.weight", "drop-lm_head.weight", "drop-d2t",
              "midlayer", "extra-unknown", "fc-4x", "q-proj-1x", "arch-llama", "arch-qwen3", "arch-unknown",
              "aux-nested-only", "aux-none", "layers-2", "full-vocab-no-lm-head", "tied", "attention-bias")
    for name, e in EDITS.items():  # a second EAGLE-3 target class, every edit
        out.append(Variant(f"{name}@qwen3", "qwen3", wrap(e)))
    for target in ("mixtral", "kimi_k2", "deepseek_v3"):
        for name in others:
            out.append(Variant(f"{name}@{target}", target, wrap(EDITS[name])))
    return out


def suite_slice(vs: list[Variant] | None = None) -> list[Variant]:
    """The test suite's share of the sweep: every edit once, on the targets it was generated for in turn (edit i
    on its (i mod n)-th target), and the good pair on every target. Every edit's rule and every target class is
    compared on each run, in about a third of the engine's time; the whole sweep is ``main`` (python -m
    specdeploy.testing.drafter_variants VERSION --venv VENV)."""
    vs = variants() if vs is None else vs
    by_edit: dict[str, list[Variant]] = {}
    for v in vs:
        by_edit.setdefault(v.name.partition("@")[0], []).append(v)
    keep = {v.name for v in vs if v.name.partition("@")[0] == "good"}
    for i, (_, cands) in enumerate(by_edit.items()):
        keep.add(cands[i % len(cands)].name)
    return [v for v in vs if v.name in keep]


# --- the two verdicts ---------------------------------------------------------------------------------------
LOAD = ("target", "config", "names", "shapes", "missing", "d2t")


def doctor_classes(rep) -> set[str]:
    out = set()
    for f in rep.errors:
        s, m = f.subject, f.message
        if s == "target":
            out.add("target")
        elif s in ("architectures", "speculators_model_type") or s.startswith(("speculators_config",
                                                                                  "transformer_layer_config")):
            out.add("config")
        elif s == "tensor names" and "carry a leading model." in m:
            # one finding for a whole checkpoint behind a leading model.: every tensor, d2t included, reaches a
            # name no parameter has, so the engine reports the unknown names, the missing parameters and d2t
            out |= {"names", "missing", "d2t"}
        elif s in ("tensor names", "layers.0.*"):
            out.add("names")
        elif s in ("tensor shapes", "layer shapes") or (s in ("fc.weight", "lm_head.weight") and
                                                        m.startswith("shape")) or \
                s in ("target_hidden_size", "hidden_size"):
            out.add("shapes")
        elif s == "missing tensors" or m.startswith("missing") or (s == "num_hidden_layers" and "uninitialised" in m):
            out.add("missing")
        elif s == "num_hidden_layers":
            out.add("names" if "ignore or reject" in m else "config")
        elif s == "d2t" and ("no d2t" in m or "there is no d2t" in m):
            out.add("d2t")
        elif s == "d2t" and m.startswith("shape"):
            out.add("shapes")
    return out


def probe_classes(findings) -> set[str]:
    out = set()
    for f in findings:
        if f.severity != "error":
            continue
        s = f.subject
        out.add({"eagle3 target whitelist": "target", "SupportsEagle3": "target", "speculative config": "config",
                 "target config": "config", "target class": "config", "drafter model": "config",
                 "tensor names": "names", "tensor shapes": "shapes", "missing tensors": "missing",
                 "drafter load": "missing", "d2t": "d2t",
                 "lm_head.weight": "missing", "embed_tokens": "missing"}.get(s, s))
    return out


@dataclass
class Outcome:
    name: str
    doctor: set
    probe: set
    doctor_taps: list | None
    probe_taps: list | None
    uses_aux: bool | None
    compared: set  # the classes compared (the engine stops at a config it refuses)
    raw: dict | None = None  # the probe's answer for this pair

    @property
    def agree(self) -> bool:
        taps_ok = self.uses_aux is False or self.probe_taps is None or self.doctor_taps is None or \
            list(self.doctor_taps) == list(self.probe_taps)
        return (self.doctor & self.compared) == (self.probe & self.compared) and taps_ok


def compare(root: Path, version: str, python: str, vs: list[Variant] | None = None,
            timeout: float = 1800.0) -> tuple[list[Outcome], float]:
    """Run the doctor and the probe (one engine process for every variant) on ``version``."""
    vs = variants() if vs is None else vs
    pairs = [(v.name, *write_variant(root, v), v.target.partition("+")[0] in REMOTE_CODE) for v in vs]
    return compare_pairs(pairs, version, python, timeout)


def compare_pairs(pairs: list[tuple[str, Path, Path, bool]], version: str, python: str,
                  timeout: float = 1800.0) -> tuple[list[Outcome], float]:
    """The doctor and the probe on (name, target dir, drafter dir, trust_remote_code) pairs, one engine process
    for all of them; (an outcome per pair, the probe's seconds)."""
    import time

    from specdeploy.checks.probe import case_findings, run_cases
    from specdeploy.drafter import check, engine_taps
    from specdeploy.drafter.model import Drafter
    from specdeploy.checkpoint.modelcfg import TargetModel
    cases = [{"id": name, "target": str(t), "drafter": str(d), "trust_remote_code": bool(remote)}
             for name, t, d, remote in pairs]
    t0 = time.perf_counter()
    run = run_cases(ENGINE, version, cases, python, timeout=timeout)
    seconds = time.perf_counter() - t0
    if not run.ran:
        raise SpecdeployError(f"the probe did not run: {run.why}")
    out = []
    for name, t, d, _remote in pairs:
        try:
            rep = check(d, t, ENGINE, version, runner="v1")  # the probe is the CPU build: its V1 runner
            dc = doctor_classes(rep)
            taps = engine_taps(Drafter.load(d), TargetModel.load(t), ENGINE, version, "v1")[0]
        except SpecdeployError:
            dc, taps = {"config"}, None
        c = run.cases.get(name, {})
        pc = probe_classes(case_findings(c, ENGINE, version))
        refused = any(p.get("stage") in ("speculative_config", "target_config", "drafter_build")
                      for p in c.get("problems", [])) and not c.get("target_check_bypassed")
        compared = {"target", "config"} if refused else set(LOAD)
        out.append(Outcome(name, dc, pc, taps, c.get("aux_layers"), c.get("uses_aux_hidden_states"), compared,
                           c))
    return out, seconds


def main(argv=None):
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(prog="python -m specdeploy.testing.drafter_variants")
    ap.add_argument("version")
    ap.add_argument("--venv", required=True)
    ap.add_argument("--show", action="store_true", help="print every variant, not only disagreements")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        res, secs = compare(Path(tmp), a.version, str(Path(a.venv) / "bin" / "python"))
    bad = [o for o in res if not o.agree]
    for o in res if a.show else bad:
        print(f"{'ok  ' if o.agree else 'DIFF'} {o.name}: doctor {sorted(o.doctor)} probe {sorted(o.probe)} "
              f"(compared {sorted(o.compared)}) taps doctor {o.doctor_taps} probe {o.probe_taps} aux {o.uses_aux}")
    print(f"vLLM {a.version}: {len(res) - len(bad)}/{len(res)} agree ({secs:.0f} s probe)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
