"""``breakeven --measure`` (speculation/measure.py, ops/measure.py) against the engine simulator, started by the
production runner from a host's rendered plan: the sweep's order, the gate's noise method per point, the surface
and the AL each band needs, and a refusal reported as such. The real vLLM CPU build: tests/realengine/
test_real_vllm_price.py."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.engines import get_adapter, synthetic
from specdeploy.ops.measure import Runner
from specdeploy.speculation import surface as S
from specdeploy.speculation.measure import EngineFailed, Launched, Plan, sweep

from helpers import DRAFTER, MODEL

STEP_MS = "4"
SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.fixture
def venv(tmp_path):
    """A venv stand-in whose ``specdeploy`` runs this checkout (the sandbox simulator's command line)."""
    bin_ = tmp_path / "venv" / "bin"
    bin_.mkdir(parents=True)
    script = bin_ / "specdeploy"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={SRC} exec {sys.executable} -m specdeploy.cli \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return tmp_path / "venv"


def _host(venv: Path) -> dict:
    return {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.32.0", "specdeploy_runtime": "venv",
            "specdeploy_venv_path": str(venv), "specdeploy_sandbox": True, "specdeploy_hardware": "h200_nvl8",
            "specdeploy_model_path": str(MODEL), "specdeploy_served_model_name": "kimi",
            "specdeploy_engine_env": {"SPECDEPLOY_SIM_LOAD_SECONDS": "0", "SPECDEPLOY_SIM_STEP_MS": STEP_MS,
                                      "SPECDEPLOY_SIM_SPEC_STEP_RATIO": "1.25", "SPECDEPLOY_SIM_SEED": "7"}}


class Simulated:
    """The production runner, with the simulator's acceptance set from what the synthetic method asks for
    (k = 1: a per-token acceptance of AL - 1), which the real engine applies itself."""

    def __init__(self, runner: Runner):
        self.runner, self.starts = runner, []

    def __call__(self, overrides: dict, label: str) -> Launched:
        self.starts.append(label)
        extra = overrides.get("specdeploy_spec_config_extra") or {}
        if "synthetic_acceptance_length" in extra:
            alpha = str(extra["synthetic_acceptance_length"] - 1)
            overrides = {**overrides, "specdeploy_engine_env": {"SPECDEPLOY_SIM_ACCEPTANCE": alpha}}
        return self.runner(overrides, label)


def test_the_sweep_measures_a_baseline_and_each_point_with_the_gates_noise_method(tmp_path, venv):
    runner = Runner("simhost", _host(venv), tmp_path / "work")
    launch = Simulated(runner)
    from specdeploy.speculation.verifycost import load_target, peaks
    plan = Plan("vllm", "0.32.0", ks=[1], als=[1.0, 1.6, 2.0], concurrency=[1, 4], requests=16, max_tokens=24,
                synthetic=True, head=str(DRAFTER), roofline=(load_target(MODEL), peaks("h200_nvl8")))
    s = sweep(launch, plan)
    # the first synthetic point first (a refusing build costs one start), then the baseline, then the rest
    assert launch.starts == ["synthetic AL 1, k=1", "baseline", "synthetic AL 1.6, k=1", "synthetic AL 2, k=1"]
    assert s["refused"] is None and s["failures"] == []
    base = s["baseline"]["levels"]
    assert set(base) == {"1", "4"} and all(len(lv["rounds_tps"]) == 4 and lv["aa"] for lv in base.values())
    assert len(s["points"]) == 6
    for p in s["points"]:
        assert p["errors"] == 0 and len(p["rounds_tps"]) == 4 and p["aa"] is not None
        lo, hi = p["speedup_interval"]
        assert lo <= p["speedup"] <= hi
        assert p["rates"] == synthetic.rates(p["al_requested"], 1)
        assert p["al_measured"] == pytest.approx(p["al_requested"], abs=0.15)
        assert len(p["rounds_al"]) == 4 and p["al_interval"][0] <= p["al_measured"] <= p["al_interval"][1]
        r = p["roofline_speedup"]
        assert r[0] <= r[1] and p["roofline_needed_al"][0] <= p["roofline_needed_al"][1]
    # speedup grows with the acceptance length at each load: the end points (AL 1 and 2, a speedup about twice the
    # other's) strictly; neighbours only beyond their spread. An unpaired sweep measures each point minutes after the
    # baseline, so on a busy machine drift between neighbours can exceed their gap (1.22 at AL 1.6 above 1.07 at AL
    # 2.0 in one CI run); the paired sweep below is the one that removes it.
    for c in (1, 4):
        pts = sorted((p for p in s["points"] if p["concurrency"] == c), key=lambda p: p["al_requested"])
        assert pts[0]["speedup"] < pts[-1]["speedup"], [p["speedup"] for p in pts]
        for a, b in zip(pts, pts[1:]):
            assert b["speedup_interval"][1] >= a["speedup_interval"][0], (a["speedup_interval"], b["speedup_interval"])
    # the AL each band needs: the simulator's step ratio is 1.25, so 1.0x needs about 1.25 and 1.10x about 1.375
    rows = {r["concurrency"]: r for r in s["needed"]}
    assert set(rows) == {1, 4} and rows[1]["from_batch"] == 1 and rows[4]["from_batch"] == 3
    for r in rows.values():
        assert r["breakeven"]["how"] == "interpolated" and 1.1 < r["breakeven"]["al"] < 1.5, r
        assert r["keep"]["al"] > r["breakeven"]["al"] and r["keep"]["reachable"]
        lo, hi = r["keep"]["interval"]
        assert lo <= r["keep"]["al"] <= hi
        assert r["roofline"]["keep"][0] == pytest.approx(r["roofline"]["breakeven"][0] * 1.1)
    assert {(x["k"], x["concurrency"]) for x in s["roofline_needed"]} == {(1, 1), (1, 4)}
    assert S.problem(json.loads(json.dumps(s))) == ""
    out = S.chart(s, tmp_path / "surface.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the engine logs stay in the work directory; no engine process is left
    assert (tmp_path / "work" / "baseline.log").is_file()


def test_a_refusal_in_the_engines_log_ends_the_synthetic_sweep_after_one_start(tmp_path):
    starts = []
    text = "AssertionError: Synthetic acceptance not supported with CPU sampling"

    def launch(overrides, label):
        starts.append(label)
        return Launched("http://127.0.0.1:9", lambda: f"ERROR [worker] {text}\n", lambda: None)

    plan = Plan("vllm", "0.32.0", ks=[1, 2], als=[1.5, 2.0], concurrency=[1], requests=4, synthetic=True,
                head=str(tmp_path))
    s = sweep(launch, plan)
    assert starts == ["synthetic AL 1.5, k=1"]
    r = s["refused"]
    assert r["release"] == "vLLM 0.32.0" and r["platform"] == "cpu" and r["text"] in text
    assert "CPU build refuses the synthetic rejection method" in r["reason"]
    assert r["fallback"].startswith("the roofline")
    assert s["points"] == [] and s["baseline"] is None


def test_a_release_without_the_method_is_reported_without_starting_anything(tmp_path):
    def launch(overrides, label):
        raise AssertionError("nothing is started")

    s = sweep(launch, Plan("vllm", "0.19.0", ks=[1], als=[2.0], concurrency=[1], synthetic=True))
    assert s["refused"]["release"] == "vLLM 0.19.0"
    assert s["refused"]["reason"] == synthetic.unavailable(get_adapter("vllm", "0.19.0"))


def test_an_engine_that_fails_to_start_is_a_failure_with_its_log_not_a_traceback(tmp_path):
    def launch(overrides, label):
        raise EngineFailed("the engine exited with status 1 before it was ready", "RuntimeError: CUDA OOM\n")

    s = sweep(launch, Plan("vllm", "0.32.0", ks=[1, 2], als=[2.0], concurrency=[1], synthetic=True, head="/h"))
    assert [f["label"] for f in s["failures"]] == ["synthetic AL 2, k=1", "baseline", "synthetic AL 2, k=2"]
    assert "CUDA OOM" in s["failures"][0]["log_tail"] and s["refused"] is None


def test_the_cli_names_a_missing_host_and_a_bad_list(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "breakeven", "--measure", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert r.returncode == 2 and "--inventory" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "breakeven", "--measure", "-i", str(tmp_path),
                        "--host", "h", "--acceptance-lengths", "0.5,2"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(SRC)})
    assert r.returncode == 2 and "--acceptance-lengths" in r.stderr and "Traceback" not in r.stderr


def test_a_paired_sweep_keeps_the_baseline_up_and_measures_each_round_beside_one_of_it(tmp_path, venv):
    runner = Runner("simhost", _host(venv), tmp_path / "work")
    launch = Simulated(runner)
    plan = Plan("vllm", "0.32.0", ks=[1], als=[1.5, 2.0], concurrency=[1, 2], requests=8, max_tokens=16,
                synthetic=True, head=str(DRAFTER), paired=True, drafters=[("d", str(DRAFTER), None)])
    s = sweep(launch, plan)
    # the first synthetic point is tried with one request (a refusing build costs one start), then measured paired
    assert launch.starts == ["synthetic AL 1.5, k=1", "baseline", "synthetic AL 1.5, k=1", "synthetic AL 2, k=1",
                             "d, k=1"]
    assert s["paired"] is True and s["failures"] == [] and len(s["points"]) == 6
    for p in s["points"]:
        assert p["paired"] and len(p["rounds_tps"]) == len(p["baseline_rounds_tps"]) == 4
        lo, hi = p["speedup_interval"]
        assert lo <= p["speedup"] <= hi
    assert {c: len(lv["rounds_tps"]) for c, lv in s["baseline"]["levels"].items()} == {"1": 12, "2": 12}
    d = [p for p in s["points"] if p["drafter"] == "d"]
    assert all(p["al_measured"] > 1.3 for p in d)  # the simulator's default acceptance, 0.7 per token


def test_each_start_attaches_to_the_hosts_weight_cache_where_its_plan_has_one(tmp_path, venv):
    """vLLM 0.32.0 with a block-FP8 checkpoint: the plan has a daemon, so every measurement start runs the
    attach command line (ipc_cache, no fallback to disk); vLLM 0.16.0 has none and loads from disk."""
    cfg = json.loads((MODEL / "config.json").read_text())
    cfg["text_config"]["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                                 "weight_block_size": [128, 128]}  # block FP8: the daemon holds it
    (tmp_path / "fp8").mkdir()
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(cfg))
    new = Runner("simhost", {**_host(venv), "specdeploy_model_config_copy": str(tmp_path / "fp8")},
                 tmp_path / "work")
    argv, _, _ = new.command(new.variables_for({"specdeploy_spec_enabled": False}))
    assert argv[argv.index("--load-format") + 1] == "ipc_cache"
    assert '"fallback":false' in argv[argv.index("--model-loader-extra-config") + 1]
    old = Runner("simhost", {**_host(venv), "specdeploy_engine_version": "0.16.0"}, tmp_path / "work16")
    argv, _, _ = old.command(old.variables_for({"specdeploy_spec_enabled": False}))
    assert "ipc_cache" not in argv
