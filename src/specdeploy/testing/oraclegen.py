"""Writes the acceptance oracle's target and drafter variants; run by the real-engine venv's Python (torch,
tokenizers, safetensors), never imported by the controller. ``specdeploy.testing.oracle`` passes the spec as JSON
on stdin and the output directory as the only argument:

    {"what": "target", "config": {...}, "seed": ..., "tokenizer": {...}}
    {"what": "drafters", "target": DIR, "variants": [{"name", "head", "config", "edits", "d2t", "t2d"}, ...]}

The target (8 Llama layers, float32) keeps a constant in dimension 0 and the token's embedding ``s * u(x)`` in
the 127 dimensions after it (its subspace S). Each layer's MLP rotates S by its own orthogonal matrix ``Q_l`` (the
gate reads the constant, so the MLP is linear in its normed input, and every state has the same norm), and its
attention writes nothing. The input of layer L (what vLLM captures as aux layer L) is ``[c, s P_L u(x), 0]`` with
``P_L = Q_{L-1} ... Q_0``: each tap is the token seen through a different rotation, so a drafter that undoes the
rotation of one layer reads garbage from any other. ``lm_head`` maps the last state to ``successor[x]``.

A drafter ("head") is an EAGLE-3 Llama head that names ``successor[successor[x]]`` (the target's token after
next) at draft position 0, and only when the engine feeds it what it was trained on:

- ``fc`` undoes the rotation of each trained tap and adds ``K M_j (v_1 - v_j)`` for taps 2 and 3: the terms
  cancel when every tap is the trained one and swamp the signal when any is not (an off-by-one tap included);
- trained with ``norm_before_fc`` / ``fc_norm``, the norms' weights carry random signs that ``fc`` undoes, so a
  release that does not apply them feeds ``fc`` the wrong signs;
- the attention carries one constant, read from dimension 0 of ``input_layernorm(embeds)`` and of
  ``hidden_norm(hidden)``, whose trained weights there are -1: ``v_proj``/``o_proj`` write it to dimension 128
  (any attention pattern gives the same value); the MLP, gated by dimension 0 of ``post_attention_layernorm``
  (weight -1), writes a second constant to dimension 129; ``lm_head``'s rows cancel both constants through
  dimension 0, so a norm left at its initial ones, or a missing projection, leaves a bias that names the same token
  whatever the input;
- the final ``norm``'s weights carry random signs that ``lm_head`` undoes; ``d2t`` maps the draft vocabulary
  (the regular tokens and ``<|im_end|>``) to target ids;
- a head trained without aux states (``use_aux_hidden_state: false``) has no ``fc`` and reads the target's
  last (normed) hidden state, rotated by all eight layers.

Later draft positions are not predicted (the carried state has no ``fc`` to undo the rotation). Before writing,
the generator runs the head's forward (its own few lines of the same arithmetic) over every regular token and
refuses a construction that does not name the token after next.

Edits applied to a trained head's tensors (``edits``): ``drop`` names, ``rename`` old -> new, ``random`` (a tensor
replaced by random values of its shape), ``add_fc`` (a random fc for a head that has none), ``zero_rows`` of
``lm_head``; the config is the controller's, as given.
"""
from __future__ import annotations

import json
import math
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinygen  # noqa: E402  (the tokenizer and the head helper, beside this file)

H = 256          # hidden size of target and drafter
S = list(range(1, 128))  # the signal subspace
N0 = len(S)
ATTN_DIM, MLP_DIM = 128, 129
C = SIG = 8.0    # constant and embedding scale: |state|^2 = 128, rms = 1/sqrt(2)
Z = 20.0         # the MLP gates' pre-activation (silu(20) = 20 within 5e-8)
K = 3.0          # tap cancellation gain
BIAS = 4.0       # the attention and MLP constants, in units of the signal's scale
LOGIT = 16.0


def _silu(z: float) -> float:
    return z / (1.0 + math.exp(-z))


def _orth(n: int, g):
    import torch
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _units(n: int, g):
    import torch
    u = torch.randn(n, N0, generator=g, dtype=torch.float64)
    return u / u.norm(dim=1, keepdim=True)


def _rms(v):
    return float(v.pow(2).mean().sqrt())


def _save(ts: dict, path: Path, dtype: str):
    import torch
    from safetensors.torch import save_file
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    out = {k: (v if v.dtype in (torch.int64, torch.bool) else v.to(dt)).contiguous() for k, v in sorted(ts.items())}
    save_file(out, str(path), metadata={"format": "pt"})


# --- the target -----------------------------------------------------------------------------------------------
def _target_parts(spec: dict):
    """(embedding unit vectors u [vocab, N0], rotations Q_l) from the target's seed."""
    import torch
    g = torch.Generator().manual_seed(spec["seed"])
    t = spec["config"]
    u = _units(t["vocab_size"], g)
    qs = [_orth(N0, g) for _ in range(t["num_hidden_layers"])]
    return u, qs


def target(out: Path, spec: dict):
    import torch
    t = spec["config"]
    tk = tinygen._tokenizer(out, spec["tokenizer"])
    specials = sorted(tk["ids"].values())
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    succ = tinygen._successor(tk["size"], specials, g)
    u, qs = _target_parts(spec)
    vocab, inter = t["vocab_size"], t["intermediate_size"]
    embed = torch.zeros(vocab, H, dtype=torch.float64)
    embed[:, 0] = C
    embed[:, S] = SIG * u
    ts = {"model.embed_tokens.weight": embed}
    rms = math.sqrt((C * C + SIG * SIG) / H)
    gw = torch.Generator().manual_seed(spec["seed"] + 2)
    for i, q in enumerate(qs):
        p = f"model.layers.{i}."
        tinygen._llama_layer(t, p, gw, 0.02, ts)  # random q/k/v, zero o_proj and down_proj, unit norms
        gate = torch.zeros(inter, H, dtype=torch.float64)
        gate[:, 0] = Z * rms / C           # every unit's gate: Z from the constant
        up = torch.zeros(inter, H, dtype=torch.float64)
        up[:N0][:, S] = (q - torch.eye(N0, dtype=torch.float64))
        down = torch.zeros(H, inter, dtype=torch.float64)
        down[S, :N0] = torch.eye(N0, dtype=torch.float64) * rms / _silu(Z)
        ts[p + "mlp.gate_proj.weight"], ts[p + "mlp.up_proj.weight"], ts[p + "mlp.down_proj.weight"] = gate, up, down
    ts["model.norm.weight"] = torch.ones(H)
    last = _chain(qs, len(qs))
    head = torch.zeros(vocab, H, dtype=torch.float64)
    rot = (u @ last.T)  # P_N u(x), unit rows
    head[:, S] = tinygen._head(rot, succ, vocab).double() * LOGIT / (SIG / rms)
    ts["lm_head.weight"] = head
    _save(ts, out / "model.safetensors", t["torch_dtype"])
    (out / "config.json").write_text(json.dumps(t, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(spec["generation"], indent=2) + "\n")
    meta = {"kind": "oracle", "successor": succ, "special_tokens": tk["ids"], "tokenizer_size": tk["size"],
            "prefix": ""}
    (out / "specdeploy-tiny.json").write_text(json.dumps(meta) + "\n")


def _chain(qs, n: int):
    """P_n = Q_{n-1} ... Q_0 (the rotation the input of layer n carries)."""
    import torch
    p = torch.eye(N0, dtype=torch.float64)
    for q in qs[:n]:
        p = q @ p
    return p


# --- the heads ------------------------------------------------------------------------------------------------
def _head_tensors(tspec: dict, head: dict, cfg: dict, succ: list[int], draft: list[int]):
    """The trained head's tensors (float64) and a function that runs its forward for the self-check."""
    import torch
    u, qs = _target_parts(tspec)
    g = torch.Generator().manual_seed(head["seed"])
    inter, nh, hd = cfg["intermediate_size"], cfg["num_attention_heads"], cfg["head_dim"]
    nkv = cfg["num_key_value_heads"]
    taps = head.get("taps")
    ts: dict = {}

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * 0.02

    def sign(n):
        return torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()

    rms_in = math.sqrt((C * C + SIG * SIG) / H)  # every tap, and the fused three
    if taps is not None:
        m1, m2 = _orth(N0, g), _orth(N0, g)
        rots = [_chain(qs, t) for t in taps]
        f = torch.zeros(H, 3 * H, dtype=torch.float64)
        blocks = [torch.zeros(N0, N0, dtype=torch.float64) for _ in range(3)]
        eye = torch.eye(N0, dtype=torch.float64)
        blocks[0] += eye + K * m1 + K * m2
        blocks[1] -= K * m1
        blocks[2] -= K * m2
        for j in range(3):
            cols = [j * H + s for s in S]
            f[1:128][:, cols] = blocks[j] @ rots[j].T
        f[0, 0] = 1.0
        scale = torch.ones(3 * H, dtype=torch.float64)
        if head.get("norm_before_fc"):
            w = sign(3 * H)
            ts["input_norm.weight"] = w
            scale = w / rms_in
        elif head.get("fc_norm"):
            for j in range(3):
                w = sign(H)
                ts[f"fc_norm.{j}.weight"] = w
                scale[j * H:(j + 1) * H] = w / rms_in
        ts["fc.weight"] = f / scale  # fc(scale * A) = f(A)
        frame = torch.eye(N0, dtype=torch.float64)
        hid_scale = SIG
    else:
        scale = None
        frame = _chain(qs, len(qs))   # the target's last state, through its final norm (weights 1)
        hid_scale = SIG / rms_in
    p = "layers.0."
    # attention: one constant from dimension 0 of both normed halves, written to ATTN_DIM
    for name, shape in (("q_proj", (nh * hd, 2 * H)), ("k_proj", (nkv * hd, 2 * H))):
        ts[p + f"self_attn.{name}.weight"] = rand(*shape)
    il = torch.ones(H, dtype=torch.float64)
    il[0] = -1.0
    hn = il.clone()
    pa = il.clone()
    ts[p + "input_layernorm.weight"], ts[p + "hidden_norm.weight"] = il, hn
    ts[p + "post_attention_layernorm.weight"] = pa
    emb_rms = rms_in
    hid0 = C if taps is not None else C / rms_in   # dimension 0 of the hidden the head gets
    hid_rms = rms_in if taps is not None else 1.0
    e0, h0 = C / emb_rms * il[0], hid0 / hid_rms * hn[0]   # dimension 0 of each normed half (trained: negative)
    v = torch.zeros(nkv * hd, 2 * H, dtype=torch.float64)
    v[0, 0] = v[0, H] = 1.0
    ts[p + "self_attn.v_proj.weight"] = v
    o = torch.zeros(H, nh * hd, dtype=torch.float64)
    o[ATTN_DIM, 0] = BIAS * SIG / (e0 + h0)
    ts[p + "self_attn.o_proj.weight"] = o
    # the state after attention: the hidden, plus BIAS * SIG at ATTN_DIM
    state = torch.zeros(H, dtype=torch.float64)
    state[0] = hid0
    state[ATTN_DIM] = BIAS * SIG
    sig_norm2 = hid_scale ** 2  # |signal|^2
    r_rms = math.sqrt((float(state.pow(2).sum()) + sig_norm2) / H)
    gate = torch.zeros(inter, H, dtype=torch.float64)
    gate[0, 0] = Z * r_rms / (hid0 * pa[0])
    up = torch.zeros(inter, H, dtype=torch.float64)
    up[0, 0] = r_rms / (hid0 * pa[0])
    down = torch.zeros(H, inter, dtype=torch.float64)
    down[MLP_DIM, 0] = BIAS * SIG / _silu(Z)
    ts[p + "mlp.gate_proj.weight"], ts[p + "mlp.up_proj.weight"], ts[p + "mlp.down_proj.weight"] = gate, up, down
    state[MLP_DIM] = BIAS * SIG
    f_rms = math.sqrt((float(state.pow(2).sum()) + sig_norm2) / H)
    wf = torch.ones(H, dtype=torch.float64)
    wf[:130] = sign(130)
    ts["norm.weight"] = wf
    # lm_head over the draft vocabulary: the signal rows, the two constants' rows cancelled through dimension 0
    second = [succ[succ[x]] for x in range(len(succ))]
    pos = {t: i for i, t in enumerate(draft)}
    mapping = [pos.get(y, -1) for y in second]
    rows = torch.zeros(len(draft), N0, dtype=torch.float64)
    rot = u @ frame.T
    for x, i in enumerate(mapping):
        if i >= 0:
            rows[i] += rot[x]
    rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-9)
    head_w = torch.zeros(len(draft), H, dtype=torch.float64)
    scale_l = LOGIT * f_rms / hid_scale
    head_w[:, S] = rows * scale_l
    r = torch.randn(len(draft), 2, generator=g, dtype=torch.float64) * scale_l / 2
    head_w[:, ATTN_DIM], head_w[:, MLP_DIM] = r[:, 0], r[:, 1]
    head_w[:, 0] = -(BIAS * SIG * (r[:, 0] + r[:, 1])) / hid0
    ts["lm_head.weight"] = head_w / wf  # the norm's signs undone
    if head.get("embed_tokens", True):
        tp = Path(head["target"])
        from safetensors import safe_open
        with safe_open(str(tp / "model.safetensors"), "pt") as fh:
            ts["embed_tokens.weight"] = fh.get_tensor("model.embed_tokens.weight").double()
    return ts, {"u": u, "qs": qs, "taps": taps, "frame": frame}


def _forward(ts: dict, parts: dict, cfg: dict, x: int, y: int, embed) -> int:
    """The head's position-0 prediction (a draft id) for target token x followed by y, fed as trained; the
    attention's value is the same at every position, so it is the output."""
    import torch
    p = "layers.0."
    u, qs, taps = parts["u"], parts["qs"], parts["taps"]
    eps = cfg["rms_norm_eps"]

    def norm(v, w):
        return v / torch.sqrt(v.pow(2).mean() + eps) * w
    if taps is not None:
        a = []
        for t in taps:
            st = torch.zeros(H, dtype=torch.float64)
            st[0] = C
            st[S] = SIG * (_chain(qs, t) @ u[x])
            a.append(st)
        fused = torch.cat(a)
        if "input_norm.weight" in ts:
            fused = norm(fused, ts["input_norm.weight"])
        elif "fc_norm.0.weight" in ts:
            fused = torch.cat([norm(fused[j * H:(j + 1) * H], ts[f"fc_norm.{j}.weight"]) for j in range(3)])
        hid = ts["fc.weight"] @ fused
    else:
        st = torch.zeros(H, dtype=torch.float64)
        st[0] = C
        st[S] = SIG * (_chain(qs, len(qs)) @ u[x])
        hid = norm(st, torch.ones(H, dtype=torch.float64))
    both = torch.cat([norm(embed[y], ts[p + "input_layernorm.weight"]), norm(hid, ts[p + "hidden_norm.weight"])])
    val = ts[p + "self_attn.v_proj.weight"] @ both
    nh = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    att = val.reshape(cfg["num_key_value_heads"], -1).repeat_interleave(nh, 0).reshape(-1)
    res = hid + ts[p + "self_attn.o_proj.weight"] @ att
    n = norm(res, ts[p + "post_attention_layernorm.weight"])
    g = ts[p + "mlp.gate_proj.weight"] @ n
    res = res + ts[p + "mlp.down_proj.weight"] @ (torch.nn.functional.silu(g) * (ts[p + "mlp.up_proj.weight"] @ n))
    return int((ts["lm_head.weight"] @ norm(res, ts["norm.weight"])).argmax())


def _self_check(ts, parts, cfg, succ, draft, regular, embed):
    wrong = [x for x in regular if draft[_forward(ts, parts, cfg, x, succ[x], embed)] != succ[succ[x]]]
    if len(wrong) > len(regular) // 100:
        raise SystemExit(f"the head names the token after next for only {len(regular) - len(wrong)} of "
                         f"{len(regular)} tokens")


def _edit(ts: dict, edits: list, g, cfg: dict):
    import torch
    for e in edits:
        op = e[0]
        if op == "drop":
            for n in e[1:]:
                ts.pop(n, None)
        elif op == "rename":
            for n in [n for n in ts if n.startswith(e[1])]:
                ts[e[2] + n[len(e[1]):]] = ts.pop(n)
        elif op == "random":
            ts[e[1]] = torch.randn(ts[e[1]].shape, generator=g, dtype=torch.float64) * 0.05
        elif op == "add_fc":
            ts["fc.weight"] = torch.randn(H, 3 * H, generator=g, dtype=torch.float64) * 0.02
        elif op == "lm_head_rows":  # a full-vocabulary head: row t for target token t
            rows = torch.zeros(cfg["vocab_size"], H, dtype=torch.float64)
            rows[torch.tensor(e[1])] = ts["lm_head.weight"]
            ts["lm_head.weight"] = rows
        else:
            raise SystemExit(f"unknown edit {op!r}")


def drafters(root: Path, spec: dict):
    import torch
    tdir = Path(spec["target"])
    meta = json.loads((tdir / "specdeploy-tiny.json").read_text())
    tspec = json.loads((tdir / "specdeploy-oracle-spec.json").read_text())
    succ = meta["successor"]
    specials = set(meta["special_tokens"].values())
    regular = [i for i in range(meta["tokenizer_size"]) if i not in specials]
    trained: dict = {}
    from safetensors import safe_open
    with safe_open(str(tdir / "model.safetensors"), "pt") as fh:
        embed = fh.get_tensor("model.embed_tokens.weight").double()
    for v in spec["variants"]:
        head = dict(v["head"], target=str(tdir))
        key = json.dumps(head, sort_keys=True)
        if key not in trained:
            ts, parts = _head_tensors(tspec, head, v["head_config"], succ, v["draft"])
            _self_check(ts, parts, v["head_config"], succ, v["draft"], regular, embed)
            trained[key] = ts
        ts = dict(trained[key])
        g = torch.Generator().manual_seed(zlib.crc32(v["name"].encode()))
        _edit(ts, v["edits"], g, v["config"])
        if v.get("d2t") is not None:
            ts["d2t"] = torch.tensor(v["d2t"], dtype=torch.int64)
        else:
            ts.pop("d2t", None)
        if v.get("t2d") is not None:
            ts["t2d"] = torch.tensor(v["t2d"], dtype=torch.bool)
        else:
            ts.pop("t2d", None)
        out = root / v["name"]
        out.mkdir(parents=True, exist_ok=True)
        _save(ts, out / "model.safetensors", v["config"].get("torch_dtype", "float32"))
        (out / "config.json").write_text(json.dumps(v["config"], indent=1) + "\n")


def main():
    spec = json.loads(sys.stdin.read())
    out = Path(sys.argv[1])
    if spec["what"] == "target":
        target(out, spec)
        (out / "specdeploy-oracle-spec.json").write_text(json.dumps(spec) + "\n")
    else:
        drafters(out, spec)


if __name__ == "__main__":
    main()
