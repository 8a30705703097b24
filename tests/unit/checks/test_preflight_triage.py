import json
import subprocess
import sys
import time

import pytest

from specdeploy.speculation.gate import breakeven
from specdeploy.checks.preflight import preflight


def run_pf(repo, inv="example", **extra):
    reports = preflight(str(repo / "inventory" / inv), extra=extra)
    return {h: {(f.severity, f.subject): f for f in r.findings} for h, r in reports.items()}, reports


def errs(reports, host):
    return {f.subject: f for f in reports[host].findings if f.severity == "error"}


def test_example_inventories_pass_fast(repo):
    for inv in ("example", "b200"):
        t0 = time.perf_counter()
        _, reports = run_pf(repo, inv)
        assert time.perf_counter() - t0 < 5
        assert all(r.ok for r in reports.values()), {h: r.to_dict() for h, r in reports.items()}


def test_vllm_016_without_patches_names_all_three_failures(repo):
    _, reports = run_pf(repo, specdeploy_engine_patches="none")
    e = errs(reports, "gpu-a")
    assert {"eagle3 target whitelist", "image_token_index", "SupportsEagle3"} <= set(e)
    # on 0.18.0 the same inventory passes without patches
    _, reports = run_pf(repo, specdeploy_engine_patches="none", specdeploy_engine_version="0.18.0")
    assert reports["gpu-a"].ok


def test_removed_speculative_keys(repo):
    _, r = run_pf(repo, specdeploy_engine_version="0.17.1", specdeploy_spec_config_extra={"disable_by_batch_size": 8})
    assert "specdeploy_spec_config_extra.disable_by_batch_size" in errs(r, "gpu-a")
    _, r = run_pf(repo, specdeploy_engine_version="0.21.0",
                  specdeploy_spec_config_extra={"speculative_token_tree": "[(0,)]"})
    assert "removed in vLLM 0.21.0" in errs(r, "gpu-a")["specdeploy_spec_config_extra.speculative_token_tree"].message
    _, r = run_pf(repo, specdeploy_engine_version="0.16.0", specdeploy_spec_config_extra={"disable_by_batch_size": 8})
    assert "specdeploy_spec_config_extra.disable_by_batch_size" not in errs(r, "gpu-a")


def test_sglang_rules(repo):
    _, r = run_pf(repo, "b200", specdeploy_spec_method="eagle")
    assert "EAGLE3" in errs(r, "b200-1")["specdeploy_spec_method"].fix
    _, r = run_pf(repo, "b200", specdeploy_engine_version="0.5.9")
    assert "0.5.10" in errs(r, "b200-1")["specdeploy_engine_version"].fix
    _, r = run_pf(repo, "b200", specdeploy_hardware="rtx_pro_6000_pcie", specdeploy_custom_all_reduce=True,
                  specdeploy_attention_backend="")
    e = errs(r, "b200-1")
    assert "specdeploy_custom_all_reduce" in e and "specdeploy_attention_backend" in e
    _, r = run_pf(repo, "b200", specdeploy_hardware="rtx_pro_6000_pcie")
    assert r["b200-1"].ok  # the profile turns custom all-reduce off and picks flashinfer


def test_tp_memory_remote_code_timeout_p2p(repo):
    _, r = run_pf(repo, specdeploy_tensor_parallel_size=16)
    assert "larger than the 8 GPUs" in errs(r, "gpu-a")["specdeploy_tensor_parallel_size"].message
    _, r = run_pf(repo, specdeploy_tensor_parallel_size=6)
    assert "does not divide" in errs(r, "gpu-a")["specdeploy_tensor_parallel_size"].message
    _, r = run_pf(repo, specdeploy_tensor_parallel_size=4)
    assert "does not fit" in errs(r, "gpu-a")["GPU memory"].message
    _, r = run_pf(repo, specdeploy_trust_remote_code=False)
    assert "specdeploy_trust_remote_code" in errs(r, "gpu-a")
    _, r = run_pf(repo, specdeploy_start_timeout="90s")
    assert "mid-load" in errs(r, "gpu-a")["specdeploy_start_timeout"].message
    found, r = run_pf(repo)
    assert ("warning", "PCIe P2P") in found["gpu-a"]
    found, r = run_pf(repo, specdeploy_nccl_env={"NCCL_P2P_DISABLE": "1"})
    assert ("warning", "PCIe P2P") not in found["gpu-a"]
    found, r = run_pf(repo, specdeploy_api_key_file="/nonexistent/api-key")
    assert "does not exist" in found["gpu-a"][("warning", "specdeploy_api_key_file")].message


def test_preflight_cli_exit_codes(repo):
    base = [sys.executable, "-m", "specdeploy.cli", "preflight", "-i", str(repo / "inventory/example")]
    assert subprocess.run(base, capture_output=True).returncode == 0
    r = subprocess.run(base + ["-e", "specdeploy_engine_patches=none", "--json"], capture_output=True, text=True)
    assert r.returncode == 1 and json.loads(r.stdout)["ok"] is False and "Traceback" not in r.stderr


def test_breakeven_examples():
    b = breakeven(1.45, 2.2)
    assert round(b.speedup, 2) == 0.66 and b.verdict == "disable"
    b = breakeven(3.0, 2.2)
    assert round(b.speedup, 2) == 1.36 and b.verdict == "keep"
    assert breakeven(2.3, 2.2).verdict == "disable"  # 1.05x does not clear the 10% margin
    with pytest.raises(ValueError):
        breakeven(0.5, 2.2)


def test_gate_decisions():
    from specdeploy.speculation.gate import decide, verdict_overrides
    from specdeploy.speculation.kbands import predict_k
    # position 0 accepts often, later positions rarely, and the draft is expensive: k=1 is predicted better
    # (each with a measured spread of +-5%: the rounds agree)
    lv = {"speedup": 2.03 / 1.9, "per_position": [0.85, 0.15, 0.03], "step_ratio": 1.9, "acceptance_length": 2.03,
          "speedup_interval": [2.03 / 1.9 * 0.95, 2.03 / 1.9 * 1.05]}
    preds = predict_k(lv["per_position"], lv["step_ratio"], 3)
    assert preds[1] > preds[3]
    verdict, k, why = decide([lv], 3)
    assert (verdict, k) == ("reduce-k", 1) and "k=1" in why
    assert verdict_overrides({"verdict": "reduce-k", "recommended_k": 1}) == {"specdeploy_spec_num_tokens": 1}
    # consistent inputs: speedup = AL / step ratio
    assert decide([{"speedup": 2.9 / 1.6, "per_position": [0.8, 0.6, 0.5], "step_ratio": 1.6,
                    "speedup_interval": [2.9 / 1.6 * 0.95, 2.9 / 1.6 * 1.05]}], 3)[0] == "keep"
    assert decide([{"speedup": 1.15 / 2.2, "per_position": [0.1, 0.03, 0.02], "step_ratio": 2.2,
                    "speedup_interval": [1.15 / 2.2 * 0.95, 1.15 / 2.2 * 1.05]}], 3)[0] == "disable"
    # the same reduce-k case with rounds that disagree by +-40%: the prediction's bottom is below 1x, no verdict
    assert decide([dict(lv, speedup_interval=[2.03 / 1.9 * 0.6, 2.03 / 1.9 * 1.4])], 3)[0] is None
    assert verdict_overrides({"verdict": "disable"}) == {"specdeploy_spec_enabled": False}
    assert verdict_overrides({"verdict": "keep"}) == {}


def test_target_without_eagle3_support_is_an_engine_error(repo, tmp_path):
    # the target-support table decides for every target, not only Kimi/DeepSeek
    src = json.loads((repo / "tests/data/drafters/targets/qwen3-8b/config.json").read_text())
    target, drafter = tmp_path / "qwen3-next", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    (target / "config.json").write_text(json.dumps(dict(src, architectures=["Qwen3NextForCausalLM"],
                                                        model_type="qwen3_next")))
    entry = json.loads((repo / "tests/data/drafters/corpus/specforge-qwen3-8b-eagle3.json").read_text())
    (drafter / "config.json").write_text(json.dumps(entry["config"]))
    paths = {"specdeploy_model_config_copy": str(target), "specdeploy_drafter_config_copy": str(drafter)}
    _, r = run_pf(repo, specdeploy_engine_version="0.17.0", **paths)
    e = errs(r, "gpu-a")
    assert "SupportsEagle3" in e["eagle3 target"].message and "0.27.0" in e["eagle3 target"].fix
    assert "drafter target" not in {f.subject for f in r["gpu-a"].findings}  # said once, by the engine
    _, r = run_pf(repo, "b200", **paths)  # SGLang 0.5.23 serves Qwen3-Next as an EAGLE-3 target
    assert not any("eagle3" in f.subject or f.subject == "specdeploy_engine_version"
                   for f in r[next(iter(r))].findings if f.severity == "error")
