"""The doctor's rules: one drafter against its target for one engine release. Every engine-specific fact comes
from the engine adapter (its ``DRAFTER`` table, keyed by version, and its aux-layer hooks)."""
from __future__ import annotations

from pathlib import Path

from specdeploy.engines import EngineAdapter, get, get_adapter, names
from specdeploy.values.errors import Report
from specdeploy.checkpoint.modelcfg import TargetModel
from specdeploy.checkpoint.safetensors_io import BIN_CONVERT, read_array
from specdeploy.drafter import mla
from specdeploy.drafter.head import check_head, fc_shape
from specdeploy.drafter.model import (
    CONVERT,
    Drafter,
    _ids_ok,
    _unknown_engine,
    end_of_turn_ids,
    engine_taps,
    model_runner,
    resolve_version,
    trained_taps,
)

# ---------------------------------------------------------------------------------------------------------
def check(drafter_dir: Path, target_dir: Path, engine: str, version: str | None = None,
          target_check: bool = True, runner: str | None = None) -> Report:
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
    if d.fmt == "mla":
        a = mla.view(a)  # the MLA head's table where the release's MLA loader was read
    run, why = model_runner(target, engine, version, runner)
    rep.add("info", "engine", f"rules of {engine} {version}" + (
        f", model runner {run.upper()} ({why})" if run else "" if run == "" else f", model runner not known ({why})"))
    prefixed = [n for n in d.raw_tensors or {} if n.startswith("model.")]
    if a.DRAFTER.get("keeps_model_prefix") and prefixed:
        # the loader puts model. before every name but lm_head's and d2t's: model.X reaches model.model.X, which
        # no parameter has. One finding (the rest is judged on the names as they would be without the prefix).
        rep.add("error", "tensor names", f"{len(prefixed)} checkpoint tensor(s) carry a leading model. "
                f"({', '.join(prefixed[:3])}): {a.label} {version}'s EAGLE-3 loader adds model. to every name "
                "itself, so they reach model.model.* and no parameter; the load fails",
                CONVERT.format(engine=a.name) + " (strips the leading model. from the tensor names)")
    if target_check:  # off where preflight decides it, knowing the image's patch set
        # the engine checks the target whatever the drafter's format: both are reported
        _check_target(target, a, rep, _aux_asked(d, a))
    if not _check_format(d, a, rep):
        return rep
    _check_model_type(d, a, rep)
    if d.fmt == "mla":
        mla.check(d, a, rep)
    _check_sizes(d, target, rep)
    head = check_head(d, target, a, rep)  # the switches always; the tensor names when there are tensors
    if d.tensors:
        _check_layers(d, a, rep)
        _check_shapes(d, rep, head)
        _check_lm_head(d, target, a, rep)
        _check_vocab(d, target, rep, a)
        _check_names(d, a, rep)
    elif d.bin_files:
        rep.add("warning", "safetensors", f"only PyTorch pickle weights ({', '.join(d.bin_files[:3])}): tensor "
                "shapes, layer count, lm_head and d2t cannot be inspected without executing the pickle",
                f"convert them once, in the drafter directory: {BIN_CONVERT}")
    else:
        rep.add("warning", "safetensors", f"no *.safetensors in {drafter_dir}: a config-only copy, so tensor "
                "shapes, d2t/t2d and weight names were not checked", "the drafter role checks the full "
                "checkpoint on the host; or point the check at the full drafter")
    if head is not None and head.aux_on is False:
        _check_no_aux(d, a, run, why, rep)
    else:
        _check_aux(d, target, engine, version, rep, runner)
    _check_norm(d, a, rep)
    return rep


def _aux_asked(d: Drafter, a: EngineAdapter) -> bool:
    """Whether the release asks the target for aux hidden states for this drafter: the model runner checks the
    target's EAGLE-3 interface only then (eagle_config.use_aux_hidden_state: false drafts from the last state)."""
    from specdeploy.drafter.head import switch
    return switch(d, a, "use_aux_hidden_state")[0] is not False


def _whitelist_only(t: TargetModel, a: EngineAdapter) -> tuple[bool, str]:
    """The speculative config's model-type list alone (it applies to method eagle3 whatever the drafter)."""
    wl = a.eagle3_whitelist_span
    if wl is None or not wl.contains(a.version):
        return True, f"no EAGLE-3 target list in {a.label} {a.version}, and this drafter asks the target for no aux " \
            "hidden states (so its class need not implement " + a.eagle3_interface + ")"
    types = [x for x, sp in a.eagle3_whitelist.items() if sp.contains(a.version)]
    if any(x in t.text_model_type for x in types):
        return True, f"model_type '{t.text_model_type}' is in the EAGLE-3 target list, and this drafter asks the " \
            "target for no aux hidden states"
    return False, f"model_type '{t.text_model_type}' is not in the speculative config's EAGLE-3 target list " \
        f"({', '.join(types)})"


def _check_target(t: TargetModel, a: EngineAdapter, rep: Report, aux: bool = True):
    """Whether the release serves the target's model class as an EAGLE-3 target (engines/eagle3_targets.py)."""
    ok, why = a.eagle3_target(t.architectures, t.text_model_type) if aux else _whitelist_only(t, a)
    if ok:
        rep.add("info", "target", f"{a.label} {a.version}: {why}")
        return
    if ok is None:
        rep.add("warning", "target", f"whether {a.label} {a.version} serves {t.architectures} as an EAGLE-3 target is "
                f"not known: {why}", "check the target on the engine itself")
        return
    later = _later_release(t, a)
    fix = f"use {a.label} {later} or later" if later else f"serve this target with {a.drafter_fallback}" \
        if a.drafter_fallback else "serve this target with an engine release that implements it"
    rep.add("error", "target", f"{a.label} {a.version} cannot use {t.architectures} as an EAGLE-3 target: {why}",
            fix)


def _later_release(t: TargetModel, a: EngineAdapter) -> str | None:
    versions = list(a.versions)
    for v in versions[versions.index(a.version) + 1:]:
        if a.__class__(v).eagle3_target(t.architectures, t.text_model_type)[0]:
            return v
    return None


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
    # vLLM validates speculators_config (proposal_methods, verifier) only when the speculators checkpoint is the
    # served model (maybe_override_with_speculators -> validate_speculators_config); as --speculative-config's
    # model (how specdeploy serves it) SpeculatorsConfig.from_pretrained reads neither (probe: 0.16.0, 0.32.0).
    served = "vLLM reads it only when the checkpoint is served as the model (vllm serve DRAFTER: 'Invalid " \
        "speculators config structure'); specdeploy passes it as --speculative-config's model, where it is not read"
    if not (isinstance(methods, list) and methods and isinstance(methods[0], dict)
            and isinstance(methods[0].get("speculative_tokens"), int)):
        rep.add("warning", "speculators_config.proposal_methods", f"missing, or its first entry has no "
                f"speculative_tokens: {served}", "re-export with speculators, or add proposal_methods: "
                "[{proposal_type: greedy, speculative_tokens: 3}]")
    if not a.DRAFTER["reads_speculators"]:
        return
    verifier = sc.get("verifier") if isinstance(sc, dict) else None
    if not (isinstance(verifier, dict) and isinstance(verifier.get("name_or_path"), str)):
        rep.add("warning", "speculators_config.verifier", f"no verifier.name_or_path: {served}",
                CONVERT.format(engine=a.name) + " (records the target as the verifier)")
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


def _check_shapes(d: Drafter, rep: Report, head=None):
    h = d.hidden
    if d.fmt == "mla":
        if head is None:  # a release whose MLA head was not read: fc at least (it fuses three)
            fc_shape(d, 3, rep)
        return  # head.check_head compares every MLA parameter
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
        rows = shape[0] if len(shape) == 2 else None
        if tuple(shape) != (d.draft_vocab, h):
            rep.add("error", "lm_head.weight", f"shape {list(shape)}, expected [{d.draft_vocab}, {h}]",
                    (CONVERT.format(engine=a.name) + f" (writes draft_vocab_size: {rows}, the rows of the trained "
                     "head)") if rows and not d.declares_draft_vocab and len(shape) == 2 and shape[1] == h
                    and rows < d.vocab and "d2t" in d.tensors and d.tensors["d2t"].shape == (rows,)
                    else "make draft_vocab_size match the lm_head rows")
            return
        swap = a.DRAFTER.get("lm_head_from_target_without_draft_vocab_size")
        if swap is not None and swap.contains(a.version) and not d.declares_draft_vocab and d.fmt != "speculators" \
                and d.layer.get("tie_word_embeddings") is not True:
            # A full-vocabulary head: trained (then the swap collapses acceptance) or a copy of the target's head
            # (ModelOpt exports one when the draft has none: then the swap changes nothing). The files do not say
            # which; convert keeps the shipped head, which is right in both cases, and the drafter role converts.
            rep.add("warning", "lm_head.weight", f"the checkpoint holds an lm_head {list(shape)}, but the config has "
                    f"no draft_vocab_size: {a.label} {a.version} then loads the target's lm_head in its place "
                    "(load_lm_head_from_target). If the shipped head was trained, the head drafts with one it was "
                    "not trained with; if it is a copy of the target's (exporters write one for heads trained "
                    "against the target's head), nothing changes",
                    CONVERT.format(engine=a.name) + f" (writes draft_vocab_size: {rows}, which keeps the shipped "
                    "head, right in both cases)")
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
    if (d.fmt == "mla" and not a.DRAFTER.get("read")) or from_target is None or not from_target.contains(a.version):
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


def _check_vocab(d: Drafter, t: TargetModel, rep: Report, a: EngineAdapter | None = None):
    reads_t2d = a.DRAFTER.get("reads_t2d") if a is not None else None
    label = a.label if a is not None else ""
    d2t = d.tensors.get("d2t")
    t2d = d.tensors.get("t2d")
    if d.draft_vocab < t.vocab and d2t is None:
        rep.add("error", "d2t", f"draft vocabulary {d.draft_vocab} < target {t.vocab} but there is no d2t map: "
                "the engines then map draft id i to target id i and accept almost nothing",
                "export the d2t tensor (draft id -> target id offset) with the drafter")
        return
    if d2t is None:
        return
    if d.draft_vocab == t.vocab and a is not None and _d2t_unplaced(d, t, a, d2t, rep):
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
    elif len(ids) > 1 and not bool((np.diff(ids) > 0).all()):
        # Values, not structure: the engines map draft row i to target id i + d2t[i] whatever the order; only the
        # trained lm_head rows say which order is right. Every exporter read sorts the selection first.
        rep.add("warning", "d2t", f"the target ids are not in ascending draft-id order (first descent at draft id "
                f"{int(np.argmax(np.diff(ids) <= 0)) + 1}): EAGLE, SpecForge, speculators and TorchSpec build d2t "
                "from the sorted selection and train lm_head's rows in that order, so a reordered d2t maps the rows "
                "to other tokens than they were trained for (acceptance collapses); a head trained in this order "
                "would be unaffected, which only its weights tell", "rebuild d2t from the selection in ascending "
                "order (t2d's set ids) unless the head was trained in this order")
    if t2d is not None:
        if t2d.shape != (vocab,) and reads_t2d is False:
            rep.add("warning", "t2d", f"shape {list(t2d.shape)}, expected [{vocab}]; {label}'s loader skips t2d",
                    "rebuild the vocab map")
        elif t2d.shape != (vocab,):
            rep.add("error", "t2d", f"shape {list(t2d.shape)}, expected [{vocab}]", "rebuild the vocab map")
        elif t2d.dtype not in ("BOOL", "U8", "I8", "I32", "I64"):
            rep.add("error", "t2d", f"dtype {t2d.dtype} is not a mask type", "save t2d as bool")
        else:
            mask = read_array(t2d).astype(bool)
            if int(mask.sum()) != d.draft_vocab or not mask[ids[inside]].all():
                if reads_t2d is False:
                    rep.add("warning", "t2d", f"t2d does not agree with d2t; {label}'s loader skips t2d (only d2t "
                            "maps draft ids), so drafting is not affected", "rebuild t2d from the same selection "
                            "as d2t, for tools that read it")
                else:
                    rep.add("error", "t2d", "t2d does not agree with d2t", "rebuild t2d from the same selection "
                            "as d2t")
    _check_eos(set(ids.tolist()), t, rep)


def _d2t_unplaced(d: Drafter, t: TargetModel, a: EngineAdapter, d2t, rep: Report) -> bool:
    """A d2t beside a draft vocabulary as large as the target's, on a release that builds no map for it."""
    from specdeploy.drafter.head import known
    raises = known(a.DRAFTER.get("d2t_needs_draft_vocabulary"), a.version)
    if raises is False:
        return False
    identity = d2t.dtype == "I64" and d2t.shape == (d.draft_vocab,) and not read_array(d2t).any()
    fix = (CONVERT.format(engine=a.name) + " (drops d2t and t2d: the map is the identity)") if identity else \
        "re-export without d2t, or with the draft vocabulary it maps (draft_vocab_size below the target's)"
    if raises is None:
        rep.add("warning", "d2t", f"the draft vocabulary is the target's ({t.vocab}): whether {a.label} {a.version} "
                "builds a draft-to-target map for it (0.32.0 does not, and refuses the shipped d2t) was not read", fix)
        return False
    rep.add("error", "d2t", f"the draft vocabulary is the target's ({t.vocab}), so {a.label} {a.version} builds no "
            "draft_id_to_target_id and its loader raises on the shipped d2t ('There is no module or parameter named "
            "draft_id_to_target_id'): the load fails", fix)
    return True


def _check_eos(ids: set[int], t: TargetModel, rep: Report):
    eos = t.eos_ids()
    eot, names = end_of_turn_ids(t)
    gen = _eos_list(t.generation.get("eos_token_id"))
    # What settles the turn end: the chat template's end-of-turn tokens (tokenizer files), else the stop ids of
    # generation_config.json. config.json's eos_token_id alone is often the document end, not the turn end
    # (gpt-oss: <|return|>, while the template ends an assistant message with <|end|>).
    stops, settled = (eot, True) if eot else (gen, True) if gen else (eos, False)
    if not stops:
        return

    def label(xs) -> str:
        return ", ".join(f"{x} {names[x]!r}" if x in names else str(x) for x in sorted(xs))
    if not stops & ids and not settled:
        rep.add("warning", "d2t", f"config.json's eos_token_id ({label(stops)}) is not in the draft vocabulary, "
                "and the target directory holds no tokenizer_config.json, chat_template.jinja or "
                "generation_config.json to say which token ends a chat turn: not checked",
                "put the target's tokenizer_config.json (or chat_template.jinja) or generation_config.json beside "
                "its config.json and check again")
        return
    if not stops & ids:
        where = "the chat template's end-of-turn token" if eot else "generation_config.json's eos_token_id"
        rep.add("error", "d2t", f"no end-of-turn token of the target ({where}: {label(stops)}) is in the draft "
                "vocabulary: drafts never propose the end of a turn", "rebuild d2t with the chat template's "
                "end-of-turn and special tokens forced in")
        return
    doc = sorted(eos - ids - (stops & ids))
    if doc:
        rep.add("info", "d2t", f"document EOS id(s) {label(doc)} are not in the draft vocabulary (the "
                f"end-of-turn token {label(stops & ids)} is): chat turns end normally; raw completions that stop "
                "only at the document EOS are verified by the target")


def _eos_list(v) -> set[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return {v}
    return {x for x in v if isinstance(x, int) and not isinstance(x, bool)} if isinstance(v, list) else set()


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



def _check_no_aux(d: Drafter, a: EngineAdapter, run, why: str, rep: Report):
    """A head switched to the target's last hidden state (eagle_config.use_aux_hidden_state: false)."""
    key = "eagle_config.use_aux_hidden_state"
    fc = d.tensors.get("fc.weight")
    if fc is not None and len(fc.shape) == 2 and fc.shape[1] >= 2 * d.target_hidden:
        rep.add("error", key, f"false, but the checkpoint holds fc.weight {list(fc.shape)}, which fuses "
                f"{fc.shape[1] // d.target_hidden} aux hidden states: the head was trained on them, and {a.label} "
                "skips fc and feeds it the target's last hidden state instead",
                "set eagle_config.use_aux_hidden_state: true (or remove the key) if the drafter was trained with "
                "aux states")
        return
    if a.DRAFTER.get("fc_runs_without_aux"):
        rep.add("error", key, f"false: {a.label} {a.version} then captures no aux hidden states, but its MLA head "
                "runs fc on whatever it gets (combine_hidden_states has no such switch): fc takes "
                f"{aux_count_text(d)} the hidden size and gets one, so the engine stops at its first draft",
                "serve this head with SGLang, whose MLA head skips fc for one hidden state, or use a head trained "
                "with aux states")
        return
    v2 = a.DRAFTER.get("v2_aux_for_every_head")
    if v2 is not None and v2.contains(a.version) and run in ("v2", None):
        fix = (f"serve it on the V1 runner (specdeploy_engine_env: {{VLLM_USE_V2_MODEL_RUNNER: '0'}}), or use "
               f"{a.label} {v2.until} or later")
        if run == "v2":
            rep.add("error", key, f"false, and {a.label} {a.version}'s V2 model runner ({why}) fuses the target's "
                    "aux hidden states for every EAGLE-3 head: this head has no fc and gets three hidden states "
                    "where it takes one, so the engine stops at its first draft", fix)
        else:
            rep.add("warning", key, f"false: {a.label} {a.version}'s V2 model runner gives such a head the fused "
                    f"aux states it cannot take, V1 the target's last hidden state; which runner serves: {why}", fix)
        return
    rep.add("info", key, f"false: {a.label} captures no aux hidden states for this head (it drafts from the "
            "target's last hidden state), so no aux layer ids apply")


def aux_count_text(d: Drafter) -> str:
    fc = d.tensors.get("fc.weight")
    n = fc.shape[1] // d.target_hidden if fc is not None and len(fc.shape) == 2 and d.target_hidden else 3
    return f"{n} times"


def _check_model_type(d: Drafter, a: EngineAdapter, rep: Report):
    """A draft config whose model_type the release rewrites into its MTP drafter's config (SpeculativeConfig.
    hf_config_override runs on every draft model config, EAGLE-3 included)."""
    mt = d.config.get("model_type")
    span = a.DRAFTER.get("mtp_rewritten_model_types", {}).get(mt) if isinstance(mt, str) else None
    if d.fmt == "speculators" or span is None or not span.contains(a.version):
        return
    want = a.DRAFTER["convert_model_types"][d.fmt]
    rep.add("error", "model_type", f"{mt!r}: {a.label} {a.version} rewrites a draft config of this model type into "
            "its MTP drafter's (architectures replaced by the MTP class), so method eagle3 finds no EAGLE-3 class "
            "for it and the engine refuses to start", CONVERT.format(engine=a.name) + f" (writes model_type: {want}, "
            "a type the release keeps as written)")


def _check_aux(d: Drafter, t: TargetModel, engine: str, version: str, rep: Report, runner: str | None = None):
    top, nested = d.top_aux(), d.nested_aux()
    n = t.layers
    reads_top_first = get(engine).DRAFTER["aux_key"] == "eagle_aux_hidden_state_layer_ids"
    fam = _aux_family(t)
    final = get(engine).DRAFTER.get(f"aux_final_layer_{fam}") if fam else None
    last = n if final is not None and final.contains(version) else n - 1  # the final output as id n
    for key, ids, limit in (("eagle_aux_hidden_state_layer_ids", top, last),
                            ("eagle_config.eagle_aux_hidden_state_layer_ids", nested, n - 2)):
        if ids is None or (key != "eagle_aux_hidden_state_layer_ids" and reads_top_first and _ids_ok(top)):
            continue  # an engine that reads the top-level key first never reads the nested one here
        if not _ids_ok(ids):
            rep.add("error", key, f"{ids} is not three integer layer ids", "fc takes exactly three aux hidden "
                    "states; give three ids")
            return
        out = [i for i in ids if not 0 <= i <= limit]
        if out:
            rep.add("error", key, f"{out} out of range: the target has {n} layers, so "
                    + (f"vLLM captures layer inputs 0..{n - 1}" + (f" and the final output as {n}" if last == n else
                                                                         "") + "; a higher id is never captured"
                       if key == "eagle_aux_hidden_state_layer_ids" else
                       f"SGLang ids (layer outputs) go up to {limit}; the final layer's output is never captured"),
                    "use the taps the drafter was trained on; an id equal to the layer count is never captured")
            return
    if _ids_ok(top) and _ids_ok(nested) and [x - 1 for x in top] != list(nested):
        same = list(top) == list(nested)
        taps, how = engine_taps(d, t, engine, version, runner)
        if taps != list(top):
            msg = (f"the same numbers {top} under both keys: one of them is off by one (vLLM counts layer inputs, "
                   "SGLang layer outputs)" if same else f"top-level {top} and nested {nested} disagree")
            rep.add("error", "aux layers", f"{msg}; {engine} {version} would capture {taps} ({how})",
                    "keep only the key the trainer wrote and re-run convert")
            return
    trained, source = trained_taps(d)
    taps, how = engine_taps(d, t, engine, version, runner)
    family = _aux_family(t)
    zero = get(engine).DRAFTER.get(f"aux_layer_zero_fails_{family}") if family else None
    if taps and 0 in taps and zero is not None and zero.contains(version):
        what = "Llama" if family == "llama" else "DeepSeek/Kimi"
        rep.add("error", get(engine).DRAFTER["aux_key"], f"{engine} {version} captures aux layer 0 ({taps}, {how}): "
                f"its {what} target adds the residual to the hidden state, and layer 0 has none, so the first "
                "forward fails (TypeError)", (f"use {engine} {zero.until} or later, or " if zero.until else "use ")
                + "taps from layer 1 on")
        return
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


def _aux_family(t: TargetModel) -> str | None:
    """The target model family whose aux capture the tables record ("llama", "deepseek"); None: not read."""
    if t.is_kimi_or_deepseek:
        return "deepseek"
    return "llama" if "LlamaForCausalLM" in t.architectures else None


def _check_norm(d: Drafter, a: EngineAdapter, rep: Report):
    nbr = d.norm_before_residual(a.name)
    if a.DRAFTER.get("norm_before_residual") is False and d.fmt in ("llama", "speculators", "mla") and nbr:
        why = "" if "norm_before_residual" in d.config else " (speculators configs default it to True)"
        kind = "MLA" if d.fmt == "mla" else "Llama"
        rep.add("error", "norm_before_residual", f"True{why}, but {a.label}'s {kind} EAGLE-3 drafter implements only "
                "False: the drafter would run with the wrong residual math",
                f"serve this drafter with {a.drafter_fallback}")


