"""A kept band schedule measured as rendered (speculation/schedule.py): the loads it is measured at, which bands
lose against speculation off, what replaces them, and when k = 0 costing turns speculation off everywhere."""
from __future__ import annotations

import pytest

from specdeploy.speculation.schedule import band_at, candidate_loads, check, loads

BANDS = [{"from_batch": 1, "k": 3, "concurrency": 1}, {"from_batch": 3, "k": 1, "concurrency": 8},
         {"from_batch": 17, "k": 0, "concurrency": 32}]


def _lv(tps: float, spread: float = 0.01) -> dict:
    return {"output_tps": tps, "rounds_tps": [tps * (1 - spread), tps, tps * (1 + spread), tps]}


def test_the_loads_are_each_bands_level_and_both_sides_of_each_threshold():
    assert loads(BANDS) == [1, 2, 3, 8, 16, 17, 32]
    assert candidate_loads([1, 8, 32]) == [1, 2, 3, 8, 16, 17, 32]
    assert band_at(BANDS, 2)["k"] == 3 and band_at(BANDS, 3)["k"] == 1 and band_at(BANDS, 100)["k"] == 0


def _check(speedups: dict[int, float], spread: float = 0.01):
    base = {c: _lv(100.0, spread) for c in loads(BANDS)}
    measured = {c: _lv(100.0 * s, spread) for c, s in speedups.items()}
    return check(BANDS, measured, base, margin=0.10)


def test_a_schedule_that_holds_everywhere_is_kept_as_rendered():
    res = _check({1: 1.5, 2: 1.4, 3: 1.2, 8: 1.2, 16: 1.1, 17: 1.0, 32: 1.0})
    assert res["verdict"] == "keep" and res["replaced"] == [] and res["bands_after"] == BANDS
    assert {r["load"]: r["outcome"] for r in res["rows"]}[1] == "wins"
    assert {r["load"]: r["outcome"] for r in res["rows"]}[32] == "inside the noise"
    assert [r["role"] for r in res["rows"]] == ["band level", "last load before a threshold",
                                                "first load of a band", "band level",
                                                "last load before a threshold", "first load of a band", "band level"]


def test_a_band_that_collapses_at_its_threshold_gets_a_lower_k():
    res = _check({1: 1.5, 2: 1.4, 3: 0.6, 8: 1.2, 16: 1.1, 17: 1.0, 32: 1.0})
    assert res["losing_bands"] == [3]
    assert res["replaced"] == [{"from_batch": 3, "k_was": 1, "k_now": 0, "why": res["replaced"][0]["why"]}]
    assert "k=1 loses at 3 running (0.60x" in res["replaced"][0]["why"]
    assert res["bands_after"] == [{"from_batch": 1, "k": 3, "concurrency": 1},
                                  {"from_batch": 3, "k": 0, "concurrency": 8}]  # merged with the k=0 band
    assert res["verdict"] == "keep"


def test_k_zero_that_costs_turns_speculation_off_unless_the_schedule_still_pays():
    off = _check({1: 1.05, 2: 1.0, 3: 1.0, 8: 1.0, 16: 1.0, 17: 0.45, 32: 0.4})
    assert off["zero_costs"] and off["verdict"] == "disable"
    assert "speculation off for the whole engine" in off["reason"]
    kept = _check({1: 2.0, 2: 1.9, 3: 1.8, 8: 1.8, 16: 1.7, 17: 0.9, 32: 0.9}, spread=0.01)
    assert kept["zero_costs"] and kept["verdict"] == "keep" and "kept with that cost" in kept["reason"]
    assert kept["weighted_speedup"] == pytest.approx((2.0 + 1.8 + 0.9) / 3)


def test_a_load_without_a_baseline_is_said_to_be_unmeasured():
    res = check(BANDS, {1: _lv(150.0)}, {}, 0.1)
    assert res["rows"][0]["outcome"].startswith("not measured") and res["rows"][0]["speedup"] is None
