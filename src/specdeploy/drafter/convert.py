"""`drafter convert`: an engine-ready copy of a drafter, or a refusal saying why none exists."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from specdeploy.engines import get_adapter
from specdeploy.values.errors import Finding, Report, SpecdeployError
from specdeploy.checkpoint.modelcfg import TargetModel
from specdeploy.checkpoint.safetensors_io import (
    INDEX_FILE,
    encode_header,
    read_header,
    rewrite_names,
    sparse_copy_range,
)
from specdeploy.drafter.head import SWITCHES, check_head
from specdeploy.drafter.head import trained as head_trained
from specdeploy.drafter.model import META_FILE, Drafter, default_aux, is_convertible, resolve_version, trained_taps
from specdeploy.drafter.rules import _legacy_layer_names, check

# ---------------------------------------------------------------------------------------------------------
def _link_or_copy(src: Path, dst: Path):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def convert(drafter_dir: Path, target_dir: Path, engine: str, out: Path, version: str | None = None,
            target_check: bool = True) -> dict:
    """Write an engine-ready copy of the drafter in ``out``; refuse, saying why, when no correct conversion
    exists. Fixes: architecture name, speculators verifier / flattening, aux-id keys, num_hidden_layers from
    the tensors, draft_vocab_size for a shared lm_head, and the layers.0./midlayer. layout.

    ``out`` is written beside itself and renamed into place (:mod:`specdeploy.plan.outdir`): it must not exist, or be
    a previous conversion; anything else there is refused and left alone, and a failed conversion leaves nothing."""
    from specdeploy.plan.outdir import atomic_output_dir, check_target
    inputs = (Path(drafter_dir), Path(target_dir))
    check_target(out, CONVERT_CMD, inputs, _previous_conversion)
    try:
        with atomic_output_dir(out, CONVERT_CMD, inputs, _previous_conversion) as staged:
            return _convert_into(drafter_dir, target_dir, engine, staged, version, target_check)
    except SpecdeployError as exc:
        if "staged" not in locals():
            raise
        # findings on the staged copy name the path it was going to have
        raise SpecdeployError([dataclasses.replace(f, message=f.message.replace(str(staged), str(out)))
                               for f in exc.problems]) from None


CONVERT_CMD = "drafter convert"


def _previous_conversion(path: Path) -> bool:
    """A conversion written before outputs were marked: it holds the conversion record."""
    return (path / META_FILE).is_file() and (path / "config.json").is_file()


def _convert_into(drafter_dir: Path, target_dir: Path, engine: str, out: Path, version: str | None = None,
                  target_check: bool = True) -> dict:
    """The conversion, written into the new, empty directory ``out``; ``target_check``: as in ``check``."""
    version = resolve_version(engine, version)
    a = get_adapter(engine, version)
    facts = a.DRAFTER
    pre = check(drafter_dir, target_dir, engine, version, target_check)
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
        kept = {k: d.config[k] for k in SWITCHES if d.config.get(k) is not None and k not in flat}
        flat.update(kept)  # the head's switches live at the speculators top level: the flat head reads them there
        cfg = flat
        if kept:
            actions.append(f"kept {', '.join(f'{k}: {v}' for k, v in kept.items())} in the flat config")
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
    if any(f.subject == "model_type" for f in pre.errors):
        want = facts["convert_model_types"][d.fmt]
        actions.append(f"model_type {cfg.get('model_type')!r} -> {want!r} ({a.label} {version} rewrites the former "
                       "into its MTP drafter's config)")
        cfg["model_type"] = want
    as_speculators = d.fmt == "speculators" and facts["reads_speculators"]
    layer_cfg = cfg["transformer_layer_config"] if as_speculators else cfg
    have = d.tensor_layers()
    if d.tensors and have and len(have) != d.num_layers:
        layer_cfg["num_hidden_layers"] = len(have)
        actions.append(f"num_hidden_layers {d.num_layers} -> {len(have)} (the layers the checkpoint holds)")
    if "lm_head.weight" in d.tensors and layer_cfg.get("tie_word_embeddings") is True:
        layer_cfg["tie_word_embeddings"] = False
        actions.append("tie_word_embeddings true -> false: the drafter has its own trained lm_head.weight")
    head_rows = d.tensors["lm_head.weight"].shape[0] if "lm_head.weight" in d.tensors and \
        len(d.tensors["lm_head.weight"].shape) == 2 else None
    if any(f.subject == "lm_head.weight" and f.severity in ("error", "warning") and is_convertible(f)
           for f in pre.findings):
        if head_rows is None:
            cfg.pop("draft_vocab_size", None)
            actions.append(f"dropped draft_vocab_size (= vocab_size) so {a.label} loads the target's lm_head")
        else:
            layer_cfg["draft_vocab_size"] = head_rows
            actions.append(f"draft_vocab_size {d.config.get('draft_vocab_size')} -> {head_rows} (the rows of the "
                           "trained lm_head, which it keeps)")
    for sw, prefix in (("norm_before_fc", "input_norm."), ("fc_norm", "fc_norm.")):
        if any(f.subject == sw and is_convertible(f) for f in pre.errors):
            layer_cfg[sw] = True
            actions.append(f"{sw}: true at the top level (the checkpoint holds trained {prefix}* weights)")
    nested = a.drafter_nested_ids(taps, t.is_kimi_or_deepseek)
    if head_trained(d, "use_aux_hidden_state") is False:
        actions.append("eagle_config.use_aux_hidden_state false kept: the head takes no aux states, no aux ids "
                       "written")
    elif as_speculators:
        cfg["eagle_aux_hidden_state_layer_ids"] = taps
    else:
        cfg["eagle_aux_hidden_state_layer_ids"] = taps
        ec = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
        cfg["eagle_config"] = dict(ec, eagle_aux_hidden_state_layer_ids=nested, use_aux_hidden_state=True)
    if head_trained(d, "use_aux_hidden_state") is not False:
        actions.append(f"aux layers from {source if trained else 'the target default'}: vLLM ids {taps} (top "
                       "level)" + ("" if as_speculators else f", SGLang ids {nested} (eagle_config)"))
    if "norm_before_residual" not in d.config or d.fmt == "speculators":
        cfg["norm_before_residual"] = nbr
        actions.append(f"norm_before_residual written explicitly as {nbr}")
    drop = {"d2t", "t2d"} if any(f.subject == "d2t" and "drops d2t" in f.fix for f in pre.errors) else set()
    if drop:
        actions.append(f"dropped d2t and t2d: the draft vocabulary is the target's and the map the identity, and "
                       f"{a.label} {version} builds none")
    strip = bool(facts.get("keeps_model_prefix")) and any(n.startswith("model.") for n in d.raw_tensors or {})
    legacy = _legacy_layer_names(d, a)
    rename = legacy or strip

    def renamed(s: str) -> str:
        if strip and s.startswith("model."):  # the loader adds model. itself
            s = s[len("model."):]
        if legacy:
            s = ("midlayer." + s[len("layers.0."):] if s.startswith("layers.0.") else
                 "model.midlayer." + s[len("model.layers.0."):] if s.startswith("model.layers.0.") else s)
        return s

    _refuse_losses(d, cfg, layer_cfg, renamed if rename else None, a, t, drop)
    tmp = out
    renamed_total = 0
    for f in sorted(drafter_dir.iterdir()):
        if f.name in ("config.json", META_FILE) or not f.is_file():
            continue
        if f.suffix == ".safetensors" and drop and drop & set(read_header(f)[0]):
            renamed_total += _rewrite_without(f, tmp / f.name, renamed if rename else (lambda x: x), drop)
        elif f.suffix == ".safetensors" and rename:
            n = rewrite_names(f, tmp / f.name, renamed)
            if n == 0:
                (tmp / f.name).unlink()
                _link_or_copy(f, tmp / f.name)
            renamed_total += n
        elif f.name == INDEX_FILE and (rename or drop):
            idx = json.loads(f.read_text())
            idx["weight_map"] = {(renamed(k) if rename else k): v for k, v in idx.get("weight_map", {}).items()
                                 if k not in drop}
            (tmp / f.name).write_text(json.dumps(idx, indent=1))
        else:
            _link_or_copy(f, tmp / f.name)
    if renamed_total:
        actions.append(f"renamed {renamed_total} tensors ("
                       + ", ".join(x for x, on in (("model.X -> X", strip), ("layers.0.* -> midlayer.*", legacy))
                                   if on) + f") for {a.label} {version}")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    meta = {"engine": engine, "engine_version": version, "source": str(drafter_dir.resolve()),
            "target": str(target_dir.resolve()), "format": d.fmt, "actions": actions,
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    post = check(out, target_dir, engine, version, target_check)
    if not post.ok:
        raise SpecdeployError([Finding("error", f.subject, f"converted drafter still fails: {f.message}", f.fix)
                               for f in post.errors])
    meta["check"] = post.to_dict()
    return meta


def _rewrite_without(src: Path, dst: Path, rename, drop: set[str]) -> int:
    """``src`` without the ``drop`` tensors (the data of the others packed in order, copied sparsely) and with
    names mapped by ``rename``; returns how many names changed."""
    header, base = read_header(src)
    kept = sorted(((n, m) for n, m in header.items() if n != "__metadata__" and n not in drop),
                  key=lambda x: x[1]["data_offsets"][0])
    new, pos, changed = {}, 0, 0
    if "__metadata__" in header:
        new["__metadata__"] = header["__metadata__"]
    for name, meta in kept:
        start, end = meta["data_offsets"]
        nn = rename(name)
        changed += nn != name
        new[nn] = dict(meta, data_offsets=[pos, pos + end - start])
        pos += end - start
    head = encode_header(new)
    # unbuffered: sparse_copy_range moves the descriptor with lseek(SEEK_DATA/SEEK_HOLE) between reads, which a
    # buffered reader reused for several ranges does not see (it then reads from where lseek left the file)
    with open(src, "rb", buffering=0) as fi, open(dst, "wb") as fo:
        fo.write(head)
        fo.truncate(len(head) + pos)
        for name, meta in kept:
            start, end = meta["data_offsets"]
            sparse_copy_range(fi, fo, base + start, len(head) + new[rename(name)]["data_offsets"][0], end - start)
    return changed


LOSSES = ("tensor names", "missing tensors", "tensor shapes", "tie_word_embeddings") + SWITCHES


def _refuse_losses(d: Drafter, cfg: dict, layer_cfg: dict, rename, a, t: TargetModel, drop: set = frozenset()):
    """Refuse a conversion whose result would lose trained weights or norms on this release (a head that
    drops or cannot place checkpoint tensors, or runs without a switch the drafter was trained with)."""
    fmt = "speculators" if "speculators_model_type" in cfg else d.fmt if d.fmt != "speculators" else "llama"
    tensors = {(rename(n) if rename else n): ti for n, ti in d.tensors.items() if n not in drop}
    after = Drafter(d.path, cfg, fmt, layer_cfg if fmt == "speculators" else cfg, tensors, d.bin_files)
    rep = Report()
    check_head(after, t, a, rep)
    lost = [f for f in rep.errors if f.subject in LOSSES]
    if lost:
        raise SpecdeployError([Finding("error", f.subject, f"cannot convert: the converted drafter would lose "
                                       f"trained weights on {a.label} {a.version}: {f.message}", f.fix)
                               for f in lost])
