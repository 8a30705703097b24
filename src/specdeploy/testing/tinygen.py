"""Writes one tiny model artifact; run by the real-engine venv's Python (torch, tokenizers, safetensors), never
imported by the controller. ``specdeploy.testing.tinymodels`` passes the spec as JSON on stdin:

    {"what": "target", "kind": ..., "config": {...}, "text": {...}, "dtype": ..., "prefix": ..., "seed": ...}
    {"what": "drafter", "quality": ..., "target": DIR, "config": {...}, "seed": ...}

and the output directory as the only argument.

The target's greedy next token is a function of the current token alone: every decoder layer's output
projections (attention ``o_proj``, MLP and expert ``down_proj``) are zero, so the residual stream at every layer
is the token's embedding, and ``lm_head`` maps the normed embedding of token ``x`` to ``successor[x]`` (one
cycle over the regular tokens; special tokens map into it). The margin is large (logit 16 against about 3), so
the choice survives bf16.

A "good" EAGLE-3 drafter gets, at position i, the target's aux hidden states of token i (its embedding, at
every tap) and the embedding of token i+1; it must name token i+2 = successor(successor(token i)). Its fc takes
the first tap unchanged, its own output projections are zero, and its lm_head maps that embedding to the second
successor: its first draft token is always the target's. A "random" drafter has random weights throughout.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

WORDS = ("the of and to in is that for it as with was on be by this are at from or have an they which one "
         "you were all we her she there would their will when who him been has more if no out so said what up "
         "its about than into them can only other new some could time these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where "
         "much your way well down should because each just those people how too little state good very make "
         "world still own see men work long get here between both life being under never day same another know "
         "while last might us great old year off come since against go came right used take three speculative "
         "decoding drafter target engine token expert layer attention latent rank verify accept reject kimi "
         "deepseek llama moe mla eagle cache batch prefill decode").split()


def _corpus(seed: int) -> list[str]:
    import random
    rng = random.Random(seed)
    lines = [bytes(range(32, 127)).decode(), "".join(chr(c) for c in range(160, 400))]
    for _ in range(4000):
        n = rng.randint(4, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(n), str(rng.randint(0, 99999)))
        line = " ".join(words)
        lines.append(line.capitalize() + rng.choice(".,;?!:"))
    return lines


def _tokenizer(out: Path, spec: dict) -> dict:
    """A byte-level BPE tokenizer trained on a seeded corpus: tokenizer.json, tokenizer_config.json with a chat
    template, special_tokens_map.json. Returns {special name: id} and the size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    specials = spec["special_tokens"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec["vocab_size"], special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1)
    tok.train_from_iterator(_corpus(spec["seed"]), trainer=trainer)
    size = tok.get_vocab_size()
    if size != spec["vocab_size"]:
        raise SystemExit(f"tokenizer trained to {size} tokens, not {spec['vocab_size']}")
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in specials}
    roles = spec["roles"]
    added = {str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for s in specials}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added,
           "bos_token": roles["bos"], "eos_token": roles["eos"], "pad_token": roles["pad"],
           "unk_token": None, "model_max_length": spec["model_max_length"], "clean_up_tokenization_spaces": False,
           "chat_template": spec["chat_template"]}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": roles["bos"], "eos_token": roles["eos"], "pad_token": roles["pad"]}, indent=2) + "\n")
    return {"ids": ids, "size": size}


def _dtype(name: str):
    import torch
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _unit_rows(e):
    return e / e.norm(dim=-1, keepdim=True)


def _head(embed, mapping: list[int], rows: int, scale: float = 1.0):
    """lm_head rows: row y = sum of the unit embeddings of the tokens x with mapping[x] == y (zero rows elsewhere)."""
    import torch
    unit = _unit_rows(embed.float())
    head = torch.zeros(rows, embed.shape[1])
    head.index_add_(0, torch.tensor(mapping), unit[: len(mapping)])
    return head * scale


def _successor(size: int, specials: list[int], g) -> list[int]:
    """One cycle over the regular tokens; each special token maps to a regular one."""
    import torch
    regular = [i for i in range(size) if i not in set(specials)]
    order = [regular[i] for i in torch.randperm(len(regular), generator=g).tolist()]
    succ = [0] * size
    for a, b in zip(order, order[1:] + order[:1]):
        succ[a] = b
    for s in specials:
        succ[s] = order[int(torch.randint(len(order), (1,), generator=g))]
    return succ


def _llama_layer(t: dict, p: str, g, std: float, out: dict):
    import torch

    def w(*shape):
        return torch.randn(*shape, generator=g) * std
    h, hd = t["hidden_size"], t["head_dim"]
    nq, nkv, inter = t["num_attention_heads"], t["num_key_value_heads"], t["intermediate_size"]
    out[p + "self_attn.q_proj.weight"] = w(nq * hd, h)
    out[p + "self_attn.k_proj.weight"] = w(nkv * hd, h)
    out[p + "self_attn.v_proj.weight"] = w(nkv * hd, h)
    out[p + "self_attn.o_proj.weight"] = torch.zeros(h, nq * hd)
    out[p + "mlp.gate_proj.weight"] = w(inter, h)
    out[p + "mlp.up_proj.weight"] = w(inter, h)
    out[p + "mlp.down_proj.weight"] = torch.zeros(h, inter)
    out[p + "input_layernorm.weight"] = torch.ones(h)
    out[p + "post_attention_layernorm.weight"] = torch.ones(h)


def _mla_layer(t: dict, i: int, p: str, g, std: float, out: dict):
    import torch

    def w(*shape):
        return torch.randn(*shape, generator=g) * std
    h, nh = t["hidden_size"], t["num_attention_heads"]
    nope, rope, vd = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    kvl, ql = t["kv_lora_rank"], t.get("q_lora_rank")
    a = p + "self_attn."
    if ql:
        out[a + "q_a_proj.weight"] = w(ql, h)
        out[a + "q_a_layernorm.weight"] = torch.ones(ql)
        out[a + "q_b_proj.weight"] = w(nh * (nope + rope), ql)
    else:
        out[a + "q_proj.weight"] = w(nh * (nope + rope), h)
    out[a + "kv_a_proj_with_mqa.weight"] = w(kvl + rope, h)
    out[a + "kv_a_layernorm.weight"] = torch.ones(kvl)
    out[a + "kv_b_proj.weight"] = w(nh * (nope + vd), kvl)
    out[a + "o_proj.weight"] = torch.zeros(h, nh * vd)
    out[p + "input_layernorm.weight"] = torch.ones(h)
    out[p + "post_attention_layernorm.weight"] = torch.ones(h)
    m = p + "mlp."

    def ffn(prefix, inter):
        out[prefix + "gate_proj.weight"] = w(inter, h)
        out[prefix + "up_proj.weight"] = w(inter, h)
        out[prefix + "down_proj.weight"] = torch.zeros(h, inter)
    if i < t["first_k_dense_replace"]:
        ffn(m, t["intermediate_size"])
        return
    ne, mi = t["n_routed_experts"], t["moe_intermediate_size"]
    out[m + "gate.weight"] = w(ne, h)
    out[m + "gate.e_score_correction_bias"] = torch.zeros(ne)
    for e in range(ne):
        ffn(f"{m}experts.{e}.", mi)
    ffn(m + "shared_experts.", mi * t["n_shared_experts"])


def target(out: Path, spec: dict):
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(spec["seed"])
    tk = _tokenizer(out, spec["tokenizer"])
    t, std = spec["text"], 0.02
    specials = sorted(tk["ids"].values())
    succ = _successor(tk["size"], specials, g)
    embed = torch.randn(t["vocab_size"], t["hidden_size"], generator=g) * std
    ts: dict = {"model.embed_tokens.weight": embed}
    for i in range(t["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if spec["family"] == "llama":
            _llama_layer(t, p, g, std, ts)
        else:
            _mla_layer(t, i, p, g, std, ts)
    ts["model.norm.weight"] = torch.ones(t["hidden_size"])
    ts["lm_head.weight"] = _head(embed, succ, t["vocab_size"])
    dt = _dtype(spec["dtype"])
    ts = {spec["prefix"] + k: v.to(dt).contiguous() for k, v in sorted(ts.items())}
    save_file(ts, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(spec["config"], indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(spec["generation"], indent=2) + "\n")
    for name, text in spec.get("files", {}).items():
        (out / name).write_text(text)
    meta = {"kind": spec["kind"], "successor": succ, "special_tokens": tk["ids"], "tokenizer_size": tk["size"],
            "prefix": spec["prefix"]}
    (out / "specdeploy-tiny.json").write_text(json.dumps(meta) + "\n")


def drafter(out: Path, spec: dict):
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    tdir = Path(spec["target"])
    meta = json.loads((tdir / "specdeploy-tiny.json").read_text())
    with safe_open(str(tdir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor(meta["prefix"] + "model.embed_tokens.weight").float()
    c = spec["config"]
    g = torch.Generator().manual_seed(spec["seed"])
    h, th, hd = c["hidden_size"], c["target_hidden_size"], c["head_dim"]
    nq, nkv, inter = c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    succ = meta["successor"]
    specials = set(meta["special_tokens"].values())
    sel = [i for i in range(meta["tokenizer_size"]) if i not in specials]  # the draft vocabulary: regular tokens
    if len(sel) != c["draft_vocab_size"]:
        raise SystemExit(f"draft vocabulary of {len(sel)} tokens, config says {c['draft_vocab_size']}")
    std = 0.02

    def w(*shape):
        return torch.randn(*shape, generator=g) * std
    good = spec["quality"] == "good"
    p = "layers.0."
    ts = {p + "self_attn.q_proj.weight": w(nq * hd, 2 * h), p + "self_attn.k_proj.weight": w(nkv * hd, 2 * h),
          p + "self_attn.v_proj.weight": w(nkv * hd, 2 * h),
          p + "self_attn.o_proj.weight": torch.zeros(h, nq * hd) if good else w(h, nq * hd),
          p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
          p + "mlp.down_proj.weight": torch.zeros(h, inter) if good else w(h, inter),
          p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
          p + "hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h)}
    n_aux = len(c["eagle_aux_hidden_state_layer_ids"])
    if good:
        fc = torch.zeros(h, n_aux * th)
        fc[:, :th] = torch.eye(h, th)  # the first tap, unchanged: the embedding of token i
        second = [succ[succ[x]] for x in range(meta["tokenizer_size"])]
        full = _head(embed[: meta["tokenizer_size"]], second, meta["tokenizer_size"])
        head = full[torch.tensor(sel)]
        ts["embed_tokens.weight"] = embed
    else:
        fc = w(h, n_aux * th)
        head = w(len(sel), h)
        ts["embed_tokens.weight"] = w(*embed.shape)
    ts["fc.weight"] = fc
    ts["lm_head.weight"] = head
    dt = _dtype(spec["dtype"])
    ts = {k: v.to(dt).contiguous() for k, v in ts.items()}
    ts["d2t"] = torch.tensor([t - i for i, t in enumerate(sel)], dtype=torch.int64)
    t2d = torch.zeros(c["vocab_size"], dtype=torch.bool)
    t2d[torch.tensor(sel)] = True
    ts["t2d"] = t2d
    save_file(dict(sorted(ts.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    (out / "specdeploy-tiny.json").write_text(json.dumps(
        {"quality": spec["quality"], "target_kind": meta["kind"], "draft_vocab": sel}) + "\n")


def main():
    spec = json.loads(sys.stdin.read())
    out = Path(sys.argv[1])
    {"target": target, "drafter": drafter}[spec["what"]](out, spec)


if __name__ == "__main__":
    main()
