"""SGLang's acceptance gauges, one series per scheduler: aggregated as the engine means them (one figure per DP
group; across groups accepted tokens over forwards), from a /metrics page as the engine writes it."""
from __future__ import annotations

import math

import pytest

from specdeploy.engines import get_adapter
from specdeploy.hostvars.schema import validate_host
from specdeploy.speculation.exporter import aggregate_ranks, parse_engine_metrics


def _page(series):
    """series: [(labels, al, rate, tput)]"""
    out = []
    for name, i in (("sglang:spec_accept_length", 1), ("sglang:spec_accept_rate", 2), ("sglang:gen_throughput", 3)):
        out.append(f"# HELP {name} x\n# TYPE {name} gauge")
        for s in series:
            if s[i] is None:
                continue
            lab = ",".join(f'{k}="{v}"' for k, v in s[0].items())
            out.append(f"{name}{{{lab}}} {s[i]}")
    return "\n".join(out) + "\n"


def _lab(tp, dp=None):
    d = {"model_name": "m", "engine_type": "unified", "tp_rank": str(tp), "pp_rank": "0", "moe_ep_rank": "0"}
    if dp is not None:
        d["dp_rank"] = str(dp)
    return d


def test_two_dp_groups_give_accepted_tokens_over_forwards():
    # group 0: 300 tok/s at AL 3 (100 forwards/s), group 1: 100 tok/s at AL 1.25 (80 forwards/s)
    s = parse_engine_metrics("sglang", _page([(_lab(0, 0), 3.0, 0.5, 300.0), (_lab(4, 1), 1.25, 0.1, 100.0)]), 0)
    assert s.al == pytest.approx(400 / 180)
    assert s.rate == pytest.approx((100 * 0.5 + 80 * 0.1) / 180)
    assert s.al != pytest.approx((3.0 + 1.25) / 2)  # not the plain mean of the ranks


def test_the_ranks_of_one_group_count_once():
    base = [(_lab(0, 0), 3.0, 0.5, 300.0), (_lab(4, 1), 1.25, 0.1, 100.0)]
    dup = base + [(_lab(t, 0), 3.0, 0.5, 300.0) for t in (1, 2, 3)]
    a = parse_engine_metrics("sglang", _page(base), 0)
    b = parse_engine_metrics("sglang", _page(dup), 0)
    assert (a.al, a.rate) == pytest.approx((b.al, b.rate))


def test_a_group_without_a_figure_and_missing_throughput():
    s = parse_engine_metrics("sglang", _page([(_lab(0, 0), 2.0, 0.4, 100.0), (_lab(4, 1), 0.0, 0.0, 0.0)]), 0)
    assert s.al == 2.0 and s.rate == pytest.approx(0.4)
    s = parse_engine_metrics("sglang", _page([(_lab(0, 0), 2.0, 0.4, None), (_lab(4, 1), 3.0, 0.6, 50.0)]), 0)
    assert s.al == pytest.approx(2.5) and s.rate == pytest.approx(0.5)  # plain mean: no weight for every group
    assert aggregate_ranks([((), {"acceptance_length": math.nan})]) == (None, None)


def test_tp_ranks_without_dp_are_one_group():
    s = parse_engine_metrics("sglang", _page([(_lab(t), 2.2, 0.3, 90.0 + t) for t in range(8)]), 0)
    assert s.al == pytest.approx(2.2) and s.rate == pytest.approx(0.3)


@pytest.mark.parametrize("version", ["0.5.1", "0.5.23"])
def test_the_flag_is_rendered_for_every_release(version):
    hv = validate_host("h", {"specdeploy_engine": "sglang", "specdeploy_engine_version": version,
                             "specdeploy_hardware": "h200_nvl8", "specdeploy_model_path": "/m",
                             "specdeploy_spec_enabled": False})
    argv = get_adapter("sglang", version).command(hv).argv
    assert argv[argv.index("--enable-metrics") + 1] == "--enable-metrics-for-all-schedulers"
