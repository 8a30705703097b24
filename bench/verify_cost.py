"""Decode against verify step time of one Kimi-K2-shaped MoE layer on one GPU, against the roofline.

Builds one layer in bf16 (MLA projections q_a, q_b, kv_a, kv_b, o; the router; one shared expert; 384 routed
experts of width 2048, top-8, hidden 7168; about 34 GB), draws routing samples (uniform: each token picks 8 of
384 at random; local: each draft position keeps a fraction of the previous position's experts and draws the
rest from the others), captures one CUDA graph per sample and replays them round-robin in a shuffled order
each round, so decode and verify of every batch are interleaved. Reports per batch and k the verify / decode
ratio (median over rounds of the per-round ratio of sample means, with min-max), an A/A line (two captures of
the same decode samples), the achieved bandwidth, and the roofline's prediction from specdeploy.speculation.verifycost
(both from the expected distinct experts and from the sampled ones). Writes verify_cost.json and
verify_cost.png under --out.

    PYTHONPATH=src python3 bench/verify_cost.py --out /tmp/vc          # on a GPU with >= 40 GB free
    PYTHONPATH=src python3 bench/verify_cost.py --parts experts ...    # routed experts only, no fixed weights

Needs torch and matplotlib; weights only (no KV cache, no attention over context), as the roofline's
default.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # specdeploy, for the analysis


H, E, K, F = 7168, 384, 8, 2048
HEADS, QL, KVL, NOPE, ROPE, VD = 64, 1536, 512, 128, 64, 128


def build(torch, parts: str):
    dev, dt = "cuda", torch.bfloat16

    def w(*shape):
        return (torch.randn(*shape, device=dev, dtype=dt) * 0.02)
    p = {"w13": w(E, 2 * F, H), "w2": w(E, H, F)}
    if parts == "all":
        p.update(q_a=w(QL, H), q_b=w(HEADS * (NOPE + ROPE), QL), kv_a=w(KVL + ROPE, H),
                 kv_b=w(HEADS * (NOPE + VD), KVL), o=w(H, HEADS * VD), router=w(E, H),
                 s13=w(2 * F, H), s2=w(H, F))
    return p


def layer(torch, p, x, plan):
    """``plan``: [(expert, index tensor of its tokens)] for the touched experts."""
    F_ = torch.nn.functional
    h = x
    if "q_a" in p:
        q = (x @ p["q_a"].T) @ p["q_b"].T
        kv = x @ p["kv_a"].T
        _ = kv[:, :KVL] @ p["kv_b"].T
        h = x + q[:, :HEADS * VD] @ p["o"].T  # a stand-in for the attention output: the weights are what counts
        _ = h @ p["router"].T
        g = h @ p["s13"].T
        out = (F_.silu(g[:, :F]) * g[:, F:]) @ p["s2"].T
    else:
        out = torch.zeros_like(x)
    for e, idx in plan:
        xe = h.index_select(0, idx)
        g = xe @ p["w13"][e].T
        out.index_add_(0, idx, (F_.silu(g[:, :F]) * g[:, F:]) @ p["w2"][e].T)
    return out


def sample(rng: random.Random, batch: int, positions: int, locality: float | None) -> list[list[int]]:
    """Expert ids per token, sequence-major (token b * positions + j)."""
    keep = round((locality or 0) * K)
    toks = []
    for _ in range(batch):
        prev = rng.sample(range(E), K)
        toks.append(prev)
        for _ in range(positions - 1):
            if locality is None:
                prev = rng.sample(range(E), K)
            else:
                kept = rng.sample(prev, keep)
                others = [e for e in range(E) if e not in prev]
                prev = kept + rng.sample(others, K - keep)
            toks.append(prev)
    return toks


def plan_of(torch, toks):
    by = {}
    for t, ids in enumerate(toks):
        for e in ids:
            by.setdefault(e, []).append(t)
    return [(e, torch.tensor(v, device="cuda")) for e, v in sorted(by.items())]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--ks", default="1,2,3,4")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--replays", type=int, default=3, help="graph replays per timing")
    ap.add_argument("--locality", type=float, default=0.75)
    ap.add_argument("--parts", choices=("all", "experts"), default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("verify_cost"))
    ap.add_argument("--analyze", type=Path, help="a verify_cost_raw.json: analyse it (no GPU needed)")
    a = ap.parse_args()
    if a.analyze:
        return analyze(json.loads(a.analyze.read_text()), a.out)
    import torch
    batches = [int(x) for x in a.batches.split(",")]
    ks = [int(x) for x in a.ks.split(",")]
    rng = random.Random(a.seed)
    torch.manual_seed(a.seed)
    t0 = time.time()
    p = build(torch, a.parts)
    pool = torch.cuda.graph_pool_handle()
    graphs, distinct = {}, {}
    # one graph per (kind, batch, k, sample); kind: decode, aa (the same decode samples captured again),
    # uniform, local
    for b in batches:
        dec = [sample(rng, b, 1, None) for _ in range(a.samples)]
        todo = [("decode", 0, dec), ("aa", 0, dec)]
        for k in ks:
            todo.append(("uniform", k, [sample(rng, b, k + 1, None) for _ in range(a.samples)]))
            todo.append(("local", k, [sample(rng, b, k + 1, a.locality) for _ in range(a.samples)]))
        for kind, k, samples in todo:
            for s, toks in enumerate(samples):
                x = torch.randn(len(toks), H, device="cuda", dtype=torch.bfloat16)
                plan = plan_of(torch, toks)
                layer(torch, p, x, plan)  # warm-up outside capture (cuBLAS workspaces)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    layer(torch, p, x, plan)
                graphs[(kind, b, k, s)] = (g, x, plan)
                distinct[(kind, b, k, s)] = len(plan)
    torch.cuda.synchronize()
    t_capture = time.time() - t0
    keys = list(graphs)
    times = {key: [] for key in keys}
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for rnd in range(a.rounds + 1):  # round 0 warms up and is dropped
        order = keys[:]
        rng.shuffle(order)
        for key in order:
            g = graphs[key][0]
            ev0.record()
            for _ in range(a.replays):
                g.replay()
            ev1.record()
            ev1.synchronize()
            if rnd:
                times[key].append(ev0.elapsed_time(ev1) / a.replays)
    t_total = time.time() - t0
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "parts": a.parts, "samples": a.samples,
            "rounds": a.rounds, "replays": a.replays, "locality": a.locality, "seed": a.seed, "batches": batches,
            "ks": ks, "capture_s": t_capture, "total_s": t_total, "argv": sys.argv[1:]}
    raw = {"meta": meta, "graphs": [{"kind": kd, "batch": b, "k": k, "sample": s, "distinct": distinct[(kd, b, k, s)],
                                     "ms": times[(kd, b, k, s)]} for (kd, b, k, s) in keys]}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "verify_cost_raw.json").write_text(json.dumps(raw) + "\n")
    print(json.dumps(meta))
    try:
        import specdeploy.speculation.verifycost  # noqa: F401
    except ImportError:
        print(f"wrote {a.out / 'verify_cost_raw.json'}; analyse it with --analyze where specdeploy is importable")
        return 0
    return analyze(raw, a.out)


def analyze(raw: dict, out: Path) -> int:
    """Ratios, spreads, the A/A line and the roofline's prediction from a raw measurement."""
    from specdeploy.speculation.verifycost import distinct_experts, peaks, shape_from_config, step
    meta = raw["meta"]
    batches, ks, n_s, n_r, loc = meta["batches"], meta["ks"], meta["samples"], meta["rounds"], meta["locality"]
    times = {(g["kind"], g["batch"], g["k"], g["sample"]): g["ms"] for g in raw["graphs"]}
    distinct = {(g["kind"], g["batch"], g["k"], g["sample"]): g["distinct"] for g in raw["graphs"]}
    cfg_path = Path(__file__).resolve().parents[1] / "examples/models/kimi-k2.5-int4/config.json"
    shape = shape_from_config(json.loads(cfg_path.read_text()), str(cfg_path)).one_moe_layer(16.0)
    if meta["parts"] == "experts":
        shape = replace(shape, attn_params=0, shared_params=0, router_params=0)
    hw = peaks("h200_nvl8", gpus=1)

    def mean_at(kind, b, k, r):
        return statistics.mean(times[(kind, b, k, s)][r] for s in range(n_s))

    def ms(kind, b, k):
        return statistics.median(mean_at(kind, b, k, r) for r in range(n_r))

    def dist(kind, b, k):
        return statistics.mean(distinct[(kind, b, k, s)] for s in range(n_s))

    rows = []
    for b in batches:
        d_dec, t_dec = dist("decode", b, 0), ms("decode", b, 0)
        dec_step = step(shape, hw, b, 1, d_dec)
        exp_dec = step(shape, hw, b, 1, distinct_experts(E, K, b, 1, None)).seconds
        lines = [("A/A", 0, "aa")] + [(r, k, r) for k in ks for r in ("uniform", "local")]
        for routing, k, kind in lines:
            rs = [mean_at(kind, b, k, r) / mean_at("decode", b, 0, r) for r in range(n_r)]
            d_ver, t_ver = dist(kind, b, k), ms(kind, b, k)
            ver_step = step(shape, hw, b, k + 1 if k else 1, d_ver)
            if kind == "aa":
                pred_exp = 1.0
            else:
                d_exp = distinct_experts(E, K, b, k + 1, None if routing == "uniform" else loc)
                pred_exp = step(shape, hw, b, k + 1, d_exp).seconds / exp_dec
            rows.append({"batch": b, "k": k, "routing": routing, "ratio": statistics.median(rs),
                         "ratio_min": min(rs), "ratio_max": max(rs), "decode_ms": t_dec, "verify_ms": t_ver,
                         "distinct_decode": d_dec, "distinct_verify": d_ver,
                         "pred_sampled": ver_step.seconds / dec_step.seconds, "pred_expected": pred_exp,
                         "decode_gbs": dec_step.bytes / t_dec / 1e6, "verify_gbs": ver_step.bytes / t_ver / 1e6})
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_cost.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"{'B':>3} {'k':>2} {'routing':8} {'ratio':>6} {'min-max':>11} {'roofline':>8} {'(expected)':>10} "
          f"{'decode ms':>9} {'verify ms':>9} {'distinct':>13} {'GB/s dec/ver':>13}")
    for r in rows:
        print(f"{r['batch']:>3} {r['k']:>2} {r['routing']:8} {r['ratio']:6.2f} "
              f"{r['ratio_min']:5.2f}-{r['ratio_max']:<5.2f} {r['pred_sampled']:8.2f} {r['pred_expected']:10.2f} "
              f"{r['decode_ms']:9.3f} {r['verify_ms']:9.3f} "
              f"{r['distinct_decode']:6.1f}/{r['distinct_verify']:6.1f} {r['decode_gbs']:6.0f}/{r['verify_gbs']:<6.0f}")
    chart(rows, batches, out / "verify_cost.png", meta["parts"])
    return 0


def chart(rows, batches, out: Path, parts: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, routing in zip(axes, ("uniform", "local")):
        for i, b in enumerate(batches):
            rs = [r for r in rows if r["batch"] == b and r["routing"] == routing]
            c = f"C{i}"
            ks = [r["k"] for r in rs]
            ax.errorbar(ks, [r["ratio"] for r in rs], yerr=[[r["ratio"] - r["ratio_min"] for r in rs],
                                                            [r["ratio_max"] - r["ratio"] for r in rs]],
                        marker="o", color=c, label=f"B={b} measured")
            ax.plot(ks, [r["pred_sampled"] for r in rs], ls="--", color=c, label=f"B={b} roofline")
        ax.set_title(f"{routing} routing ({parts})")
        ax.set_xlabel("k (draft tokens)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("T_verify(B x (k+1)) / T_decode(B)")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
