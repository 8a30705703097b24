"""The weight-cache daemon in a host's plan: `specdeploy plan` renders the daemon unit and the attached engine for
vLLM 0.32.0 and SGLang 0.5.23 where the checkpoint (its config on the controller) can be held, neither for vLLM
0.16.0 or a Kimi-K2.5 INT4 checkpoint; the daemon's key moves only with the weights; compile caches per release."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers import MODEL, REPO
from unitcheck import have_analyze, verify
from specdeploy.hostvars.schema import validate_host
from specdeploy.plan import render_host
from specdeploy.values.errors import SpecdeployError

FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
DAEMON = "/etc/systemd/system/specdeploy-{}-weights.service"


@pytest.fixture
def fp8(tmp_path):
    """The example Kimi-K2.5 config with a block-FP8 quantization config (as DeepSeek-V3 ships it)."""
    cfg = json.loads((MODEL / "config.json").read_text())
    cfg["text_config"]["quantization_config"] = FP8
    d = tmp_path / "kimi-fp8"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def host(engine="vllm", version="0.32.0", copy=None, **over):
    v = {"specdeploy_engine": engine, "specdeploy_engine_version": version, "specdeploy_model_path": "/models/k",
         "specdeploy_hardware": "h200_nvl8", "specdeploy_spec_enabled": engine == "vllm",
         "specdeploy_drafter_path": "/models/d", "specdeploy_model_config_copy": str(copy or MODEL)}
    v.update(over)
    return validate_host("h", v)


def test_vllm_032_renders_the_daemon_and_the_attached_engine(fp8):
    p = render_host("h", host(copy=fp8))
    wc = p.weight_cache
    assert wc and wc["unit"] == "specdeploy-vllm-weights.service"
    unit = p.files[DAEMON.format("vllm")]
    assert "--entrypoint vllm specdeploy/vllm:0.32.0-none preload --model /models/k" in unit
    assert "--weight-cache-socket-dir" in unit and "/drafter/" not in unit
    assert "Restart=no" in unit and "ExecStartPost=/opt/specdeploy/venv/bin/specdeploy ready --within 3600 --url " \
        "http://127.0.0.1:9461/health" in unit
    engine = p.files["/etc/systemd/system/specdeploy-vllm.service"]
    assert "BindsTo=specdeploy-vllm-weights.service" in engine
    assert "After=network-online.target docker.service specdeploy-vllm-weights.service" in engine
    assert p.argv[p.argv.index("--load-format") + 1] == "ipc_cache"
    for f in ("/etc/specdeploy/specdeploy-vllm-weights.env", "/etc/specdeploy/specdeploy-vllm-weights.argv"):
        assert f in p.files
    # the sockets are mounted into both containers
    assert "-v /var/lib/specdeploy/weight-cache/vllm:/var/lib/specdeploy/weight-cache/vllm " in engine
    assert "-v /var/lib/specdeploy/weight-cache/vllm:/var/lib/specdeploy/weight-cache/vllm " in unit
    # the exporter reports its health
    exp = p.files["/etc/systemd/system/specdeploy-exporter.service"]
    assert "--weight-cache-health http://127.0.0.1:9461/health" in exp


def test_sglang_0523_renders_the_daemon_and_client_mode_without_speculation(fp8):
    p = render_host("h", host("sglang", "0.5.23", copy=fp8, specdeploy_spec_enabled=False))
    assert p.weight_cache and p.argv[p.argv.index("--weight-cache-mode") + 1] == "client"
    unit = p.files[DAEMON.format("sglang")]
    assert "--entrypoint python" in unit and "-m sglang.srt.weight_cache.daemon" in unit
    assert "--pid host" in unit and "--pid host" in p.files["/etc/systemd/system/specdeploy-sglang.service"]
    env = p.files["/etc/specdeploy/specdeploy-sglang.env"]
    assert "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE=/var/lib/specdeploy/weight-cache/sglang/{device_uuid}.sock" in env
    spec = render_host("h", host("sglang", "0.5.23", copy=fp8, specdeploy_spec_enabled=True))
    assert spec.weight_cache is None and "speculative decoding" in spec.weight_cache_why


def test_neither_for_vllm_016_nor_for_kimi_int4(fp8):
    old = render_host("h", host("vllm", "0.16.0", copy=fp8))
    assert old.weight_cache is None and "first vLLM release with one is 0.30.0" in old.weight_cache_why
    assert not any("weights" in f for f in old.files) and "ipc_cache" not in old.argv
    int4 = render_host("h", host(copy=MODEL))
    assert int4.weight_cache is None and "compressed-tensors" in int4.weight_cache_why
    assert "BindsTo" not in int4.files["/etc/systemd/system/specdeploy-vllm.service"]
    unknown = render_host("h", host(copy=None, specdeploy_model_config_copy=None))
    assert unknown.weight_cache is None and "not known" in unknown.weight_cache_why
    with pytest.raises(SpecdeployError, match="compressed-tensors"):
        render_host("h", host(copy=MODEL, specdeploy_weight_cache="on"))


def test_the_daemons_key_moves_with_the_weights_only(fp8):
    def key(**over):
        return render_host("h", host(copy=fp8, **over)).weight_cache["key"]
    base = key()
    for engine_only in ({"specdeploy_spec_enabled": False}, {"specdeploy_spec_num_tokens": 5},
                        {"specdeploy_engine_extra_args": ["--max-num-seqs", "16"]},
                        {"specdeploy_gpu_memory_utilization": 0.85}, {"specdeploy_port": 8100}):
        assert key(**engine_only) == base, engine_only
    for weights in ({"specdeploy_model_path": "/models/k2"}, {"specdeploy_tensor_parallel_size": 4},
                    {"specdeploy_engine_version": "0.33.0"}, {"specdeploy_engine_extra_args": ["--dtype", "float16"]},
                    {"specdeploy_expert_parallel": True}):
        assert key(**weights) != base, weights


def test_compile_caches_on_a_persistent_path_per_release(fp8):
    a = render_host("h", host(copy=fp8))
    b = render_host("h", host(copy=fp8, specdeploy_engine_version="0.33.0"))
    assert a.compile_cache and b.compile_cache and a.compile_cache != b.compile_cache
    assert a.compile_cache.startswith("/var/lib/specdeploy/compile-cache/vllm-0.32.0-")
    env = a.files["/etc/specdeploy/specdeploy-vllm.env"]
    for var in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH"):
        assert f"{var}={a.compile_cache}/" in env
    assert f"-v {a.compile_cache}:{a.compile_cache} " in a.files["/etc/systemd/system/specdeploy-vllm.service"]
    # the daemon writes FlashInfer's autotune configs where the engine reads them
    assert f"VLLM_CACHE_ROOT={a.compile_cache}/vllm" in a.files["/etc/specdeploy/specdeploy-vllm-weights.env"]
    off = render_host("h", host(copy=fp8, specdeploy_compile_cache=False))
    assert off.compile_cache is None and "VLLM_CACHE_ROOT" not in off.files["/etc/specdeploy/specdeploy-vllm.env"]


@pytest.mark.skipif(not have_analyze(), reason="systemd-analyze is not installed")
@pytest.mark.parametrize("runtime", ["docker", "venv"])
def test_the_daemon_and_its_engine_units_verify(fp8, tmp_path, runtime):
    p = render_host("h", host(copy=fp8, specdeploy_runtime=runtime))
    units = {path.rsplit("/", 1)[1]: text for path, text in p.files.items() if path.endswith(".service")}
    assert "specdeploy-vllm-weights.service" in units
    assert verify(units, tmp_path) == ""  # no warning either


def test_plan_command_for_vllm_032_shows_the_daemon(fp8, tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory/example", inv)
    gv = inv / "group_vars" / "specdeploy_engines.yml"
    data = yaml.safe_load(gv.read_text())
    data["specdeploy_model_config_copy"] = str(fp8)
    gv.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "plan", "-i", str(inv), "--limit", "gpu-a",
                        "-e", "specdeploy_engine_version=0.32.0", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["hosts"]["gpu-a"]
    assert p["weight_cache"]["unit"] == "specdeploy-vllm-weights.service" and "ipc_cache" in p["argv"]
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "plan", "-i", str(inv), "--limit", "gpu-a"],
                       capture_output=True, text=True)
    assert "has no weight-cache daemon" in r.stdout and "0.30.0" in r.stdout  # the example pins 0.16.0


@pytest.mark.parametrize("state,result,says", [("failed", "signal", True), ("inactive", "success", True),
                                               ("activating", "success", True), ("active", "success", False)])
def test_the_engine_says_in_its_journal_that_it_stopped_with_its_daemon(fp8, tmp_path, state, result, says):
    """systemd stops a unit bound to one that died and logs nothing of its own about it: the engine unit's
    ExecStopPost= writes the line triage reads, run here as systemd would run it (a fake systemctl answering and
    recording what it is asked). Only a failed daemon also stops the engine for good (no auto-restart that would
    reload the daemon); a daemon a deploy stops or starts on purpose is never failed, so a deploy's start of the
    engine is never cancelled."""
    import shlex

    from specdeploy.triage import triage_lines
    engine = render_host("h", host(copy=fp8)).files["/etc/systemd/system/specdeploy-vllm.service"]
    line = next(x for x in engine.splitlines() if x.startswith("ExecStopPost="))
    assert line.startswith("ExecStopPost=-+")  # privileged: it may stop a unit
    argv = [a.replace("$$", "$") for a in shlex.split(line.removeprefix("ExecStopPost=-+"))]
    assert argv[:2] == ["/bin/sh", "-c"]
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "systemctl").write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                                    f"case \"$1\" in is-active) echo {state};; show) echo {result};; esac\n")
    (fake / "systemctl").chmod(0o755)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True,
                         env={"PATH": f"{fake}:/usr/bin:/bin"}).stdout
    assert bool(out.strip()) == says, out
    stops = [c for c in calls.read_text().splitlines() if c.startswith("stop")]
    assert stops == (["stop --no-block specdeploy-vllm.service"] if state == "failed" else []), stops
    if says:
        journal = ["Stopping specdeploy-vllm.service - specdeploy vllm 0.32.0 inference engine...",
                   "INFO:     Shutting down", "INFO:     Application shutdown complete.", *out.splitlines(),
                   "specdeploy-vllm.service: Deactivated successfully."]
        r = triage_lines(journal)
        assert (r.outcome, r.signature) == ("killed", "bound-unit-stopped"), r
        assert f"specdeploy-vllm-weights.service, which is {state} (result: {result})" in r.root_cause
    no_daemon = render_host("h", host("vllm", "0.16.0", copy=fp8)).files["/etc/systemd/system/specdeploy-vllm.service"]
    assert "ExecStopPost" not in no_daemon
