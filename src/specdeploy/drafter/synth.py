"""A drafter of the right shape from the target's config alone: a random-weight EAGLE-3 head for one engine release.

No download and no training: the head's config comes from the target's (hidden size, heads, dense MLP width, vocabulary,
rope, context length, dtype), its aux layers are the ones the release captures by default (written in both numberings,
so the doctor's aux rule holds on either engine), its tensors are the parameters the release builds for that config
(``drafter.head.build``: the layer prefix, the norms and ``fc`` its switches build), plus ``lm_head`` over a draft
vocabulary with ``d2t``/``t2d`` (the first regular tokens and the target's end-of-turn tokens, as trainers select
them; a target whose vocabulary is no larger than the draft vocabulary gets a full-vocabulary head without them,
which vLLM 0.32.0 refuses beside a full vocabulary: "no module or parameter named 'draft_id_to_target_id'", seen on
its CPU build). The embedding is left to the target's (the releases share it when the head has none).

Weights are ``random`` (a bounded random block of the head's dtype, repeated: every draft token differs, so a verify
step routes its draft tokens as varied text does; norms are ones) or ``zeros`` (holes in a sparse file: no disk, for
checks that read headers only). What it costs on disk is checked against the free space before anything is written,
and :func:`temporary_head` removes the head afterwards.

The engine never judges these tokens in the synthetic method (it accepts them at a calibrated rate), which is what
makes a random head enough to measure the price of speculation (``specdeploy breakeven --measure``).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeploy.engines import get_adapter
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.checkpoint.modelcfg import TargetModel
from specdeploy.checkpoint.safetensors_io import DTYPE_BYTES, encode_header
from specdeploy.drafter.head import build
from specdeploy.drafter.model import Drafter, default_aux, end_of_turn_ids, resolve_version

DRAFT_VOCAB = 32000  # the draft vocabulary EAGLE-3 trainers default to
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
BLOCK = 1 << 22  # bytes of random values, repeated through the tensors
MARK = "specdeploy-synth.json"  # what was generated, for whoever finds the directory
FILLS = ("random", "zeros")


def _err(subject: str, message: str, fix: str) -> SpecdeployError:
    return SpecdeployError([Finding("error", subject, message, fix)])


def _int(cfg: dict, key: str) -> int | None:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def head_config(t: TargetModel, engine: str, version: str, draft_vocab: int | None = None,
                intermediate: int | None = None) -> dict:
    """The head's config.json for ``t`` on ``engine`` ``version``."""
    text = t.text
    h = _int(text, "hidden_size")
    heads = _int(text, "num_attention_heads")
    vocab = _int(text, "vocab_size")
    if not (h and heads and vocab):
        raise _err("--target", f"{t.path}: config.json has no hidden_size / num_attention_heads / vocab_size",
                   "give the target's own config.json")
    head_dim = _int(text, "head_dim") or _int(text, "v_head_dim") or h // heads
    kv = _int(text, "num_key_value_heads") or heads
    inter = intermediate or _int(text, "intermediate_size") or 4 * h
    dv = min(draft_vocab or DRAFT_VOCAB, vocab)
    dtype = str(text.get("torch_dtype") or t.config.get("torch_dtype") or "bfloat16")
    if dtype not in DTYPES:
        dtype = "bfloat16"
    a = get_adapter(engine, version)
    taps = default_aux(t.layers)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
           "target_hidden_size": h, "intermediate_size": inter, "num_hidden_layers": 1,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim, "hidden_act": "silu",
           "vocab_size": vocab, "draft_vocab_size": dv, "rms_norm_eps": 1e-6,
           "max_position_embeddings": _int(text, "max_position_embeddings") or 4096,
           "rope_theta": text.get("rope_theta", 10000.0), "tie_word_embeddings": False,
           "norm_before_residual": False, "torch_dtype": dtype,
           "eagle_aux_hidden_state_layer_ids": taps,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": a.drafter_nested_ids(taps, t.is_kimi_or_deepseek),
                            "use_aux_hidden_state": True}}
    if isinstance(text.get("rope_scaling"), dict):
        cfg["rope_scaling"] = dict(text["rope_scaling"])
    for key in ("bos_token_id", "eos_token_id"):
        if key in text:
            cfg[key] = text[key]
    return cfg


def vocab_selection(t: TargetModel, draft_vocab: int, vocab: int) -> list[int]:
    """The target ids of the draft vocabulary: the target's end-of-turn tokens and the lowest other ids."""
    eot, _ = end_of_turn_ids(t)
    keep = sorted(i for i in eot if 0 <= i < vocab)[:draft_vocab]
    rest = [i for i in range(vocab) if i not in set(keep)][:draft_vocab - len(keep)]
    return sorted(set(keep) | set(rest))


def tensor_specs(cfg: dict, t: TargetModel, engine: str, version: str, work: Path) -> dict[str, tuple[str, tuple]]:
    """name -> (safetensors dtype, shape): the parameters the release builds for ``cfg`` (drafter.head.build),
    lm_head, d2t and t2d."""
    (work / "config.json").write_text(json.dumps(cfg))
    d = Drafter.load(work)
    head = build(d, t, get_adapter(engine, version))
    if head is None:
        raise _err("--engine", f"specdeploy records no Llama EAGLE-3 head for {engine} {version}",
                   "use an engine release whose drafter conventions are recorded")
    dt = DTYPES[cfg["torch_dtype"]]
    specs = {n: (dt, tuple(s)) for n, s in sorted(head.required.items())}
    specs["lm_head.weight"] = (dt, (cfg["draft_vocab_size"], cfg["hidden_size"]))
    if cfg["draft_vocab_size"] < cfg["vocab_size"]:  # a full-vocabulary head maps nothing (vLLM 0.32.0 builds no
        specs["d2t"] = ("I64", (cfg["draft_vocab_size"],))  # draft_id_to_target_id then, and refuses a d2t)
        specs["t2d"] = ("BOOL", (cfg["vocab_size"],))
    return specs


def nbytes(specs: dict) -> int:
    total = 0
    for dtype, shape in specs.values():
        n = DTYPE_BYTES[dtype]
        for s in shape:
            n *= s
        total += n
    return total


def _random_block(dtype: str, seed: int) -> bytes:
    """BLOCK bytes of values of random sign and mantissa with magnitudes in [2^-7, 2^-6) (a typical init scale:
    0.008-0.016), in ``dtype``: random bytes with the sign and exponent bits set, never an infinity or a NaN."""
    raw = bytearray(random.Random(seed).randbytes(BLOCK))
    sign_exp = bytes((b & 0x80) | 0x3C for b in range(256))  # s0111100: exponent 120 (bf16 and f32 high byte)
    low7 = bytes(b & 0x7F for b in range(256))
    if dtype == "BF16":
        raw[1::2] = raw[1::2].translate(sign_exp)
        raw[0::2] = raw[0::2].translate(low7)
    elif dtype == "F32":
        raw[3::4] = raw[3::4].translate(sign_exp)
        raw[2::4] = raw[2::4].translate(low7)
    else:  # F16: s01000MM, exponent 8
        raw[1::2] = raw[1::2].translate(bytes((b & 0x83) | 0x20 for b in range(256)))
    return bytes(raw)


def _ones(dtype: str, count: int) -> bytes:
    fmt = {"BF16": None, "F16": "e", "F32": "f"}[dtype]
    one = struct.pack("<f", 1.0)[2:] if fmt is None else struct.pack(f"<{fmt}", 1.0)
    return one * count


def write(out: Path, target_dir: Path, engine: str, version: str | None = None, fill: str = "random", seed: int = 0,
          draft_vocab: int | None = None, intermediate: int | None = None, max_bytes: int | None = None) -> dict:
    """Write the head into the new directory ``out``; return what was written (config, tensors, bytes, fill).
    A SpecdeployError names what is wrong (no such target, an unknown release, too little disk, ``out`` exists)."""
    if fill not in FILLS:
        raise _err("--fill", f"'{fill}' is not one of {', '.join(FILLS)}", "give random or zeros")
    version = resolve_version(engine, version)
    t = TargetModel.load(Path(target_dir))
    cfg = head_config(t, engine, version, draft_vocab, intermediate)
    out = Path(out)
    if out.exists():
        raise _err("--out", f"{out} exists", "give a new directory (a generated head is never written over anything)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        specs = tensor_specs(cfg, t, engine, version, staged)
        size = nbytes(specs)
        need = size if fill == "random" else sum(nbytes({n: s}) for n, s in specs.items()
                                                 if n in ("d2t", "t2d") or n.endswith("norm.weight"))
        free = shutil.disk_usage(staged).free
        if max_bytes is not None and need > max_bytes:
            raise _err("--max-bytes", f"the head needs {need / 1e9:.2f} GB on disk, above the limit "
                       f"{max_bytes / 1e9:.2f} GB", "raise the limit, or give a smaller --draft-vocab")
        if need > free - (1 << 30):
            raise _err("--out", f"the head needs {need / 1e9:.2f} GB on disk; {out.parent} has {free / 1e9:.2f} GB "
                       "free (1 GB is kept)", "give a directory on a file system with room, or --fill zeros")
        sel = vocab_selection(t, cfg["draft_vocab_size"], cfg["vocab_size"])
        _write_tensors(staged / "model.safetensors", specs, sel, fill, seed)
        meta = {"what": "a random-weight EAGLE-3 head generated from the target's config (specdeploy drafter synth)",
                "target": str(Path(target_dir).resolve()), "engine": engine, "version": version, "fill": fill,
                "seed": seed, "bytes": size}
        (staged / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (staged / MARK).write_text(json.dumps(meta, indent=2) + "\n")
        os.rename(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return {**meta, "path": str(out), "config": cfg, "tensors": {n: [d, list(s)] for n, (d, s) in specs.items()}}


def _write_tensors(path: Path, specs: dict, sel: list[int], fill: str, seed: int):
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (dtype, shape) in specs.items():
        n = nbytes({name: (dtype, shape)})
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    head = encode_header(header)
    data = {}
    if "t2d" in specs:
        mask = bytearray(specs["t2d"][1][0])
        for i in sel:
            mask[i] = 1
        data = {"d2t": struct.pack(f"<{len(sel)}q", *[t - i for i, t in enumerate(sel)]), "t2d": bytes(mask)}
    blocks: dict[str, bytes] = {}
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + off)  # holes: what is not written below stays zero without taking disk
        for name, (dtype, shape) in specs.items():
            b, e = header[name]["data_offsets"]
            fh.seek(len(head) + b)
            if name in data:
                fh.write(data[name])
            elif name.endswith("norm.weight"):
                fh.write(_ones(dtype, (e - b) // DTYPE_BYTES[dtype]))
            elif fill == "random":
                block = blocks.setdefault(dtype, _random_block(dtype, seed))
                left = e - b
                while left > 0:
                    chunk = block[:min(left, len(block))]
                    fh.write(chunk)
                    left -= len(chunk)


@contextmanager
def temporary_head(parent: Path, target_dir: Path, engine: str, version: str, **kw) -> Iterator[dict]:
    """A generated head under ``parent`` for the duration of the block, removed afterwards (also on failure)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specdeploy-head-", dir=parent))
    try:
        yield write(work / "head", target_dir, engine, version, **kw)
    finally:
        shutil.rmtree(work, ignore_errors=True)
