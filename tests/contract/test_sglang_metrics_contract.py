"""Contract: what the exporter assumes of SGLang's per-scheduler metrics holds in each tested release's real source:
scheduler metrics are recorded off attention-TP rank 0 only under --enable-metrics-for-all-schedulers (which the
adapter renders), and the acceptance and throughput gauges it aggregates are defined."""
from __future__ import annotations

import re

import pytest

from specdeploy.engines import get_adapter, upstream

from .spans import endpoints
from .upstream_facts import sglang_metric_names

pytestmark = pytest.mark.contract

GUARD = re.compile(r"attn_tp_rank\s*==\s*0[^\n]*(?:\n[^\n]*){0,3}?enable_metrics_for_all_schedulers")


@pytest.mark.parametrize("version", endpoints("sglang"))
def test_metrics_off_rank_zero_need_the_flag_the_adapter_renders(version):
    root = upstream.source("sglang", version) / "sglang" / "srt"
    guards = [p for p in root.rglob("*.py") if GUARD.search(p.read_text(errors="replace"))]
    assert guards, f"SGLang {version}: no guard on attn_tp_rank == 0 or enable_metrics_for_all_schedulers"
    names = sglang_metric_names(root.parent.parent)
    sg = get_adapter("sglang", version)
    for key in ("acceptance_length", "throughput"):
        assert sg.metrics.spec_gauges[key] in names, (version, key)
    assert sg.flag_exists("--enable-metrics-for-all-schedulers")
