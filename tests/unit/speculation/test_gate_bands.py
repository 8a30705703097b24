"""k per load band: the gate picks a k for each measured concurrency from that level's acceptance per position and
step-time ratio, renders it where the engine release takes a per-batch-size speculation length, and otherwise
gives the single k that maximises the traffic-weighted speedup and names the band that loses by it."""
import itertools
import random

import pytest

from specdeploy.speculation.gate import decide, verdict_overrides
from specdeploy.speculation.kbands import band_starts, bands_text, k_by_band, predict_k, single_k


def level(c, per_position, step_ratio, spread=0.03):
    """A measured level as run_level and gate() write it: the speedup is AL over the step-time ratio."""
    al = 1 + sum(per_position)
    sp = al / step_ratio
    return {"concurrency": c, "per_position": list(per_position), "step_ratio": step_ratio,
            "acceptance_length": al, "speedup": sp, "speedup_interval": [sp * (1 - spread), sp * (1 + spread)]}


# verification is dear at one request (few tokens share the experts) and cheap when the batch is large
SMALL = level(1, [0.7, 0.3, 0.1], 2.0)   # k=1 1.28x, k=2 1.20x, k=3 1.05x measured
LARGE = level(32, [0.8, 0.7, 0.6], 1.3)  # k=1 1.64x, k=2 2.08x, k=3 2.38x measured


def test_band_starts_split_at_the_geometric_mean_of_neighbouring_levels():
    assert band_starts([1]) == [1]
    assert band_starts([1, 8, 32]) == [1, 3, 17]
    assert band_starts([1, 4]) == [1, 3]
    assert band_starts([4, 4]) == [1, 5]  # a repeated level still gets a band of its own, after the first
    for cs in ([1, 2, 3], [2, 16, 64, 256], [1, 1000]):
        s = band_starts(cs)
        assert s[0] == 1 and all(b > a for a, b in zip(s, s[1:]))
        assert all(lo <= c for lo, c in zip(s, cs))  # each level lies in (or above the start of) its own band


def test_each_band_gets_the_k_its_own_load_predicts_best():
    bands = k_by_band([LARGE, SMALL], 3)  # levels in any order
    assert [(b["from_batch"], b["k"], b["concurrency"]) for b in bands] == [(1, 1, 1), (6, 3, 32)]
    assert bands[0]["predicted_speedup"] == pytest.approx(predict_k(SMALL["per_position"], 2.0, 3)[1])
    assert bands[1]["predicted_speedup"] == pytest.approx(LARGE["speedup"])
    assert bands_text(bands) == "k=1 at 1-5 running requests, k=3 at 6+ running requests"


def test_neighbouring_bands_with_one_k_merge_and_a_losing_load_speculates_not_at_all():
    mid = level(8, [0.8, 0.7, 0.6], 1.35)
    hopeless = level(64, [0.05, 0.0, 0.0], 1.6)  # 0.66x at k=3, 0.74x at k=1: off at that load
    bands = k_by_band([SMALL, mid, LARGE, hopeless], 3)
    assert [(b["from_batch"], b["k"]) for b in bands] == [(1, 1), (3, 3), (46, 0)]
    assert bands[1]["merged"] == [32] and bands[2]["predicted_speedup"] == 1.0
    # a level whose interval reaches above 1 is not switched off on its point alone
    unsure = dict(hopeless, speedup_interval=[0.5, 1.05])
    assert k_by_band([SMALL, unsure], 3)[-1]["k"] > 0


def test_no_bands_without_a_measured_spread():
    assert k_by_band([dict(SMALL, speedup_interval=None), LARGE], 3) == []
    assert k_by_band([], 3) == [] and single_k([], 3) is None


def test_the_single_k_follows_the_traffic_and_names_the_band_that_loses():
    even = single_k([SMALL, LARGE], 3)
    assert even["k"] == 3 and even["weights"] == [1.0, 1.0]
    assert [(x["concurrency"], x["k"]) for x in even["loses"]] == [(1, 1)]
    mostly_small = single_k([SMALL, LARGE], 3, [0.97, 0.03])
    assert mostly_small["k"] == 1 and [x["concurrency"] for x in mostly_small["loses"]] == [32]
    assert mostly_small["weighted_speedup"] == pytest.approx(
        0.97 * predict_k(SMALL["per_position"], 2.0, 3)[1] + 0.03 * predict_k(LARGE["per_position"], 1.3, 3)[1])
    with pytest.raises(ValueError):
        single_k([SMALL, LARGE], 3, [1.0])
    with pytest.raises(ValueError):
        single_k([SMALL, LARGE], 3, [0.0, 0.0])


def test_the_single_k_maximises_the_weighted_speedup_on_generated_levels():
    """On random levels and traffic, no k beats the chosen one's weighted speedup by more than the margin (the
    measured k stays unless a smaller one beats it by that much), and the decision agrees with it."""
    rng = random.Random(11)
    for _ in range(300):
        k = rng.randint(1, 5)
        levels = []
        for c in sorted(rng.sample(range(1, 129), rng.randint(1, 4))):
            pp = sorted((rng.random() for _ in range(k)), reverse=True)
            levels.append(level(c, pp, 1 + rng.random() * 2.5))
        w = [rng.random() + 0.01 for _ in levels]
        one = single_k(levels, k, w)
        table = {kp: sum(wi * (predict_k(lv["per_position"], lv["step_ratio"], k)[kp] if kp < k else lv["speedup"])
                         for wi, lv in zip(w, levels)) / sum(w) for kp in range(1, k + 1)}
        assert one["weighted_speedup"] == pytest.approx(table[one["k"]])
        assert max(table.values()) <= one["weighted_speedup"] * 1.1 + 1e-9
        if one["k"] < k:
            assert table[one["k"]] > table[k] * 1.1
        verdict, rk, _ = decide(levels, k, weights=w)
        if verdict == "reduce-k":
            assert rk == one["k"]
        bands = k_by_band(levels, k)
        assert bands[0]["from_batch"] == 1 and all(0 <= b["k"] <= k for b in bands)
        assert all(a["k"] != b["k"] for a, b in itertools.pairwise(bands))


def test_the_verdict_sets_bands_only_where_the_release_takes_them():
    bands = k_by_band([SMALL, LARGE], 3)
    report = {"verdict": "keep", "k_by_batch": bands, "recommended_k": None}
    assert verdict_overrides(report, per_batch=True) == {
        "specdeploy_spec_num_tokens": 3,
        "specdeploy_spec_k_by_batch": [{"from_batch": 1, "k": 1}, {"from_batch": 6, "k": 3}]}
    assert verdict_overrides(report) == {}  # one k for every load: the measured one, kept
    low = {"verdict": "reduce-k", "recommended_k": 2,
           "k_by_batch": [{"from_batch": 1, "k": 1}, {"from_batch": 9, "k": 2}]}
    assert verdict_overrides(low, per_batch=True)["specdeploy_spec_num_tokens"] == 2
    assert verdict_overrides(low) == {"specdeploy_spec_num_tokens": 2}
    one_band = {"verdict": "keep", "k_by_batch": [{"from_batch": 1, "k": 3}]}
    assert verdict_overrides(one_band, per_batch=True) == {}
    assert verdict_overrides({"verdict": "disable", "k_by_batch": bands}, per_batch=True) == {
        "specdeploy_spec_enabled": False}


def test_each_level_gets_the_rooflines_step_ratio_beside_the_measured_one():
    """With the target's config and the hardware profile, every measured level carries the roofline's verify-plus-
    draft step ratio at the report's k and that level's concurrency (local to uniform routing): for Kimi-K2.5 at
    batch 8 and k=3 a range above 1.5. A run without speculation gets none."""
    from specdeploy.speculation.verifycost import add_predictions, load_target, peaks, predict
    from helpers import REPO
    hw = peaks("h200_nvl8")
    kimi = load_target(REPO / "examples/models/kimi-k2.5-int4")
    rep = {"k": 3, "speculation": True, "margin": 0.1,
           "levels": [dict(level(8, [0.7, 0.5, 0.3], 1.9)), dict(level(32, [0.7, 0.5, 0.3], 1.5))]}
    add_predictions(rep, kimi, hw)
    for lv in rep["levels"]:
        row = predict(kimi, hw, [lv["concurrency"]], [3], margin=0.1)[0]
        assert lv["predicted_step_ratio"] == [row.needed_al[0], row.needed_al[1]]
    lo, hi = rep["levels"][0]["predicted_step_ratio"]
    assert 1.5 < lo < hi < 4.0
    assert rep["prediction"]["k"] == 3 and rep["prediction"]["hardware"] == hw.name
    baseline = {"k": None, "speculation": False, "margin": 0.1, "levels": [dict(level(8, [], 1.0))]}
    assert "predicted_step_ratio" not in add_predictions(baseline, kimi, hw)["levels"][0]
