"""The price of speculation measured by the real vLLM 0.32.0 CPU build (docs/speculation.md, "The measured price"):
`specdeploy breakeven --measure` on a host whose target is the tiny MoE + MLA model (kimi_k2), asked for the synthetic
rejection method, which this build refuses (reported as such, with the fallback), and given drafters of controlled
acceptance (testing/rated.py) instead: the surface, the AL each band needs, requested against measured AL. Then the
tiny good drafter, served with a band schedule (k=1 at one running request, k=0 from two): its speedup against the
surface's interval at its AL, and the schedule measured as rendered against speculation off. The Kimi-K2.5 example's
generated random head through the engine's own probe.

The measurement is paired (`--paired`: the baseline engine stays up, frozen while idle, and every round of a point
follows a round of it), and so is the good drafter's comparison with it: on a shared host (CI runs three workers on
two cores) throughput drifts between minutes more than speculation changes it, and a pair's two rounds share the
drift. Engines start one at a time (each launch costs about 35 s of two cores): the CLI's four (the refused
synthetic point, the baseline, one per drafter), then the good drafter's, which also serves the MLA + MoE target
test that the end-to-end module ran on an engine of its own, then a baseline for its pairs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specdeploy.speculation import surface as S
from specdeploy.speculation.gate import load_prompts
from specdeploy.speculation.schedule import report as schedule_report
from specdeploy.testing import rated, realengine, realrun, tinymodels

pytestmark = pytest.mark.realengine

REPO = Path(__file__).resolve().parents[2]
KIMI_EXAMPLE = REPO / "examples" / "models" / "kimi-k2.5-int4"
LOADS, REQUESTS, MAX_TOKENS = [1, 2], 8, 48
RATES = (0.5, 1.0)
SCHEDULE = [{"from_batch": 1, "k": 1, "concurrency": 1}, {"from_batch": 2, "k": 0, "concurrency": 2}]
BANDS = {"specdeploy_spec_k_by_batch": [{"from_batch": b["from_batch"], "k": b["k"]} for b in SCHEDULE]}


@pytest.fixture(scope="module")
def kimi():
    realrun.tiny_cache_from_env()
    return tinymodels.target("kimi_k2")


@pytest.fixture(scope="module")
def measured(kimi, tmp_path_factory):
    """One `breakeven --measure` run of the real CLI on an inventory that serves the tiny target from the CPU
    build: the synthetic method asked for at AL 2, k=1, and two controlled drafters given."""
    d = tmp_path_factory.mktemp("measure")
    # the measurement starts the target with drafters: on an x86 CPU without AMX the CPU build serves an MLA target
    # beside a drafter only with MLA off (realengine.env), which an operator's inventory for this host would set
    raw = realrun.host_vars(kimi, None, drafters=True).model_dump(exclude_unset=True)
    inv = {"all": {"children": {"specdeploy_engines": {"hosts": {"realhost": {"ansible_host": "127.0.0.1", **raw}}}}}}
    (d / "hosts.yml").write_text(yaml.safe_dump(inv))
    drafters = {r: rated.drafter("kimi_k2", r) for r in RATES}
    argv = [sys.executable, "-m", "specdeploy.cli", "breakeven", "--measure", "-i", str(d / "hosts.yml"), "--host",
            "realhost", "--k", "1", "--acceptance-lengths", "2", "--concurrency", ",".join(map(str, LOADS)),
            "--requests", str(REQUESTS), "--max-tokens", str(MAX_TOKENS), "--paired", "--out", str(d / "surface")]
    for r, path in drafters.items():
        argv += ["--drafter", f"{rated.expected_al(path, MAX_TOKENS):.4f}@{path}"]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    seconds = time.monotonic() - t0
    print(f"breakeven --measure: {seconds:.0f} s")
    surface = json.loads((d / "surface" / "surface.json").read_text()) if (d / "surface").is_dir() else None
    return p, surface, d, drafters


def test_asked_for_the_synthetic_method_the_cpu_build_is_reported_with_the_fallback(measured):
    p, s, _, _ = measured
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    r = s["refused"]
    assert r["release"] == "vLLM 0.32.0" and r["platform"] == "cpu"
    assert r["text"] == "Synthetic acceptance not supported with CPU sampling"
    assert r["settings"] == "speculative config: rejection_sample_method=synthetic, synthetic_acceptance_length=2"
    assert r["fallback"].startswith("the roofline (`specdeploy breakeven --target MODEL_DIR`")
    assert "synthetic method: refused. vLLM 0.32.0's CPU build refuses the synthetic rejection method" in p.stdout
    assert "fallback: the roofline" in p.stdout
    # the fallback's figures for every point asked for
    assert {(x["k"], x["concurrency"]) for x in s["roofline_needed"]} == {(1, c) for c in LOADS}
    assert not [f for f in s["failures"]], s["failures"]


def test_controlled_drafters_measure_the_surface_of_a_tiny_moe_target(measured):
    p, s, d, drafters = measured
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert s["method"] == "synthetic" and s["release"] == "0.32.0" and s["engine"] == "vllm" and s["paired"]
    assert set(s["baseline"]["levels"]) == {str(c) for c in LOADS}
    pts = {(pt["drafter"], pt["concurrency"]): pt for pt in s["points"]}
    assert len(pts) == len(RATES) * len(LOADS)
    for rate, path in drafters.items():
        want = rated.expected_al(path, MAX_TOKENS)
        for c in LOADS:
            pt = pts[(path.name, c)]
            assert pt["errors"] == 0 and len(pt["rounds_tps"]) == 4 and pt["aa"] is not None and pt["paired"]
            assert len(pt["baseline_rounds_tps"]) == 4  # each round right after a round of the baseline
            # requested and measured acceptance agree, round by round
            assert pt["al_agrees"], pt
            assert pt["al_measured"] == pytest.approx(1 + rate, abs=0.03)
            assert pt["al_requested"] == pytest.approx(want, abs=1e-4)
            lo, hi = pt["speedup_interval"]
            assert lo <= pt["speedup"] <= hi
            assert pt["roofline_speedup"][0] <= pt["roofline_speedup"][1]
    # the AL each band needs, for 1.0x and for the gate's keep threshold, measured beside the roofline's
    rows = {r["concurrency"]: r for r in s["needed"]}
    assert set(rows) == set(LOADS) and rows[1]["from_batch"] == 1 and rows[2]["from_batch"] == 2
    for r in rows.values():
        assert r["k"] == 1 and r["points"] == len(RATES)
        for goal in ("breakeven", "keep"):
            assert r[goal]["al"] is not None and r[goal]["how"] in ("interpolated", "extrapolated")
        assert r["keep"]["al"] >= r["breakeven"]["al"] and "roofline" in r
    assert S.problem(s) == ""
    png = (d / "surface" / "surface.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
    assert "AL needed for 1.10x at k=1:" in p.stdout


@pytest.fixture(scope="module")
def good(kimi, measured, tmp_path_factory):
    """The tiny good drafter served with a band schedule, after the measurement's engines are gone."""
    eng = realrun.serve(realrun.host_vars(kimi, tinymodels.drafter("kimi_k2", "good"), k=1, extra=BANDS),
                        tmp_path_factory.mktemp("good"))
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def baseline(kimi, good, tmp_path_factory):
    """The target without speculation, as the measurement's baseline ran (the CPU build's environment for a host
    with drafters), kept up frozen: the good drafter's rounds alternate with its rounds."""
    eng = realrun.serve(realrun.host_vars(kimi, None, drafters=True), tmp_path_factory.mktemp("baseline"))
    eng.freeze()
    yield eng
    eng.stop()


def test_the_good_drafters_speedup_lies_inside_the_surfaces_interval_at_its_al(measured, good, baseline):
    """Measured as the surface was (--paired): each round of the good drafter right after a round of the baseline,
    so the drift of a shared host falls on both. Its interval overlaps the surface's at its AL."""
    from specdeploy.speculation.measure import merge, paired_interval, paired_rounds
    _, s, _, _ = measured
    pp, bp = paired_rounds(baseline, baseline.served, good.url, good.served, "vllm", load_prompts(None), 1, REQUESTS,
                           MAX_TOKENS, {"ignore_eos": True})
    lv, bl = merge(pp), merge(bp)
    al = lv["acceptance_length"]
    assert lv["errors"] == bl["errors"] == 0 and al > 1.9  # its first draft token is the target's own next token
    speedup, (g_lo, g_hi) = paired_interval(lv["rounds_tps"], bl["rounds_tps"])
    lo, hi = S.point_interval_at(s, al, 1, 1)
    assert g_lo <= hi and lo <= g_hi, ((speedup, (g_lo, g_hi)), (lo, hi), al, S.speedup_at(s, al, 1, 1))


def test_a_kept_band_schedule_is_measured_as_rendered_against_speculation_off(measured, good):
    _, s, _, _ = measured
    kept = {"verdict": "keep", "margin": 0.10, "k": 1, "k_by_batch": SCHEDULE, "reason": "as the gate kept it"}
    base = {"levels_by_concurrency": s["baseline"]["levels"]}
    # requested as the surface's baseline was: every request runs to MAX_TOKENS (--measure's ignore_eos)
    rep = schedule_report(kept, good.url, "vllm", base, REQUESTS, MAX_TOKENS, extra={"ignore_eos": True})
    res = rep["schedule_check"]
    assert res["loads"] == LOADS and rep["k_by_batch_predicted"] == SCHEDULE
    rows = {r["load"]: r for r in res["rows"]}
    assert rows[1]["k"] == 1 and rows[2]["k"] == 0
    assert rows[1]["role"] == "band level" and rows[2]["role"] == "band level"
    # as rendered: the engine drafts at one running request and (nearly) stops drafting from two
    assert rows[1]["drafts_per_token"] > 0.3, rows[1]
    assert rows[2]["drafts_per_token"] < 0.5 * rows[1]["drafts_per_token"], rows
    for r in rows.values():
        lo, hi = r["interval"]
        assert lo <= r["speedup"] <= hi and r["baseline_tps"] > 0
        assert r["outcome"] == ("loses" if hi < 1.0 else "wins" if lo >= 1.0 else "inside the noise")
    if res["zero_costs"]:
        assert rep["verdict"] in ("keep", "disable") and "k=0" in rep["reason"]
    else:
        assert rep["verdict"] == "keep" and rep["k_by_batch"][0]["k"] == 1
    print(json.dumps(res["rows"], indent=1))


def test_kimi_k2_mla_moe_target_serves_with_eagle3(kimi, good):
    from specdeploy.speculation.exporter import parse_engine_metrics
    for i in range(3):
        good.chat([{"role": "user", "content": f"list {i + 2} colours"}], max_tokens=24)
    t = parse_engine_metrics("vllm", good.metrics(), 0.0)
    log = good.log.read_text()
    assert json.loads((kimi / "config.json").read_text())["model_type"] == "kimi_k2"
    assert "Resolved architecture: LlamaForCausalLMEagle3" in log
    # With AMX the target's layers run the engine's AMX MLA kernel; without it the CPU build cannot pair its MLA
    # kernel's 16-token KV blocks with the drafter's (multiples of 32), and the target runs with MLA turned off.
    if realengine.amx("0.32.0"):
        assert "Using AMX_MLA backend" in log and "VLLM_MLA_DISABLE" not in good.env
    else:
        assert good.env.get("VLLM_MLA_DISABLE") == "1" and "_MLA backend" not in log
    assert t.drafts > 0 and t.accepted / t.drafts > 0.5
    assert good.stop() == 0


def test_the_kimi_examples_generated_head_passes_the_doctor_and_the_engines_probe(tmp_path):
    from specdeploy.checks.probe import probe
    from specdeploy.drafter import check, synth
    made = synth.write(tmp_path / "head", KIMI_EXAMPLE, "vllm", "0.32.0", fill="zeros")
    head = Path(made["path"])
    doctor = check(head, KIMI_EXAMPLE, "vllm", "0.32.0")
    assert doctor.ok, [f.line() for f in doctor.findings]
    rep, run = probe(KIMI_EXAMPLE, head, "vllm", "0.32.0", venv=str(realengine.venv("0.32.0")),
                     trust_remote_code=True)
    assert run.ran and rep.ok, [f.line() for f in rep.findings]
    c = run.cases["probe"]
    assert c["drafter_class"] == "LlamaForCausalLMEagle3" and c["supports_eagle3"] is True
    assert c["aux_layers"] == [2, 30, 58] and c["aux_layers_source"] == "drafter config"
    load = c["load"]
    assert load["load_error"] is None and load["rejected"] == [] and load["missing"] == []
    assert load["dropped"] == [] and load["shared_from_target"] == ["embed_tokens"]
