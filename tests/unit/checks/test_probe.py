"""The engine probe: the pinned vLLM's own config validation, target-class check and drafter weight loading, run
with the real CPU builds (specdeploy.testing.realengine), and the doctor's agreement with it.

The realengine tests need the venvs (built once, minutes; see testing/realengine.py); the others run anywhere."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdeploy.checks.probe import case_findings, probe, run_cases
from specdeploy.testing import drafter_variants as dv

realengine = pytest.mark.realengine


def _venv(version: str) -> str:
    from specdeploy.testing import realengine as re_
    return str(re_.venv(version))


def _pair(tmp_path: Path, name: str) -> tuple[Path, Path]:
    v = next(x for x in dv.variants() if x.name == name)
    return dv.write_variant(tmp_path, v)


def _errors(findings) -> dict:
    return {f.subject: f for f in findings if f.severity == "error"}


# --- anywhere ---------------------------------------------------------------------------------------------
def test_sglang_says_where_it_can_run(tmp_path):
    t, d = _pair(tmp_path, "good@llama")
    rep, run = probe(t, d, "sglang")
    assert not run.ran and run.unavailable and rep.ok
    assert "CUDA-only" in rep.findings[0].message and "host with the SGLang image" in rep.findings[0].fix


def test_a_probe_that_cannot_run_says_why_and_blocks_nothing(tmp_path):
    t, d = _pair(tmp_path, "good@llama")
    rep, run = probe(t, d, "vllm", "0.32.0", python=str(tmp_path / "no-python"))
    assert not run.ran and rep.ok and "cannot run" in rep.findings[0].message
    # a Python without vLLM: the script's own report of the failed import
    rep, run = probe(t, d, "vllm", "0.32.0", python=sys.executable)
    assert not run.ran and "does not import" in run.why and "No module named" in run.why


def test_time_and_output_are_bounded(tmp_path):
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    t0 = time.monotonic()
    run = run_cases("vllm", "0.32.0", [{"id": "x", "target": "/t", "drafter": "/d"}], str(slow), timeout=2)
    assert not run.ran and "within 2 s" in run.why and time.monotonic() - t0 < 10
    loud = tmp_path / "loud"
    loud.write_text("#!/bin/sh\nhead -c 3000000 /dev/zero | tr '\\0' x\n")
    loud.chmod(0o755)
    run = run_cases("vllm", "0.32.0", [{"id": "x", "target": "/t", "drafter": "/d"}], str(loud), max_output=1 << 20)
    assert not run.ran and "was cut" in run.why


def test_cli_exit_codes_and_no_traceback(tmp_path):
    t, d = _pair(tmp_path, "good@llama")
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "probe", "--target", str(t), "--drafter", str(d),
                        "--python", str(tmp_path / "nope"), "--json"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert json.loads(r.stdout)["ran"] is False
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "probe", "--target", str(tmp_path / "none"),
                        "--drafter", str(d)], capture_output=True, text=True)
    assert r.returncode == 2 and "no config.json" in r.stdout and "Traceback" not in r.stderr


def test_findings_from_an_engine_answer():
    """The controller's reading of the script's JSON (the engine's words kept, each with a fix)."""
    c = {"version": "0.16.0+cpu", "target_model_type": "kimi_k2", "target_class": "DeepseekV3ForCausalLM",
         "supports_eagle3": False, "uses_aux_hidden_states": True, "target_vocab": 1000,
         "problems": [{"stage": "speculative_config", "error": "ValidationError: 1 validation error for "
                       "SpeculativeConfig\n  Value error, Eagle3 is only supported for ['llama'] models. Got "
                       "model_type='kimi_k2' [type=value_error, input_value=...]"}],
         "load": {"load_error": "KeyError: 'model.input_norm.weight'", "missing": ["draft_id_to_target_id"],
                  "rejected": [{"name": "input_norm.weight", "shape": [768], "error": "KeyError: "
                                "'model.input_norm.weight'", "kind": "unknown"}],
                  "parameters": {"draft_id_to_target_id": [500]}, "narrowed": [], "dropped": []}}
    errs = {f.subject: f for f in case_findings(c, "vllm", "0.16.0") if f.severity == "error"}
    assert set(errs) == {"eagle3 target whitelist", "SupportsEagle3", "tensor names", "d2t"}
    assert errs["eagle3 target whitelist"].message.endswith("Got model_type='kimi_k2'")
    assert "input_norm.weight" in errs["tensor names"].message and all(f.fix for f in errs.values())
    c["version"] = "0.32.0"
    assert "engine version" in {f.subject for f in case_findings(c, "vllm", "0.16.0") if f.severity == "error"}


# --- the real engines -------------------------------------------------------------------------------------
@realengine
def test_016_reports_the_seeds_whitelist_and_supports_eagle3_for_kimi(tmp_path):
    t, d = _pair(tmp_path, "good@kimi_k2")
    t0 = time.monotonic()
    rep, run = probe(t, d, "vllm", "0.16.0", venv=_venv("0.16.0"), trust_remote_code=True)
    took = time.monotonic() - t0
    errs = _errors(rep.findings)
    assert run.ran and run.version.startswith("0.16.0")
    assert "Eagle3 is only supported for ['llama', 'qwen'" in errs["eagle3 target whitelist"].message
    assert "kimi_k2" in errs["eagle3 target whitelist"].message
    assert "DeepseekV3ForCausalLM does not implement SupportsEagle3" in errs["SupportsEagle3"].message
    assert set(errs) == {"eagle3 target whitelist", "SupportsEagle3"}  # the drafter itself loads
    # a bound against a hang, not a benchmark: 10-30 s alone on two cores, over a minute beside the sandbox tests
    assert took < 180, took


# The single pairs the tests below probe on 0.32.0, in one engine process as `run_cases` takes them (each process
# imports vLLM before its first pair: most of a one-pair probe's time). The 0.16.0 pairs go through `probe` itself.
CASES_032 = ("good@llama", "nbf-top-no-tensor@llama", "model-prefix@llama", "arch-qwen3@llama", "good@mixtral",
             "no-aux@mixtral")


@pytest.fixture(scope="module")
def probed_032(tmp_path_factory):
    from specdeploy.checks.probe import TIMEOUT_S, python_of
    root = tmp_path_factory.mktemp("probe-032")
    cases = []
    for name in CASES_032:
        t, d = _pair(root / name, name)
        cases.append({"id": name, "target": str(t.resolve()), "drafter": str(d.resolve()), "method": "eagle3",
                      "trust_remote_code": False})
    run = run_cases("vllm", "0.32.0", cases, python_of(None, _venv("0.32.0")), TIMEOUT_S)
    assert run.ran and run.version.startswith("0.32.0"), run.why
    assert set(run.cases) == set(CASES_032), sorted(run.cases)
    return run


def _probed(run, name: str, version: str = "0.32.0") -> tuple[dict, list, dict]:
    """(the engine's answer for one pair, every finding the controller reads from it, the errors by subject)."""
    c = run.cases[name]
    findings = case_findings(c, "vllm", version)
    return c, findings, _errors(findings)


@realengine
def test_032_accepts_a_llama_target_with_a_good_drafter(probed_032):
    raw, findings, errs = _probed(probed_032, "good@llama")
    assert not errs, [f.line() for f in findings]
    assert raw["supports_eagle3"] and raw["aux_layers"] == [2, 4, 5]
    assert raw["load"]["missing"] == [] and raw["load"]["rejected"] == []


@realengine
@pytest.mark.parametrize("version,name,subject,word", [
    # 0.16.0 builds no input_norm: the checkpoint's input_norm.weight has no parameter and its loader raises
    ("0.16.0", "input-norm-only@llama", "tensor names", "input_norm.weight"),
    # 0.32.0 builds input_norm for norm_before_fc: true; a checkpoint without it leaves it uninitialised
    ("0.32.0", "nbf-top-no-tensor@llama", "missing tensors", "model.input_norm.weight"),
    # a "model." prefix reaches no parameter (the loader prepends its own)
    ("0.32.0", "model-prefix@llama", "tensor names", "model.layers.0.self_attn.q_proj.weight"),
    # a head on Qwen3 layers builds q_norm/k_norm, which a Llama-flattened checkpoint lacks
    ("0.32.0", "arch-qwen3@llama", "missing tensors", "q_norm"),
])
def test_tensor_name_mismatch_as_the_engine_sees_it(tmp_path, request, version, name, subject, word):
    if version == "0.32.0":
        _, findings, errs = _probed(request.getfixturevalue("probed_032"), name)
    else:
        t, d = _pair(tmp_path, name)
        rep, run = probe(t, d, "vllm", version, venv=_venv(version))
        assert run.ran, run.why
        findings, errs = rep.findings, _errors(rep.findings)
    assert subject in errs and word in errs[subject].message, [f.line() for f in findings]


@realengine
def test_a_target_class_without_eagle3_support(probed_032):
    _, _, errs = _probed(probed_032, "good@mixtral")
    assert set(errs) == {"SupportsEagle3"}
    assert "MixtralForCausalLM does not implement SupportsEagle3" in errs["SupportsEagle3"].message
    # a drafter that asks for no aux states: the runner never checks the interface
    _, findings, errs = _probed(probed_032, "no-aux@mixtral")
    assert not errs, [f.line() for f in findings]


@realengine
@pytest.mark.parametrize("version", ["0.16.0", "0.32.0"])
def test_the_doctor_agrees_with_the_engine(tmp_path, version):
    """The suite's slice of the generated variants (every edit once, the good pair on every target class), one
    engine process per release: the doctor's load verdict (target, config, tensor names, shapes, missing
    parameters, d2t) and the aux layers it predicts equal the engine's. The whole sweep (over 200 variants):
    python -m specdeploy.testing.drafter_variants VERSION --venv VENV (bench/README.md)."""
    vs = dv.suite_slice()
    assert len({v.name.partition("@")[0] for v in vs}) == len(dv.EDITS)
    assert {v.target for v in vs} == {v.target for v in dv.variants()}
    res, seconds = dv.compare(tmp_path, version, str(Path(_venv(version)) / "bin" / "python"), vs)
    bad = [f"{o.name}: doctor {sorted(o.doctor)} probe {sorted(o.probe)} taps {o.doctor_taps} / {o.probe_taps}"
           for o in res if not o.agree]
    assert not bad, f"{len(bad)} of {len(res)} disagree:\n" + "\n".join(bad)
    assert seconds < 600


# --- preflight --probe --------------------------------------------------------------------------------------
def _pf(repo, tmp_path, name, version, python):
    from specdeploy.checks.preflight import preflight
    t, d = _pair(tmp_path, name)
    extra = {"specdeploy_model_config_copy": str(t), "specdeploy_drafter_config_copy": str(d),
             "specdeploy_engine_version": version, "specdeploy_trust_remote_code": "kimi" in name}
    return preflight(str(repo / "inventory" / "example"), extra=extra, probe_python=python)


def test_preflight_probe_that_cannot_run_warns_and_blocks_nothing(repo, tmp_path):
    reports = _pf(repo, tmp_path, "good@llama", "0.32.0", str(tmp_path / "no-python"))
    for r in reports.values():
        warn = [f for f in r.findings if f.subject == "probe" and f.severity == "warning"]
        assert warn and "cannot run" in warn[0].message
        assert not any(f.subject.startswith("probe") and f.severity == "error" for f in r.findings)


@realengine
def test_preflight_probe_reports_what_the_engine_rejects(repo, tmp_path):
    reports = _pf(repo, tmp_path, "input-norm-only@llama", "0.16.0", str(Path(_venv("0.16.0")) / "bin" / "python"))
    r = next(iter(reports.values()))
    subjects = {f.subject for f in r.findings if f.severity == "error"}
    assert "probe tensor names" in subjects and "drafter tensor names" in subjects  # both, the engine's and ours


def test_the_suites_slice_of_the_variants_covers_every_edit_and_target_class():
    vs, part = dv.variants(), dv.suite_slice()
    assert [v.name for v in part] == [v.name for v in dv.suite_slice()] and len(part) < len(vs) // 2  # one slice
    assert {v.name.partition("@")[0] for v in part} == set(dv.EDITS)
    assert {v.target for v in part} == {v.target for v in vs}
    assert {v.name for v in part} >= {v.name for v in vs if v.name.startswith("good@")}
