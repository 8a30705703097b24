"""The synthetic rejection method's plan per adapter (engines/synthetic.py); the tables are held to the release
sources by tests/contract/test_synthetic_contract.py."""
from __future__ import annotations

import pytest

from specdeploy.engines import get_adapter, synthetic
from specdeploy.hostvars.schema import validate_host


@pytest.mark.parametrize(("al", "k", "want"), [
    (1.0, 1, [0.0]), (2.0, 1, [1.0]), (1.5, 1, [0.5]), (2.5, 3, [1.0, 0.5, 0.0]), (4.0, 3, [1.0, 1.0, 1.0]),
    (1.0, 4, [0.0, 0.0, 0.0, 0.0]), (3.25, 4, [1.0, 1.0, 0.25, 0.0])])
def test_rates_are_the_minimum_variance_schedule_whose_sum_is_the_length(al, k, want):
    r = synthetic.rates(al, k)
    assert r == pytest.approx(want)
    assert 1 + sum(r) == pytest.approx(al)
    assert all(a >= b for a, b in zip(r, r[1:]))


@pytest.mark.parametrize("al", [0.5, 0.999, 3.01, float("nan"), float("inf")])
def test_a_length_outside_one_to_k_plus_one_is_refused(al):
    with pytest.raises(ValueError, match="outside"):
        synthetic.rates(al, 2)


def test_vllm_renders_it_as_speculative_config_keys_the_host_schema_accepts():
    a = get_adapter("vllm", "0.32.0")
    run = synthetic.plan(a, 2.0, 1)
    assert run.overrides == {"specdeploy_spec_config_extra": {"rejection_sample_method": "synthetic",
                                                              "synthetic_acceptance_length": 2}}
    hv = validate_host("h", {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.32.0",
                             "specdeploy_hardware": "h200_nvl8", "specdeploy_model_path": "/m",
                             "specdeploy_spec_enabled": True, "specdeploy_drafter_path": "/d",
                             "specdeploy_spec_num_tokens": 1, **run.overrides})
    cfg = a.spec_config(hv, "/d")
    assert cfg["rejection_sample_method"] == "synthetic" and cfg["synthetic_acceptance_length"] == 2
    assert a.spec_config_problems(hv, "h") == []


def test_a_release_before_the_method_says_which_release_takes_it():
    a = get_adapter("vllm", "0.19.0")
    assert "vLLM 0.19.0 has no synthetic acceptance method (it takes one from vLLM 0.20.0)" == synthetic.unavailable(a)
    with pytest.raises(ValueError, match="0.20.0"):
        synthetic.plan(a, 2.0, 1)


def test_sglang_renders_it_as_the_engines_environment_by_release():
    old = synthetic.plan(get_adapter("sglang", "0.5.2"), 1.5, 2).overrides["specdeploy_engine_env"]
    new = synthetic.plan(get_adapter("sglang", "0.5.23"), 1.5, 2).overrides["specdeploy_engine_env"]
    assert old == {"SIMULATE_ACC_LEN": "1.5", "SIMULATE_ACC_METHOD": "match-expected"}
    assert new == {"SGLANG_SIMULATE_ACC_LEN": "1.5", "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}


def test_the_cpu_builds_refusal_is_found_in_a_log_and_nothing_else_is():
    a = get_adapter("vllm", "0.32.0")
    log = ("(Worker pid=9750) ERROR [multiproc_executor.py:1063] AssertionError: Synthetic acceptance not supported "
           "with CPU sampling\n")
    r = synthetic.refusal(a, log)
    assert r is not None and r.platform == "cpu" and r.where == "vllm/utils/cpu_triton_utils.py"
    assert synthetic.refusal(a, "RuntimeError: CUDA out of memory") is None
    assert synthetic.refusal(get_adapter("sglang", "0.5.23"), log) is None
