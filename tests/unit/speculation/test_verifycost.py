"""The verification-cost roofline: distinct experts against a Monte-Carlo draw, dense targets near 1, the
Kimi-shaped layer against the measured band, routing traces, bad input, and the CLI."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace

import pytest

from helpers import REPO
from specdeploy.values.errors import SpecdeployError
from specdeploy.speculation.verifycost import (distinct_experts, distinct_uniform, gate_margin, load_target, load_trace,
                                               peaks, predict, shape_from_config)

KIMI = REPO / "examples/models/kimi-k2.5-int4"
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16"}
H200 = peaks("h200_nvl8")


def mc_distinct(e, k, batch, positions, keep, trials, rng):
    """Monte-Carlo draw of the routing models: uniform (keep None) or keeping ``keep`` of the previous
    position's experts."""
    tot = 0
    for _ in range(trials):
        seen = set()
        for _ in range(batch):
            prev = rng.sample(range(e), k)
            seen.update(prev)
            for _ in range(positions - 1):
                if keep is None:
                    prev = rng.sample(range(e), k)
                else:
                    prev = rng.sample(prev, keep) + rng.sample([x for x in range(e) if x not in prev], k - keep)
                seen.update(prev)
        tot += len(seen)
    return tot / trials


@pytest.mark.parametrize("batch, positions, keep", [(1, 4, None), (8, 4, None), (8, 4, 6), (32, 2, 6), (2, 5, 4)])
def test_distinct_experts_match_a_monte_carlo_draw(batch, positions, keep):
    rng = random.Random(1)
    got = distinct_experts(384, 8, batch, positions, None if keep is None else keep / 8)
    mc = mc_distinct(384, 8, batch, positions, keep, 300, rng)
    assert got == pytest.approx(mc, rel=0.02)
    if keep is None:  # the closed form of the brief: E * (1 - (1 - k/E)^n)
        assert got == pytest.approx(384 * (1 - (1 - 8 / 384) ** (batch * positions)))
        assert distinct_uniform(384, 8, batch * positions) == pytest.approx(got)


def test_a_dense_target_verifies_at_about_the_cost_of_a_decode_step():
    shape = shape_from_config(LLAMA_8B)
    assert not shape.moe
    rows = predict(shape, H200, [1, 8], [1, 2, 3, 4], margin=0.1)
    for r in rows:
        assert r.ratio_local == r.ratio_uniform  # no routing: the range collapses
        assert 1.0 <= r.ratio_uniform < 1.3
    # at 64 x 5 tokens an 8B model on 8 H200s crosses the ridge: the compute bound takes over
    big = predict(shape, H200, [64], [4], margin=0.1)[0]
    assert big.bound == "compute" and big.ratio_uniform > 1.3


def test_kimi_layer_brackets_the_measured_band_and_the_int4_target_is_cheaper():
    kimi = load_target(KIMI)
    assert (kimi.experts, kimi.top_k, kimi.moe_layers, kimi.dense_layers) == (384, 8, 60, 1)
    assert kimi.expert_params == 3 * 7168 * 2048 and kimi.shared_params == kimi.expert_params
    assert kimi.bits["experts"] == 4.5 and kimi.bits["attn"] == 16  # int4, group 32, bf16 scales; attention ignored
    assert kimi.attn_params == (7168 * 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168)
    # the measured layer (bf16, MLA + shared + 384 experts): B=8, k=3 measured 1.74 (local) to 3.05 (uniform)
    layer = predict(kimi.one_moe_layer(), peaks("h200_nvl8", 1), [8], [3], margin=0.1)[0]
    assert layer.ratio_local <= 1.74 and round(layer.ratio_uniform, 2) >= 3.05  # the table is rounded to 0.01
    # the int4 target: its experts are 4.5 bits, its attention, shared experts and lm_head 16: the part that
    # grows with tokens weighs less, so the ratio is lower than the bf16 layer's, and still far above a dense 1
    full = predict(kimi, H200, [8], [3], margin=0.1)[0]
    assert 1.3 < full.ratio_local <= 1.74 and 2.5 < full.ratio_uniform < layer.ratio_uniform
    assert full.needed_al_margin[1] == pytest.approx((full.ratio_uniform + full.draft_ratio) * 1.1)
    assert full.reachable
    bf16 = predict(replace(kimi, bits={p: 16.0 for p in kimi.bits}), H200, [8], [3], margin=0.1)[0]
    assert full.ratio_uniform < bf16.ratio_uniform < layer.ratio_uniform


def test_the_margin_is_the_gates():
    from specdeploy.speculation.gate import breakeven
    assert gate_margin() == breakeven(2.0, 1.0).margin


def _trace(tmp_path, seqs, positions, keep, rng, layers=3):
    lines = []
    for s in range(seqs):
        per_layer = [rng.sample(range(384), 8) for _ in range(layers)]
        for p in range(positions):
            if p:
                per_layer = [rng.sample(prev, keep) + rng.sample([x for x in range(384) if x not in prev], 8 - keep)
                             for prev in per_layer]
            lines.append(json.dumps({"seq": f"s{s}", "pos": p, "experts": per_layer}))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_routing_trace_counts_the_distinct_experts_it_holds(tmp_path):
    kimi = load_target(KIMI)
    rng = random.Random(3)
    sticky = load_trace(_trace(tmp_path, 16, 8, 8, rng), kimi.experts)  # every position keeps all 8
    assert sticky.locality() == 1.0
    d, v = sticky.distinct(8, 3)
    assert d == v  # a verify step touches no expert its decode step did not
    row = predict(kimi, H200, [8], [3], margin=0.1, trace=sticky)[0]
    assert row.ratio_trace == pytest.approx(1.0, abs=0.02)
    local = load_trace(_trace(tmp_path, 32, 8, 6, rng), kimi.experts)
    assert local.locality() == pytest.approx(0.75)
    row = predict(kimi, H200, [8], [3], margin=0.1, trace=local)[0]
    assert row.ratio_trace == pytest.approx(row.ratio_local, rel=0.05)
    # a JSON list works the same
    (tmp_path / "t.json").write_text(json.dumps([json.loads(x) for x in
                                                 (tmp_path / "trace.jsonl").read_text().splitlines()]))
    assert load_trace(tmp_path / "t.json").distinct(8, 3) == local.distinct(8, 3)
    with pytest.raises(SpecdeployError, match="64 windows of 4 consecutive tokens, fewer than batch 65"):
        local.distinct(65, 3)


@pytest.mark.parametrize("line, words", [
    ('{"seq": 1, "pos": 0, "experts": [[1, 2]]}\n{"seq": 1, "pos": 1, "experts": [[999]]}', ["line 2", "999"]),
    ('{"seq": 1, "pos": 0}', ["line 1: experts", "missing"]),
    ('{"seq": 1, "pos": 0, "experts": [[1]]}\n{"seq": 1, "pos": 2, "experts": [[1]]}', ["not consecutive"]),
    ('{"seq": 1, "pos": 0, "experts": [[1]]}\n{"seq": 2, "pos": 0, "experts": [[1], [2]]}', ["2 layers"]),
    ("not json", ["line 1", "not JSON"]),
])
def test_bad_routing_traces_name_the_line_and_field(tmp_path, line, words):
    p = tmp_path / "t.jsonl"
    p.write_text(line)
    with pytest.raises(SpecdeployError) as exc:
        load_trace(p, 384)
    text = " ".join(f.line() for f in exc.value.problems)
    assert all(w in text for w in words), text


@pytest.mark.parametrize("change, field", [
    ({"n_routed_experts": "many"}, "n_routed_experts"),
    ({"hidden_size": float("nan")}, "hidden_size"),
    ({"num_experts_per_tok": 500}, "num_experts_per_tok"),
    ({"moe_intermediate_size": None, "intermediate_size": None}, "moe_intermediate_size"),
    ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"quantization_config": {"config_groups": {"g": {"weights": {"num_bits": "four"}}}}}, "num_bits"),
])
def test_bad_configs_name_the_field(tmp_path, change, field):
    cfg = json.loads((KIMI / "config.json").read_text())
    cfg["text_config"].update(change)
    with pytest.raises(SpecdeployError) as exc:
        shape_from_config(cfg, "config.json")
    text = exc.value.problems[0].subject
    assert field in text and "text_config" in text, text


def test_missing_config_is_a_finding(tmp_path):
    with pytest.raises(SpecdeployError, match="--target"):
        load_target(tmp_path)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", "breakeven", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_cli_predicts_for_the_kimi_target_and_keeps_the_old_form(tmp_path):
    r = cli("--target", str(KIMI), "--batch", "8", "--k", "3", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (row,) = out["rows"]
    assert (row["batch"], row["k"], out["margin"]) == (8, 3, 0.1)
    assert row["ratio_local"] < row["ratio_uniform"] and row["needed_al_margin"][1] > row["needed_al"][1]
    text = cli("--target", str(KIMI), "--batch", "8", "--k", "3")
    assert text.returncode == 0 and "AL for 1.10x" in text.stdout
    assert f"{row['ratio_local']:5.2f} - {row['ratio_uniform']:5.2f}" in text.stdout
    old = cli("--acceptance-length", "1.45", "--step-ratio", "2.2")
    assert old.stdout == ("speedup 0.66x (AL 1.45 / step ratio 2.2); break-even AL 2.2, with 10% margin 2.42: "
                          "disable\n")
    bad = cli("--target", str(tmp_path))
    assert bad.returncode == 2 and "--target" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("--target", str(KIMI), "--locality", "nan")
    assert bad.returncode == 2 and "--locality" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("--target", str(KIMI), "--batch", "0")
    assert bad.returncode == 2 and "--batch" in bad.stderr
