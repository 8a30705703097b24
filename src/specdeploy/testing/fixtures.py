"""Realistic-size EAGLE-3 drafter checkpoints as sparse files, for tests, benchmarks and demos.

A real safetensors header, real d2t/t2d tensors, and zero-filled (hole) weights that take no disk space.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from specdeploy.checkpoint.safetensors_io import write_sparse

TARGET_VOCAB = 163840
HIDDEN = 7168
DRAFT_VOCAB = 32000
# Real trainers build d2t from assistant turns: the end-of-turn token <|im_end|> (163586) is in it, the
# document EOS [EOS] (163585) is not.
EOS = (163586,)


def vocab_selection(draft_vocab: int = DRAFT_VOCAB, vocab: int = TARGET_VOCAB, include=EOS) -> list[int]:
    ids = set(range(draft_vocab - len(include))) | set(include)
    return sorted(ids)


def drafter_tensors(hidden=HIDDEN, target_hidden=HIDDEN, draft_vocab=DRAFT_VOCAB, vocab=TARGET_VOCAB,
                    inter=12288, heads=64, kv_heads=64, head_dim=128, prefix="layers.0.", fc_mult=3,
                    with_d2t=True, with_t2d=True, d2t_dtype="I64", selection=None):
    specs = {
        f"{prefix}self_attn.q_proj.weight": ("BF16", (heads * head_dim, 2 * hidden)),
        f"{prefix}self_attn.k_proj.weight": ("BF16", (kv_heads * head_dim, 2 * hidden)),
        f"{prefix}self_attn.v_proj.weight": ("BF16", (kv_heads * head_dim, 2 * hidden)),
        f"{prefix}self_attn.o_proj.weight": ("BF16", (hidden, heads * head_dim)),
        f"{prefix}mlp.gate_proj.weight": ("BF16", (inter, hidden)),
        f"{prefix}mlp.up_proj.weight": ("BF16", (inter, hidden)),
        f"{prefix}mlp.down_proj.weight": ("BF16", (hidden, inter)),
        f"{prefix}input_layernorm.weight": ("BF16", (hidden,)),
        f"{prefix}post_attention_layernorm.weight": ("BF16", (hidden,)),
        f"{prefix}hidden_norm.weight": ("BF16", (hidden,)),
        "fc.weight": ("BF16", (hidden, fc_mult * target_hidden)),
        "norm.weight": ("BF16", (hidden,)),
        "lm_head.weight": ("BF16", (draft_vocab, hidden)),
    }
    data = {}
    sel = selection if selection is not None else vocab_selection(draft_vocab, vocab)
    if with_d2t:
        fmt = "q" if d2t_dtype == "I64" else "i"
        specs["d2t"] = (d2t_dtype, (draft_vocab,))
        data["d2t"] = struct.pack(f"<{draft_vocab}{fmt}", *[t - i for i, t in enumerate(sel)])
    if with_t2d:
        specs["t2d"] = ("BOOL", (vocab,))
        mask = bytearray(vocab)
        for t in sel:
            mask[t] = 1
        data["t2d"] = bytes(mask)
    return specs, data


def drafter_config(**over) -> dict:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
           "target_hidden_size": HIDDEN, "intermediate_size": 12288, "num_hidden_layers": 1,
           "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128, "vocab_size": TARGET_VOCAB,
           "draft_vocab_size": DRAFT_VOCAB, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
           "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True},
           "torch_dtype": "bfloat16"}
    for k, v in over.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def write_drafter(path: Path, config: dict | None = None, **tensor_kw) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or drafter_config(), indent=2))
    specs, data = drafter_tensors(**tensor_kw)
    write_sparse(path / "model.safetensors", specs, data)
    return path


def write_model(path: Path, config: dict, shards: int = 3, random_bytes: int = 1 << 20, hole_bytes: int = 64 << 20,
                seed: int = 0) -> Path:
    """A sharded checkpoint with an index: each shard holds one tensor of random bytes and one sparse (hole)
    tensor, so copies can be checked byte for byte while the files stay cheap on disk."""
    import random
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    weight_map, total = {}, 0
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        dense, sparse = f"model.layers.{i}.mlp.experts.weight_packed", f"model.layers.{i}.self_attn.kv_b_proj.weight"
        specs = {dense: ("U8", (random_bytes,)), sparse: ("BF16", (hole_bytes // 2,))}
        write_sparse(path / name, specs, {dense: rng.randbytes(random_bytes)})
        weight_map.update({dense: name, sparse: name})
        total += random_bytes + hole_bytes
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return path
