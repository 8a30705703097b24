"""The Llama EAGLE-3 head an engine release builds for a drafter config, and the checkpoint compared with it.

From the adapter's ``DRAFTER`` table: which config switches the release reads and where (``switches``), what
each builds (fc, input_norm, fc_norm.K), the names its loader renames, skips or cannot place, and what happens
to a tensor it has no parameter for (the load fails, or the tensor is dropped without a word). Names are in the
checkpoint's spelling after the loader's renames (q_proj/k_proj/v_proj stay separate).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy.engines import EngineAdapter, Span
from specdeploy.values.errors import Report
from specdeploy.checkpoint.modelcfg import TargetModel
from specdeploy.drafter.model import CONVERT, Drafter

SWITCHES = ("use_aux_hidden_state", "norm_before_fc", "fc_norm", "use_aux_norm", "norm_output")
DEFAULTS = {"use_aux_hidden_state": True, "norm_before_fc": False, "fc_norm": False, "use_aux_norm": False,
            "norm_output": False}
# what each switch builds, for the findings (a name prefix in the checkpoint)
BUILDS = {"norm_before_fc": "input_norm.", "fc_norm": "fc_norm.", "use_aux_norm": "fc_norm."}
HARMLESS = ("rotary_emb.inv_freq",)  # buffers a loader may drop: no trained weight is lost


def known(pair, version: str) -> bool | None:
    """(releases that do X, releases that do not) -> True / False / None (that release was not read)."""
    if pair is None:
        return None
    yes, no = pair if isinstance(pair, tuple) else (pair, None)
    if yes is not None and yes.contains(version):
        return True
    if no is not None and no.contains(version):
        return False
    return None


def _span(a: EngineAdapter, key: str) -> bool | None:
    s = a.DRAFTER.get(key)
    return None if s is None else (s.contains(a.version) if isinstance(s, Span) else bool(s))


def _places(d: Drafter) -> list[tuple[str, dict]]:
    """Where a switch may be written, in the order an engine reads them."""
    if d.fmt == "speculators":
        ec = d.layer.get("eagle_config")
        return [("eagle_config", ec if isinstance(ec, dict) else {}), ("speculators", d.config), ("top", d.layer)]
    ec = d.config.get("eagle_config")
    return [("eagle_config", ec if isinstance(ec, dict) else {}), ("top", d.config)]


def trained(d: Drafter, name: str) -> bool | None:
    """The value the config writes for a switch (the trainer's intent); None when it writes none."""
    for _, src in _places(d):
        if name in src and src[name] is not None:
            return bool(src[name])
    return None


def switch(d: Drafter, a: EngineAdapter, name: str) -> tuple[bool | None, str]:
    """The value the release runs with, and why; None when the release was not read for it."""
    places = a.DRAFTER.get("switches", {}).get(name, {})
    for where, src in _places(d):
        k = known(places.get(where), a.version)
        if where == "speculators" and k:  # the speculators loader always passes it on, default False
            return bool(src.get(name, DEFAULTS[name])), "speculators config"
        if name not in src or src[name] is None:
            continue
        if k is None:
            return None, f"whether {a.label} {a.version} reads {where} {name} was not read"
        if k:
            return bool(src[name]), f"{where} {name}"
    return DEFAULTS[name], "default"


def fc_norm_on(d: Drafter, a: EngineAdapter) -> tuple[bool | None, str]:
    on, how = switch(d, a, "fc_norm")
    if "use_aux_norm" in a.DRAFTER.get("switches", {}) and on is False:
        return switch(d, a, "use_aux_norm")
    return on, how


def aux_count(d: Drafter, a: EngineAdapter) -> int:
    """How many aux states fc fuses: where the release reads a count (``aux_count_keys``, in its order:
    num_aux_hidden_states, the nested ids, the top-level ids), else 3."""
    if _span(a, "aux_count_from_ids"):
        for key in a.DRAFTER.get("aux_count_keys", ("num_aux_hidden_states", "nested")):
            if key == "num_aux_hidden_states":
                n = d.layer.get(key) or d.config.get(key)
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    return n
                continue
            ids = d.nested_aux() if key == "nested" else d.top_aux()
            if isinstance(ids, list) and ids:
                return len(ids)
    return 3


@dataclass
class Head:
    required: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name -> shape the loader asserts
    optional: set[str] = field(default_factory=set)  # loaded when present
    skipped: list[str] = field(default_factory=list)  # substrings the loader drops on purpose
    unknown: str | None = None  # "raises" | "dropped" | None (not read)
    aux_on: bool | None = True
    aux_count: int = 3


def layer_prefix(a: EngineAdapter) -> str:
    """The name the release's single-layer loader matches ("midlayer.") or "layers." when it builds N."""
    multi = a.DRAFTER.get("llama_multi_layer")
    return "midlayer." if multi is not None and not multi.contains(a.version) else "layers."


def canonical(name: str, a: EngineAdapter) -> str:
    """A checkpoint name after the release's renames (layers.0. and midlayer. agree: the layout rule in
    rules._check_names reports a release that matches only one of them)."""
    if layer_prefix(a) == "midlayer.":
        name = "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name
    elif name.startswith("midlayer."):
        name = "layers.0." + name[len("midlayer."):]
    if _span(a, "legacy_aux_norm_names"):
        for i, old in enumerate(("aux_norm_low.", "aux_norm_mid.", "aux_norm_high.")):
            if name.startswith(old):
                name = f"fc_norm.{i}." + name[len(old):]
    return name


def drafter_class(d: Drafter, a: EngineAdapter) -> str | None:
    """The registry entry the release builds the drafter as (vLLM prefixes Eagle3 for method eagle3)."""
    if d.fmt == "speculators":
        mt = d.layer.get("model_type", "llama")
        return a.DRAFTER.get("speculators_classes", {}).get(mt)
    archs = [x for x in (d.config.get("architectures") or []) if isinstance(x, str)]
    if a.DRAFTER.get("eagle3_prefix"):
        archs = [x if x.startswith("Eagle3") or x.endswith("Eagle3") else "Eagle3" + x for x in archs]
    known = a.DRAFTER.get("archs", {})
    return next((x for x in archs if x in known and known[x].contains(a.version)), None)


def build(d: Drafter, t: TargetModel, a: EngineAdapter) -> Head | None:
    """The parameters the release's EAGLE-3 head creates for this config (the Llama head, or the MLA head where
    ``a`` is :func:`specdeploy.drafter.mla.view`'s); None for heads it is not recorded for (an MLA head on a
    release whose MLA loader was not read, a speculators config the release does not read)."""
    f = a.DRAFTER
    if d.fmt == "mla" and not f.get("read"):
        return None  # the release's MLA head was not read (mla.view gives the table where it was)
    if (d.fmt == "speculators" and not f["reads_speculators"]) or "switches" not in f:
        return None
    h, th = d.hidden, d.target_hidden
    heads, hd = d.heads, d.head_dim
    kv = d._int("num_key_value_heads", d.layer) or heads
    inter = d._int("intermediate_size", d.layer)
    head = Head()
    aux_on, _ = switch(d, a, "use_aux_hidden_state")
    head.aux_on, head.aux_count = aux_on, aux_count(d, a)
    n = head.aux_count
    have = d.tensor_layers()
    layers = len(have) if have else d.num_layers
    pre = layer_prefix(a)
    bias = bool(d.layer.get("attention_bias")) and _span(a, "attention_bias")
    if d.fmt == "mla":
        from specdeploy.drafter.mla import layer_params
        for i in range(layers):  # (a release that builds one layer refuses more: rules._check_layers says so)
            ps = layer_params(d.layer, h, i)
            if i:  # only layer 0 runs hidden_norm (the hidden states enter there)
                head.optional.add(f"layers.{i}.hidden_norm.weight")
                ps.pop(f"layers.{i}.hidden_norm.weight")
            head.required.update(ps)
        if d.layer.get("index_topk") is not None:  # a sparse-attention indexer (mla.check warns)
            head.skipped.append(".self_attn.indexer.")
    for i in range(0 if d.fmt == "mla" else 1 if pre == "midlayer." else layers):
        p = "midlayer." if pre == "midlayer." else f"layers.{i}."
        width = 2 * h if i == 0 else h
        r = head.required
        r[p + "self_attn.q_proj.weight"] = (heads * hd, width)
        r[p + "self_attn.k_proj.weight"] = (kv * hd, width)
        r[p + "self_attn.v_proj.weight"] = (kv * hd, width)
        r[p + "self_attn.o_proj.weight"] = (h, heads * hd)
        r[p + "mlp.gate_proj.weight"] = (inter, h)
        r[p + "mlp.up_proj.weight"] = (inter, h)
        r[p + "mlp.down_proj.weight"] = (h, inter)
        for norm in ("input_layernorm", "post_attention_layernorm", "hidden_norm"):
            r[p + norm + ".weight"] = (h,)
        if bias:
            head.required.update({p + f"self_attn.{x}_proj.bias": (r[p + f"self_attn.{x}_proj.weight"][0],)
                                  for x in a.DRAFTER.get("attention_bias_projections", "qkvo")})
        for suffix in f.get("layer_extras", {}).get(drafter_class(d, a), ()):  # e.g. Qwen3 layers' q_norm/k_norm
            r[p + suffix] = (hd,)
    head.required["norm.weight"] = (h,)
    head.optional |= {"embed_tokens.weight", "lm_head.weight", "d2t", "t2d"}
    fc_built = aux_on is not False or f.get("fc_always_built")
    if fc_built:
        head.required["fc.weight"] = (h, n * th)
        if _span(a, "fc_bias_key") and d.layer.get("bias"):
            head.required["fc.bias"] = (h,)
        if aux_on is False:  # built but never run: nothing needs loading
            head.optional |= {"fc.weight", "fc.bias"}
            head.required.pop("fc.weight")
            head.required.pop("fc.bias", None)
    else:
        head.skipped.append("fc.")
    if switch(d, a, "norm_before_fc")[0]:
        head.required["input_norm.weight"] = (n * th,)
    elif _span(a, "skips_unbuilt_input_norm"):
        head.skipped.append("input_norm.")
    if fc_norm_on(d, a)[0]:
        for k in range(n):
            head.required[f"fc_norm.{k}.weight"] = (th,)
    head.unknown = "raises" if _span(a, "unknown_tensor_raises") else \
        "dropped" if _span(a, "unknown_tensor_dropped") else None
    return head


def since_for(d: Drafter, a: EngineAdapter, name: str) -> str | None:
    """The first release that reads the switch where this config writes it (any place when it writes none)."""
    places = a.DRAFTER.get("switches", {}).get(name, {})
    written = [w for w, src in _places(d) if name in src] or list(places)
    out = sorted((places[w][0].since for w in written if w in places and places[w][0] is not None
                  and places[w][0].since), key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))
    return out[0] if out else None


def _fix_for(d: Drafter, a: EngineAdapter, names: list[str]) -> str:
    """A release that builds what these names need, when a switch of this engine builds it."""
    for sw, prefix in BUILDS.items():
        if sw in a.DRAFTER.get("switches", {}) and any(x.startswith(prefix) for x in names):
            since = since_for(d, a, sw)
            now = known(next(iter(a.DRAFTER["switches"][sw].values())), a.version)
            if now:
                return f"set {sw}: true (the checkpoint holds {prefix}* weights: it was trained with it)"
            if since:
                return f"set {sw}: true and use {a.label} {since} or later, which builds {prefix}*"
    kind = "MLA" if d.fmt == "mla" else "Llama"
    return f"use a drafter exported for this engine's {kind} EAGLE-3 head, or an engine release that builds them"


def check_head(d: Drafter, t: TargetModel, a: EngineAdapter, rep: Report) -> Head | None:
    head = build(d, t, a)
    if head is None:
        return None
    _check_switches(d, a, rep)
    if _span(a, "fc_norm_unapplied") and fc_norm_on(d, a)[0]:
        rep.add("error", "fc_norm", f"true: {a.label} {a.version}'s MLA head builds fc_norm.* and loads the trained "
                "weights, but never applies them (combine_hidden_states runs fc alone), so fc gets the aux states "
                "without the norms it was trained with", f"use {a.label} {a.DRAFTER['fc_norm_applied'].since} or "
                "later")
    if not d.tensors:
        return head
    names = {canonical(n, a): n for n in d.tensors}
    unknown = sorted(c for c in names if c not in head.required and c not in head.optional
                     and not any(s in c for s in head.skipped) and not c.endswith(HARMLESS))
    if _span(a, "unknown_bias_dropped"):  # the weights loader skips biases it has no parameter for
        biases = [c for c in unknown if c.endswith(".bias")]
        unknown = [c for c in unknown if not c.endswith(".bias")]
        if biases:
            rep.add("warning", "dropped tensors", f"{len(biases)} bias tensor(s) have no parameter in {a.label} "
                    f"{a.version}'s EAGLE-3 head and its loader skips them without a word: "
                    + ", ".join(names[c] for c in biases[:4]), "set attention_bias: true if the drafter was "
                    "trained with them")
    if unknown and head.unknown == "dropped" and d.fmt == "mla":
        from specdeploy.drafter.mla import unknown_split
        raising, unknown = unknown_split(unknown, a)
        if raising:
            rep.add("error", "tensor names", f"{len(raising)} checkpoint tensor(s) name a fused shard (gate/up, "
                    f"q_a/kv_a) of a parameter {a.label} {a.version}'s MLA head does not build: "
                    + ", ".join(names[c] for c in raising[:4]) + "; its loader looks the fused parameter up and "
                    "raises (KeyError), so the load fails", _fix_for(d, a, raising))
    if unknown:
        shown = ", ".join(names[c] for c in unknown[:4]) + (f" (+{len(unknown) - 4} more)" if len(unknown) > 4 else "")
        if head.unknown == "raises":
            rep.add("error", "tensor names", f"{len(unknown)} checkpoint tensor(s) have no parameter in {a.label} "
                    f"{a.version}'s EAGLE-3 head: {shown}; its loader raises on the first (KeyError / no module or "
                    "parameter named ...) and the load fails", _fix_for(d, a, unknown))
        elif head.unknown == "dropped":
            how = "skipped with a log line" if a.DRAFTER.get("unknown_tensor_logged") else "dropped without a word"
            rep.add("error", "tensor names", f"{len(unknown)} checkpoint tensor(s) have no parameter in {a.label} "
                    f"{a.version}'s EAGLE-3 head and are {how}: {shown}; the head runs without "
                    "these trained weights", _fix_for(d, a, unknown))
        else:
            rep.add("warning", "tensor names", f"{len(unknown)} checkpoint tensor(s) are not among the parameters "
                    f"recorded for {a.label}'s EAGLE-3 head ({shown}); what {a.version} does with them was not read",
                    "check the drafter on the engine itself")
    _check_dropped_norms(d, a, head, names, rep)
    # rules._check_shapes reports the decoder projections' weights
    layer_checked = () if d.fmt == "mla" else tuple(f"self_attn.{x}_proj.weight" for x in "qkvo") + \
        tuple(f"mlp.{x}_proj.weight" for x in ("gate", "up", "down"))
    missing = [n for n in head.required if n not in names and not n.split(".", 2)[-1].startswith(layer_checked)
               and not (n.startswith("midlayer.") and n[len("midlayer."):].startswith(layer_checked))]
    if "input_norm.weight" in missing and "fc_norm.0.weight" in head.required and _span(a, "input_norm_then_fc_norm"):
        missing.remove("input_norm.weight")  # left at ones: a uniform scale the per-aux fc_norms remove exactly
        rep.add("info", "input_norm.weight", f"not in the checkpoint: {a.label} {a.version} leaves it at ones, and "
                "the per-aux fc_norm it applies next removes that uniform scale, so the head runs as without it")
    if missing:
        sure = _span(a, "missing_tensor_uninitialised")
        rep.add("error" if sure else "warning", "missing tensors", f"{len(missing)} parameter(s) {a.label} "
                f"{a.version} builds for this config are not in the checkpoint: {', '.join(missing[:4])}"
                + ("; they stay uninitialised (the loader does not check that every parameter was loaded)" if sure else
                   "; whether the loader notices was not read"), _missing_fix(missing))
    bad = []
    for c, n in names.items():
        want = head.required.get(c)
        got = d.tensors[n].shape
        if want is None or tuple(got) == want or c.split(".", 2)[-1].startswith(layer_checked) or c == "fc.weight":
            continue
        bad.append(f"{n} {list(got)} != {list(want)}")
    if bad:
        rep.add("error", "tensor shapes", f"{len(bad)} tensor(s) do not fit the parameters {a.label} {a.version} "
                "builds (its weight loader asserts the shape): " + "; ".join(bad[:3]),
                "fix hidden_size / target_hidden_size / the switches to the trained values, or re-export")
    if "fc.weight" in head.required:
        fc_shape(d, head.aux_count, rep)
    _check_tied(d, a, rep)
    return head


def reads_top(a: EngineAdapter, name: str) -> bool:
    """Whether the release reads the switch at the flat config's top level."""
    return bool(known(a.DRAFTER.get("switches", {}).get(name, {}).get("top"), a.version))


def _check_dropped_norms(d: Drafter, a: EngineAdapter, head: Head, names: dict, rep: Report):
    """Trained norm weights the release skips because the switch that builds them is off where it reads it."""
    for sw, prefix in (("norm_before_fc", "input_norm."), ("fc_norm", "fc_norm.")):
        have = [c for c in names if c.startswith(prefix)]
        if not have or any(r.startswith(prefix) for r in head.required) or \
                not any(prefix in s for s in head.skipped):
            continue
        fix = CONVERT.format(engine=a.name) + f" (writes {sw}: true at the top level, where {a.label} " \
            f"{a.version} reads it)" if reads_top(a, sw) else _fix_for(d, a, have)
        rep.add("error", sw, f"the checkpoint holds {', '.join(names[c] for c in have[:3])} (trained with {sw}), "
                f"but {a.label} {a.version} does not read {sw} as on where this config writes it: it builds no "
                f"{prefix}* and skips the trained weights, so fc gets the aux states without the norm it was "
                "trained with", fix)


def _missing_fix(missing: list[str]) -> str:
    if any(m.startswith(tuple(BUILDS.values())) for m in missing):
        return "set the switch that builds them (norm_before_fc / fc_norm) to the value the drafter was trained " \
               "with, or export those weights"
    return "export every weight of the head"


def fc_shape(d: Drafter, n: int, rep: Report):
    h, th = d.hidden, d.target_hidden
    shape = d.tensors["fc.weight"].shape if "fc.weight" in d.tensors else None
    if shape is None:
        rep.add("error", "fc.weight", f"missing: the head fuses {n} aux hidden states through fc, which stays "
                "uninitialised", "the drafter checkpoint must contain fc.weight (or set "
                "eagle_config.use_aux_hidden_state: false if it was trained without aux states)")
    elif n == 3 and len(shape) == 2 and shape[1] == 4 * th:
        rep.add("error", "fc.weight", f"shape {list(shape)} fuses 4 hidden states; EAGLE-3 engines build fc "
                f"for 3 (expected [{h}, {3 * th}])",
                "retrain/export without the final-layer state in fc (3 aux layers)")
    elif tuple(shape) != (h, n * th):
        rep.add("error", "fc.weight", f"shape {list(shape)}, expected [{h}, {n * th}] ({n} aux states)",
                "export the drafter for this target's hidden size")


def _check_switches(d: Drafter, a: EngineAdapter, rep: Report):
    for name in ("use_aux_hidden_state", "norm_before_fc", "fc_norm", "norm_output"):
        want = trained(d, name)
        if name == "fc_norm" and not want:
            want = trained(d, "use_aux_norm") or want
        if want is None or want == DEFAULTS[name]:
            continue
        got, how = fc_norm_on(d, a) if name == "fc_norm" else switch(d, a, name)
        prefix = BUILDS.get(name)
        if prefix and d.tensors and got is False and not any(canonical(n, a).startswith(prefix) for n in d.tensors):
            rep.add("warning", name, f"{want} in the config, but the checkpoint holds no {prefix}* weights and "
                    f"{a.label} {a.version} runs without it (the oracle: such a head drafts as exported)",
                    f"remove {name} from the config if the drafter was trained without it")
            continue
        if got is None:
            rep.add("warning", name, f"{want} in the config; {how}", "check the drafter on the engine itself")
        elif got != want:
            since = since_for(d, a, name)
            fix = (f"use {a.label} {since} or later (it reads it)" if since else
                   f"serve this drafter with {a.drafter_fallback or 'an engine that reads it'}")
            rep.add("error", name, f"{want} in the config, but {a.label} {a.version} does not read it where it is "
                    f"written: the head runs with {got}, not as it was trained", fix)


def _check_tied(d: Drafter, a: EngineAdapter, rep: Report):
    if _span(a, "tied_lm_head_is_embedding") and d.layer.get("tie_word_embeddings") is True \
            and "lm_head.weight" in d.tensors:
        rep.add("error", "tie_word_embeddings", f"true, so {a.label} {a.version} makes lm_head the embedding "
                "(replaced by the target's) and drops the trained lm_head.weight",
                CONVERT.format(engine=a.name) + " (writes tie_word_embeddings: false: the drafter has its own head)")
