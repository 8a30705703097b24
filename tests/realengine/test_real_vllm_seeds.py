"""The seeds' failure reproduced by the real engine: vLLM 0.16.0 (its CPU build, ``testing.realengine``) started
with the command line specdeploy renders for the example inventory's 8-GPU host, on tiny Kimi-shaped targets
(``testing.tinymodels``: ``kimi_k2`` and the ``kimi_k25`` wrapper) with an EAGLE-3 drafter.

- the stock engine dies with its own whitelist error, and ``specdeploy preflight`` on the same inputs said so first,
  in well under a second, naming the same model type and the same list; ``specdeploy triage`` on the engine's log
  names it; the simulator, with the release's sources beside it (as in the sandbox's stand-in image), refuses
  the command in the engine's words, and serves it beside the patched sources;
- the patch set, applied to a copy of the installed package (the cached venv is never written), takes the engine
  past the whitelist: its engine core starts with the EAGLE-3 speculative config and stops at the next limit of
  this CPU build (its model runner has no speculative decoding), inside the patched copy;
- the engine's own classes, imported from the patched copy, implement SupportsEagle3, and its EAGLE proposer takes
  Kimi-K2.5's media_placeholder_token_id where the stock one fails with the seeds' AttributeError.

The venv and the tiny models are built on first use (minutes); a machine that cannot build them skips with the
reason.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import free_port, point_at_loopback
from specdeploy.values.errors import SpecdeployError
from specdeploy.checks.preflight import preflight
from specdeploy.testing import realengine, tinymodels
from specdeploy.triage import triage_files, triage_lines

pytestmark = pytest.mark.realengine

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parents[1] / "real_vllm_probe.py"
VERSION = "0.16.0"
HOST = "gpu-a"
KINDS = ("kimi_k2", "kimi_k25")
LAUNCH_TIMEOUT = 300  # the error comes 10-60 s after launch on two shared cores
WHITELIST = re.compile(r"Value error, Eagle3 is only supported for (\[[^\]]*\]) models\. "
                       r"Got self\.target_model_config\.hf_text_config\.model_type='([^']+)'")
PREDICTED = re.compile(r"rejects model_type '([^']+)' as an EAGLE-3 target: its speculative config accepts only "
                       r"(\[[^\]]*\])")
PATCHED_FILES = ("vllm/config/speculative.py", "vllm/v1/spec_decode/eagle.py",
                 "vllm/model_executor/models/deepseek_v2.py", "vllm/model_executor/models/kimi_k25.py")


@pytest.fixture(scope="module")
def venv() -> Path:
    try:
        return realengine.venv(VERSION)
    except SpecdeployError as exc:
        pytest.fail(f"the vLLM {VERSION} CPU venv could not be built: {exc}")


@pytest.fixture(scope="module")
def models(venv) -> dict:
    try:
        return {k: (tinymodels.target(k), tinymodels.drafter(k, "good")) for k in KINDS}
    except SpecdeployError as exc:
        pytest.fail(f"the tiny models could not be built: {exc}")


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    inv = tmp_path_factory.mktemp("inventory") / "example"
    shutil.copytree(REPO / "inventory" / "example", inv)
    return point_at_loopback(inv)


def site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def overlay(venv, tmp_path_factory) -> Path:
    """A copy of the venv's vllm package with the patch set applied by ``specdeploy patch apply``; the venv's own
    files are checked unchanged."""
    site = site_packages(venv)
    before = {f: hashlib.sha256((site / f).read_bytes()).hexdigest() for f in PATCHED_FILES}
    root = tmp_path_factory.mktemp("vllm-patched")
    shutil.copytree(site / "vllm", root / "vllm", symlinks=True)  # copy2 keeps mtimes: the .pyc files stay valid
    r = cli("patch", "apply", "--engine", "vllm", "--root", str(root), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p["id"]: p["status"] for p in json.loads(r.stdout)["patches"]} == {
        "vllm-eagle3-target-whitelist": "patched", "vllm-kimi-image-token": "patched",
        "vllm-deepseek-supports-eagle3": "patched"}
    after = {f: hashlib.sha256((site / f).read_bytes()).hexdigest() for f in PATCHED_FILES}
    assert after == before and realengine.ready(VERSION)
    status = json.loads(cli("patch", "status", "--engine", "vllm", "--root", str(site), "--json").stdout)
    assert {p["status"] for p in status["patches"]} == {"needed"}  # the installed package is stock
    return root


def cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def host_vars(kind: str, models: dict, port: int, patches: str, **more) -> dict:
    """The example host, its model and drafter pointed at the tiny ones (and their config copies, which preflight
    reads), listening on a free loopback port."""
    target, drafter = models[kind]
    return {"specdeploy_model_path": str(target), "specdeploy_model_config_copy": str(target),
            "specdeploy_drafter_path": str(drafter), "specdeploy_drafter_config_copy": str(drafter),
            "specdeploy_engine_patches": patches, "specdeploy_port": port, "specdeploy_bind_address": "127.0.0.1",
            **more}


def rendered(inventory: Path, hv: dict, drafter: Path) -> tuple[list[str], dict]:
    """``specdeploy engine argv`` for the host; the drafter the drafter role converts into place on a host is this
    one (it needs no conversion)."""
    args = ["engine", "argv", "-i", str(inventory), "--host", HOST, "--json"]
    for k, v in hv.items():
        args += ["-e", f"{k}={v}"]
    r = cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    argv, env = out["argv"], out["env"]
    assert argv[:3] == ["vllm", "serve", hv["specdeploy_model_path"]]
    i = argv.index("--speculative-config")
    spec = json.loads(argv[i + 1])
    assert spec["method"] == "eagle3" and spec["model"].startswith("/var/lib/specdeploy/drafter/")
    spec["model"] = str(drafter)
    argv[i + 1] = json.dumps(spec, separators=(",", ":"))
    return argv, env


def launch(venv: Path, argv: list[str], env: dict, log: Path, overlay: Path | None = None) -> tuple[int, float]:
    """Run the engine command with the venv's vllm; wait at most LAUNCH_TIMEOUT; kill its process group after."""
    full = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            **env, **realengine.env(VERSION)}
    if overlay is not None:
        full["PYTHONPATH"] = str(overlay)
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        p = subprocess.Popen([str(venv / "bin" / "vllm"), *argv[1:]], stdout=fh, stderr=subprocess.STDOUT,
                             env=full, cwd=log.parent, start_new_session=True)
        try:
            rc = p.wait(timeout=LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    took = time.monotonic() - t0
    assert rc is not None, f"the engine neither died nor served within {LAUNCH_TIMEOUT} s:\n{tail(log)}"
    return rc, took


def tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def errors(report) -> dict:
    return {f.subject: f for f in report.findings if f.severity == "error"}


@pytest.mark.parametrize("kind", KINDS)
def test_stock_engine_dies_on_the_whitelist_preflight_predicted_and_triage_names(kind, venv, models, inventory,
                                                                                 tmp_path):
    target, drafter = models[kind]
    hv = host_vars(kind, models, free_port(), "none")
    # before the engine: preflight on the same inputs
    t0 = time.perf_counter()
    report = preflight(str(inventory), HOST, hv)[HOST]
    took = time.perf_counter() - t0
    assert took < 1.0, f"preflight took {took:.2f} s"
    errs = errors(report)
    assert "eagle3 target whitelist" in errs, report.to_dict()
    predicted_type, predicted_list = PREDICTED.search(errs["eagle3 target whitelist"].message).groups()
    # nothing else is in the way: every other error is a later EAGLE-3 stop of this release
    assert set(errs) <= {"eagle3 target whitelist", "image_token_index", "SupportsEagle3"}, report.to_dict()
    assert ("image_token_index" in errs) == (kind == "kimi_k25")

    argv, env = rendered(inventory, hv, drafter)
    assert "--tensor-parallel-size" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "8"
    log = tmp_path / f"vllm-{kind}.log"
    rc, took = launch(venv, argv, env, log)
    text = log.read_text(errors="replace")
    m = WHITELIST.search(text)
    assert rc != 0 and m, f"exit {rc} after {took:.0f} s without the whitelist error:\n{tail(log)}"
    engine_list, engine_type = ast.literal_eval(m.group(1)), m.group(2)
    assert engine_type == predicted_type == tinymodels.text_config(kind)["model_type"]
    assert engine_list == ast.literal_eval(predicted_list)
    # raised while the API server built its config: no engine core, no weights read
    assert "Initializing a V1 LLM engine" not in text and "Loading safetensors" not in text

    r = cli("triage", str(log), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert res["outcome"] == "failed" and res["signature"] == "eagle3-target-whitelist", res
    assert res["confidence"] == "high" and f"model_type='{engine_type}'" in res["root_cause"]
    assert "specdeploy_engine_patches: auto" in res["fix"]

    # the simulator, with this release's (stock) sources beside it, refuses the same command in the same words
    beside = tmp_path / "stock-sources"
    beside.mkdir()
    (beside / "vllm").symlink_to(site_packages(venv) / "vllm")
    sim = simulate(argv, beside)
    assert sim.returncode == rc and m.group(0) in sim.stderr, (sim.returncode, sim.stderr)


def simulate(argv: list[str], sources: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``specdeploy simulate`` of this release on the rendered command, with ``sources`` (a directory holding a
    vllm package's sources) on its path, as in the sandbox's stand-in image."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(sources)]),
               SPECDEPLOY_SIM_LOAD_SECONDS="0")
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", "simulate", "--engine", "vllm", "--version",
                           VERSION, "--", *argv], capture_output=True, text=True, env=env, timeout=timeout)


def test_drafter_heads_must_divide_by_the_tp_as_preflight_says(venv, models, inventory, tmp_path):
    """A drafter with 4 attention heads (head_dim 128: the same projections) at the host's TP 8: preflight says the
    engine refuses it, and the engine does, at startup, before its whitelist."""
    _, good = models["kimi_k2"]
    drafter = tmp_path / "drafter-4-heads"
    shutil.copytree(good, drafter)
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["num_attention_heads"] * cfg["head_dim"] == 4 * 128
    cfg.update(num_attention_heads=4, num_key_value_heads=4, head_dim=128)
    (drafter / "config.json").write_text(json.dumps(cfg))
    hv = dict(host_vars("kimi_k2", models, free_port(), "auto"), specdeploy_drafter_path=str(drafter),
              specdeploy_drafter_config_copy=str(drafter))
    report = preflight(str(inventory), HOST, hv)[HOST]
    assert set(errors(report)) == {"drafter num_attention_heads"}, report.to_dict()
    assert "4 attention heads do not divide by its tensor-parallel size 8" in \
        errors(report)["drafter num_attention_heads"].message

    argv, env = rendered(inventory, hv, drafter)
    log = tmp_path / "vllm-heads.log"
    rc, _ = launch(venv, argv, env, log)
    text = log.read_text(errors="replace")
    assert rc != 0 and "Value error, Total number of attention heads (4) must be divisible by tensor parallel " \
        "size (8)" in text, tail(log)
    assert "validation error for SpeculativeConfig" in text and "Eagle3 is only supported for" not in text


def test_patch_set_takes_the_engine_past_the_whitelist(venv, models, inventory, overlay, tmp_path):
    kind = "kimi_k2"
    target, drafter = models[kind]
    # the CPU is one device: rendered for one GPU, so the engine core starts in this process group
    hv = host_vars(kind, models, free_port(), "auto", specdeploy_tensor_parallel_size=1)
    report = preflight(str(inventory), HOST, hv)[HOST]
    assert not errors(report), report.to_dict()
    assert any(f.subject == "patch set" for f in report.findings)

    argv, env = rendered(inventory, hv, drafter)
    log = tmp_path / "vllm-patched.log"
    rc, took = launch(venv, argv, env, log, overlay)
    text = log.read_text(errors="replace")
    assert rc != 0
    assert "Eagle3 is only supported for" not in text, tail(log)
    # the engine core started with the EAGLE-3 drafter on the Kimi target ...
    assert re.search(r"Initializing a V1 LLM engine \(v0\.16\.0\) with config: model='" + re.escape(str(target)) +
                     r"', speculative_config=SpeculativeConfig\(method='eagle3'", text), tail(log)
    # ... and stopped at this CPU build's next limit, inside the patched copy
    assert "AssertionError: spec decode is not supported." in text, tail(log)
    assert f'File "{overlay}/vllm/v1/worker/cpu_model_runner.py"' in text
    assert f'File "{site_packages(venv)}/vllm/' not in text  # no frame of the stock package
    res = triage_files([log])
    assert res.signature == "spec-decode-unsupported" and res.location.startswith(str(overlay)), res

    # the simulator with the patched sources beside it serves the command (until the timeout stops it)
    with pytest.raises(subprocess.TimeoutExpired) as served:
        simulate(argv, overlay, timeout=20)
    out = served.value.stdout or b""
    assert b"Application startup complete" in (out if isinstance(out, bytes) else out.encode())


def probe(venv: Path, target: Path, overlay: Path | None = None) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), **realengine.env(VERSION)}
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    r = subprocess.run([str(venv / "bin" / "python"), str(PROBE), str(target)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_patched_classes_are_eagle3_targets_and_take_kimis_media_token(venv, models, overlay):
    target, _ = models["kimi_k25"]
    media = json.loads((target / "config.json").read_text())["media_placeholder_token_id"]

    stock = probe(venv, target)
    assert stock["vllm"] == VERSION and stock["vllm_file"].startswith(str(venv))
    assert not any(stock["supports_eagle3"].values()), stock
    assert "aux_layers" not in stock
    err = stock["image_token"]["error"]
    assert err == "AttributeError: 'KimiK25Config' object has no attribute 'image_token_index'"
    assert triage_lines(["Traceback (most recent call last):", '  File "eagle.py", line 1370, in load_model', err]
                        ).signature == "kimi-image-token-index"

    patched = probe(venv, target, overlay)
    assert patched["vllm_file"] == str(overlay / "vllm" / "__init__.py")
    assert patched["supports_eagle3"] == {"DeepseekV2ForCausalLM": True, "DeepseekV3ForCausalLM": True,
                                          "KimiK25ForConditionalGeneration": True}
    # the taps a 61-layer Kimi-K2.5 captures: vLLM's default (2, n // 2, n - 3), through the wrapper too
    assert patched["aux_layers"] == {"DeepseekV2ForCausalLM": [2, 30, 58],
                                     "KimiK25ForConditionalGeneration": [2, 30, 58],
                                     "set_through_the_wrapper": [2, 30, 58]}
    assert patched["media_placeholder_token_id"] == media
    assert patched["image_token"] == {"image_token_index": media}


def test_the_probe_reports_the_seeds_problems_gone_with_the_patch_set(venv, models, overlay):
    """`specdeploy probe` on the Kimi-K2 target with its drafter: the stock 0.16.0 refuses it twice (the EAGLE-3
    model-type list, then SupportsEagle3); the same probe with the patch set applied (the patched copy first on
    the engine's path) finds neither, and the drafter loads."""
    from specdeploy.checks.probe import probe
    target, drafter = models["kimi_k2"]
    stock, run = probe(target, drafter, "vllm", VERSION, venv=str(venv), trust_remote_code=True)
    assert run.ran
    errors = {f.subject for f in stock.findings if f.severity == "error"}
    assert errors == {"eagle3 target whitelist", "SupportsEagle3"}, stock.findings
    patched, run = probe(target, drafter, "vllm", VERSION, venv=str(venv), trust_remote_code=True,
                         env={"PYTHONPATH": str(overlay)})
    assert run.ran and run.version.startswith(VERSION)
    assert [f for f in patched.findings if f.severity == "error"] == [], patched.findings
    said = {f.subject: f.message for f in patched.findings}
    assert "implements SupportsEagle3" in said["target"] and "places every checkpoint tensor" in said["drafter load"]
