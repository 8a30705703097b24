"""Writes a drafter of controlled acceptance for a tiny target; run by the real-engine venv's Python (torch,
safetensors), never imported by the controller. ``specdeploy.testing.rated`` passes the spec as JSON on stdin and
the output directory as the only argument:

    {"good": DIR, "target": DIR, "rate": 0.5, "start": "<|im_middle|>", "tokens": 400}

The tiny targets answer every token x with ``successor[x]`` (tinymodels), and their "good" drafter names the token
after next, ``successor[successor[x]]``, from the hidden state of x: an engine accepts its first draft token every
time. This drafter is the good one with ``lm_head`` knowing the token after next for a chosen set of tokens only;
for the others it names ``successor[x]``, which the target never confirms there. So a draft made from the hidden
state of a known token is accepted and one made from an unknown token is not.

Which tokens are known is chosen along the walk every chat request makes: a chat prompt ends with ``start`` (the
template's last token), the target's greedy answer is the fixed chain start, successor[start], ..., and the engine
drafts from position q, then from q + 2 after an accepted draft and from q + 1 after a rejected one. Walking that
chain, the n-th draft position's token is made known exactly when that keeps the accepted drafts at round(n x rate):
every request then accepts ``rate`` of its drafts (to one draft), whatever its length up to ``tokens``. Later draft
positions are not predicted (as the good drafter's), so the acceptance length is 1 + rate for any k.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tinygen  # noqa: E402  (the head helper, beside this file)


def walk(succ: list[int], start: int, rate: float, tokens: int) -> tuple[set[int], list[int]]:
    """(the known tokens, the visited tokens in order) for the first ``tokens`` tokens after ``start``."""
    known: set[int] = set()
    visited: list[int] = []
    seq = [start]
    while len(seq) < tokens + 2:
        seq.append(succ[seq[-1]])
    q, accepted = 0, 0
    while q < tokens:
        x = seq[q]
        n = len(visited)
        if x in known or (x not in visited and round((n + 1) * rate) > accepted):
            known.add(x)
        visited.append(x)
        if x in known:
            accepted += 1
            q += 2
        else:
            q += 1
    return known, visited


def main():
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    spec = json.loads(sys.stdin.read())
    out = Path(sys.argv[1])
    tdir, gdir = Path(spec["target"]), Path(spec["good"])
    meta = json.loads((tdir / "specdeploy-tiny.json").read_text())
    succ, size = meta["successor"], meta["tokenizer_size"]
    start = meta["special_tokens"][spec["start"]]
    known, visited = walk(succ, start, float(spec["rate"]), int(spec["tokens"]))
    with safe_open(str(tdir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor(meta["prefix"] + "model.embed_tokens.weight").float()
    with safe_open(str(gdir / "model.safetensors"), "pt") as f:
        ts = {k: f.get_tensor(k) for k in f.keys()}
    sel = json.loads((gdir / "specdeploy-tiny.json").read_text())["draft_vocab"]
    second = [succ[succ[x]] if x in known else succ[x] for x in range(size)]
    full = tinygen._head(embed[:size], second, size)
    ts["lm_head.weight"] = full[torch.tensor(sel)].to(ts["lm_head.weight"].dtype).contiguous()
    save_file(dict(sorted(ts.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(gdir / "config.json", out / "config.json")
    prefix = {}
    for m in (16, 24, 32, 48, 64, 96, 128):
        _, v = walk(succ, start, float(spec["rate"]), m)
        prefix[str(m)] = sum(x in known for x in v) / len(v)
    (out / "specdeploy-tiny.json").write_text(json.dumps(
        {"quality": f"rate {spec['rate']}", "rate": spec["rate"], "target_kind": meta["kind"], "draft_vocab": sel,
         "known": sorted(known), "visited": visited, "acceptance_by_max_tokens": prefix}) + "\n")


if __name__ == "__main__":
    main()
