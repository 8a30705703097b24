"""The probe as the deploy runs it on a host, before the engine restarts (checks/probe.py host_job/host_result,
the inference_engine role): the job is the release's own command line, it runs in the release's image or venv,
and the deploy reads the engine's answer into errors that stop it and warnings that do not."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from specdeploy.checks.probe import MARK, host_job, host_result
from specdeploy.engines import get
from specdeploy.plan import render_host
from specdeploy.hostvars.schema import validate_host

PROBE_DIR = "/var/lib/specdeploy/probe"


def hv(**extra):
    v = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.32.0", "specdeploy_runtime": "venv",
         "specdeploy_venv_path": "/opt/specdeploy/venv", "specdeploy_hardware": "h200_nvl8",
         "specdeploy_model_path": "/models/target", "specdeploy_served_model_name": "m",
         "specdeploy_spec_enabled": True, "specdeploy_spec_method": "eagle3", "specdeploy_drafter_path": "/models/d",
         "specdeploy_spec_num_tokens": 2, "specdeploy_max_model_len": 4096,
         "specdeploy_engine_env": {"SOME_ENGINE_ENV": "1"}}
    v.update(extra)
    return validate_host("h1", v)


def test_the_job_is_the_release_command_line_in_its_venv():
    h = hv()
    job = host_job(h, PROBE_DIR, "h1", "10.0.0.1")
    assert job["enabled"] and job["runtime"] == "venv"
    assert job["argv"] == ["/opt/specdeploy/venv/bin/python", f"{PROBE_DIR}/probe.py", f"{PROBE_DIR}/job.json"]
    assert job["script"] == get("vllm")("0.32.0").probe_script()
    case = json.loads(job["job"])["cases"][0]
    plan = render_host("h1", h, "10.0.0.1")
    spec = json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])
    assert case == {"id": "release", "target": "/models/target", "drafter": spec["model"], "method": "eagle3",
                    "num_speculative_tokens": 2, "trust_remote_code": True, "max_model_len": 4096}
    assert spec["model"] != "/models/d"  # the converted drafter the release serves, not the staged original
    env = json.loads(job["job"])["env"]
    assert env["SOME_ENGINE_ENV"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    # an engine venv of its own (the sandbox's real engine): the probe runs with the engine's Python
    own = host_job(hv(specdeploy_engine_venv_path="/opt/vllm-0.32"), PROBE_DIR, "h1")
    assert own["argv"][0] == "/opt/vllm-0.32/bin/python"


def test_in_the_docker_runtime_it_runs_in_the_release_image_with_its_mounts():
    h = hv(specdeploy_runtime="docker")
    job = host_job(h, PROBE_DIR, "h1", "10.0.0.1")
    argv = job["argv"]
    assert job["runtime"] == "docker" and argv[:3] == ["/usr/bin/docker", "run", "--rm"]
    image = argv[argv.index("--entrypoint") + 2]
    assert argv[argv.index("--entrypoint") + 1] == "python3"
    assert argv[-2:] == [f"{PROBE_DIR}/probe.py", f"{PROBE_DIR}/job.json"]
    assert image in render_host("h1", h, "10.0.0.1").files[next(
        p for p in render_host("h1", h, "10.0.0.1").files if p.endswith(".service"))]
    vols = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert f"{PROBE_DIR}:{PROBE_DIR}" in vols and "/models/target:/models/target:ro" in vols


@pytest.mark.parametrize("extra, why", [
    ({"specdeploy_spec_enabled": False}, "runs no EAGLE drafter"),
    ({"specdeploy_engine_probe": False}, "specdeploy_engine_probe is false"),
    ({"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.23"}, "CUDA-only"),
])
def test_nothing_to_probe_says_why(extra, why):
    job = host_job(hv(**extra), PROBE_DIR, "h1")
    assert job["enabled"] is False and why in job["why"] and job["argv"] == []


def _out(cases, ok=True, version="0.32.0"):
    return "engine noise\n" + MARK + json.dumps({"ok": ok, "version": version, "cases": cases, "seconds": 9.5,
                                                  "error": "No module named 'torch'"}) + "\n"


@pytest.mark.parametrize("stdout, stderr, rc", [
    ("", "Traceback ...\nModuleNotFoundError: No module named 'torch'", 1),
    (_out([], ok=False), "", 0),
    (MARK + "{not json", "", 0),
    (MARK + json.dumps({"ok": True, "cases": "x"}), "", 0),
    (MARK + json.dumps([1, 2]), "", 0),
    ("\x00\xff" * 1000, "", -9),
])
def test_a_probe_that_cannot_run_warns_and_blocks_nothing(stdout, stderr, rc):
    r = host_result(hv(), stdout, stderr, rc)
    assert r["ran"] is False and r["errors"] == [] and len(r["warnings"]) == 1
    assert "did not run in the engine's venv (/opt/specdeploy/venv)" in r["warnings"][0]


def test_what_the_engine_refuses_is_an_error_and_a_doctor_that_passed_is_named():
    case = {"id": "release", "version": "0.32.0", "supports_eagle3": True, "target_class": "DeepseekV3ForCausalLM",
            "problems": [{"stage": "target_config", "error": "1 validation error for ModelConfig\n  Value error, "
                          "User-specified max_model_len (1048576) is greater than the derived max_model_len "
                          "(max_position_embeddings=262144 in model's config.json). [type=value_error"}]}
    doctor_ok = json.dumps({"ok": True, "findings": [{"severity": "info", "subject": "engine", "message": "x"}]})
    r = host_result(hv(), _out([case]), "", 0, doctor_ok)
    assert r["ran"] and r["version"] == "0.32.0"
    assert any("User-specified max_model_len (1048576) is greater" in e and "Fix:" in e for e in r["errors"])
    assert "the drafter doctor passed this drafter" in r["errors"][-1]
    r = host_result(hv(), _out([case]), "", 0, "not json")
    assert not any("doctor" in e for e in r["errors"])
    # a probe of another release than the pinned one is no evidence about this release
    r = host_result(hv(), _out([{**case, "problems": [], "version": "0.31.0"}], version="0.31.0"), "", 0)
    assert any("not the pinned 0.32.0" in e for e in r["errors"])


@pytest.mark.realengine
def test_the_host_job_against_the_real_engine(tmp_path):
    """The job the deploy writes, run as the role runs it (the venv runtime's argv) with the real vLLM 0.32.0:
    the release the sandbox deploys passes; the same release with a context the target does not have is
    refused by the engine's own config validation, and the deploy would stop before the restart."""
    from specdeploy.testing import realrun, tinymodels
    realrun.tiny_cache_from_env()
    target, drafter = tinymodels.target("deepseek_v3"), tinymodels.drafter("deepseek_v3", "good")
    for mml, refused in ((512, False), (1 << 20, True)):
        h = realrun.host_vars(target, drafter, k=1, extra={"specdeploy_max_model_len": mml})
        job = host_job(h, str(tmp_path), realrun.HOST, "127.0.0.1")
        data = json.loads(job["job"])
        data["cases"][0]["drafter"] = str(drafter)  # the converted drafter's host path, relocated (realrun)
        Path(job["script_path"]).write_text(job["script"])
        Path(job["job_path"]).write_text(json.dumps(data))
        p = subprocess.run(job["argv"], capture_output=True, text=True, timeout=300)
        r = host_result(h, p.stdout, p.stderr, p.returncode)
        assert r["ran"] and r["version"].startswith("0.32.0"), r
        if refused:
            assert any("refuses the context length" in e and "specdeploy_max_model_len" in e for e in r["errors"]), r
        else:
            assert r["errors"] == [], r
            assert any("places every checkpoint tensor" in i for i in r["info"]), r
