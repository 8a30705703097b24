"""The weight-cache daemon per release, as the adapters answer from their tables: which releases have one and
which specdeploy attaches engines to, which checkpoints it can hold, what the daemon is started with (exactly the
engine's weight-shaping flags, so an engine-only change never restarts it) and how the engine attaches."""
from __future__ import annotations

import json

import pytest

from specdeploy.engines import get_adapter
from specdeploy.engines.weightcache import health, quant_kind
from specdeploy.hostvars.schema import validate_host

SOCKETS = "/var/lib/specdeploy/weight-cache/x"
FP8_BLOCK = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e4m3",
                                     "activation_scheme": "dynamic"}}


def hv(engine="vllm", version="0.32.0", **over):
    base = {"specdeploy_engine": engine, "specdeploy_engine_version": version, "specdeploy_model_path": "/models/k",
            "specdeploy_hardware": "h200_nvl8", "specdeploy_spec_enabled": engine == "vllm",
            "specdeploy_drafter_path": "/models/d", "specdeploy_weight_cache": "on"}
    base.update(over)
    return validate_host("h", base)


@pytest.mark.parametrize("config,kind", [
    ({}, "none"),
    (FP8_BLOCK, "fp8-block"),
    ({"quantization_config": {"quant_method": "fp8"}}, "fp8"),
    ({"text_config": {"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"}}},
     "compressed-tensors"),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "modelopt-nvfp4"),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}, "modelopt-fp8"),
    ({"quantization_config": {"quant_method": "mxfp4"}}, "mxfp4"),
])
def test_quant_kind_reads_the_checkpoint_config(config, kind):
    assert quant_kind(config) == kind


def test_the_example_kimi_k25_checkpoint_is_compressed_tensors():
    from helpers import MODEL
    assert quant_kind(json.loads((MODEL / "config.json").read_text())) == "compressed-tensors"


@pytest.mark.parametrize("version,ok,words", [
    ("0.16.0", False, ["has no weight-cache daemon", "first vLLM release with one is 0.30.0", "from 0.32.0"]),
    ("0.22.0", False, ["has no weight-cache daemon", "0.30.0"]),
    ("0.29.0", False, ["has no weight-cache daemon"]),
    ("0.30.0", False, ["has a weight-cache daemon", "from vLLM 0.32.0", "module"]),
    ("0.31.0", False, ["has a weight-cache daemon", "memory budget"]),
    ("0.32.0", True, ["serves this checkpoint (fp8-block)"]),
    ("0.33.0", True, ["serves this checkpoint"]),
])
def test_which_vllm_releases_attach(version, ok, words):
    s = get_adapter("vllm", version).weight_cache_support(hv(version=version, specdeploy_weight_cache="auto"),
                                                          "fp8-block")
    assert s.ok is ok and s.first == "0.30.0" and s.first_rendered == "0.32.0"
    for w in words:
        assert w in s.why, s.why


@pytest.mark.parametrize("version,ok,words", [
    ("0.5.16", False, ["has no weight-cache daemon", "0.5.17", "from 0.5.19"]),
    ("0.5.18", False, ["has a weight-cache daemon", "parser of their own"]),
    ("0.5.19", True, []),
    ("0.5.23", True, []),
])
def test_which_sglang_releases_attach(version, ok, words):
    s = get_adapter("sglang", version).weight_cache_support(hv("sglang", version, specdeploy_weight_cache="auto"),
                                                            "fp8-block")
    assert s.ok is ok, s.why
    for w in words:
        assert w in s.why, s.why


@pytest.mark.parametrize("engine,version,quant,ok", [
    ("vllm", "0.32.0", "none", True), ("vllm", "0.32.0", "fp8", True), ("vllm", "0.32.0", "modelopt-nvfp4", True),
    ("vllm", "0.32.0", "compressed-tensors", False), ("vllm", "0.33.0", "modelopt-fp8", False),
    ("vllm", "0.32.0", "gptq", None), ("vllm", "0.32.0", None, None),
    ("sglang", "0.5.23", "none", True), ("sglang", "0.5.23", "fp8-block", True), ("sglang", "0.5.23", "fp8", False),
    ("sglang", "0.5.23", "compressed-tensors", False), ("sglang", "0.5.23", "modelopt-nvfp4", False),
])
def test_which_checkpoints_the_cache_holds(engine, version, quant, ok):
    s = get_adapter(engine, version).weight_cache_support(hv(engine, version), quant)
    assert s.ok is ok, s.why
    if quant == "compressed-tensors" and engine == "vllm":
        assert "CompressedTensorsLinearMethod" in s.why and "UnsupportedQuantForIPCError" in s.why


def test_sglang_refuses_it_with_speculation_and_for_pd():
    a = get_adapter("sglang", "0.5.23")
    spec = a.weight_cache_support(hv("sglang", "0.5.23", specdeploy_spec_enabled=True,
                                     specdeploy_weight_cache="auto"), "fp8-block")
    assert spec.ok is False and "speculative decoding" in spec.why
    assert a.weight_cache_support(hv("sglang", "0.5.23"), "fp8-block").ok is True
    pd = a.weight_cache_support(hv("sglang", "0.5.23", specdeploy_topology="pd", specdeploy_group="g",
                                   specdeploy_pd_role="prefill", specdeploy_weight_cache="auto"), "fp8-block")
    assert pd.ok is False and "prefill/decode" in pd.why


def test_vllm_033_refuses_it_with_eplb():
    s = get_adapter("vllm", "0.33.0").weight_cache_support(
        hv(version="0.33.0", specdeploy_engine_extra_args=["--enable-eplb"], specdeploy_weight_cache="auto"), "none")
    assert s.ok is False and "EPLB" in s.why
    assert get_adapter("vllm", "0.32.0").weight_cache_support(
        hv(specdeploy_engine_extra_args=["--enable-eplb"]), "none").ok is True


def test_on_where_the_release_has_none_is_a_validation_error():
    from specdeploy.values.errors import SpecdeployError
    with pytest.raises(SpecdeployError) as e:
        hv(version="0.16.0")
    assert "specdeploy_weight_cache" in str(e.value) and "pin vLLM >= 0.32.0" in str(e.value)
    hv(version="0.16.0", specdeploy_weight_cache="auto")  # auto: no error, no daemon


def _daemon(h, engine="vllm", version="0.32.0"):
    return get_adapter(engine, version).weight_cache_daemon(h, None, SOCKETS)


def test_vllm_daemon_takes_the_engines_weight_shaping_flags_only():
    d = _daemon(hv(specdeploy_engine_extra_args=["--dtype", "bfloat16", "--max-num-seqs", "64",
                                                 "--enable-prefix-caching"]))
    assert d.argv[:4] == ["vllm", "preload", "--model", "/models/k"]
    assert "--dtype" in d.argv and "bfloat16" in d.argv and "--tensor-parallel-size" in d.argv
    assert "--max-num-seqs" not in d.argv and "--enable-prefix-caching" not in d.argv
    assert "--speculative-config" not in d.argv and "--gpu-memory-utilization" not in d.argv
    assert d.argv[d.argv.index("--weight-cache-socket-dir") + 1] == SOCKETS
    assert d.health == "http://127.0.0.1:9461/health" and d.local_ranks == 8
    assert "draft_load_config" in d.drafter


def test_an_engine_only_change_leaves_the_daemon_as_it_was():
    a = get_adapter("vllm", "0.32.0")
    same = [hv(), hv(specdeploy_spec_enabled=False), hv(specdeploy_spec_num_tokens=5),
            hv(specdeploy_engine_extra_args=["--max-num-seqs", "8"]), hv(specdeploy_gpu_memory_utilization=0.8),
            hv(specdeploy_spec_k_by_batch=[{"from_batch": 1, "k": 3}, {"from_batch": 16, "k": 1}])]
    argvs = {tuple(a.weight_cache_daemon(h, None, SOCKETS).argv) for h in same}
    assert len(argvs) == 1
    for other in (hv(specdeploy_model_path="/models/other"), hv(specdeploy_tensor_parallel_size=4),
                  hv(specdeploy_engine_extra_args=["--quantization", "fp8"]), hv(specdeploy_expert_parallel=True)):
        assert tuple(a.weight_cache_daemon(other, None, SOCKETS).argv) not in argvs


def test_vllm_engine_attaches_with_ipc_cache_and_loads_its_drafter_from_disk():
    argv = get_adapter("vllm", "0.32.0").command(hv(specdeploy_load_format="fastsafetensors"), "/d").argv
    assert argv[argv.index("--load-format") + 1] == "ipc_cache" and argv.count("--load-format") == 1
    extra = json.loads(argv[argv.index("--model-loader-extra-config") + 1])
    assert extra == {"socket_dir": "/var/lib/specdeploy/weight-cache/vllm", "fallback": False,
                     "state_timeout_s": 120}
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    # without it 0.32.0 sends the drafter to the daemon's draft group, which is not started
    assert spec["draft_load_config"] == {"load_format": "fastsafetensors"}
    daemon = _daemon(hv(specdeploy_load_format="fastsafetensors"))
    assert daemon.argv[daemon.argv.index("--load-format") + 1] == "fastsafetensors"
    off = get_adapter("vllm", "0.32.0").command(hv(specdeploy_weight_cache="auto"), "/d").argv
    assert "ipc_cache" not in off and "draft_load_config" not in " ".join(off)


def test_sglang_engine_attaches_in_client_mode_with_the_daemons_templates():
    a = get_adapter("sglang", "0.5.23")
    cmd = a.command(hv("sglang", "0.5.23"), None)
    assert cmd.argv[cmd.argv.index("--weight-cache-mode") + 1] == "client"
    d = a.weight_cache_daemon(hv("sglang", "0.5.23"), None, SOCKETS)
    assert d.argv[:3] == ["python", "-m", "sglang.srt.weight_cache.daemon"]
    assert "--model-path" in d.argv and "--dist-init-method" in d.argv and "--enable-metrics" not in d.argv
    assert cmd.env["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"].endswith("/{device_uuid}.sock")
    assert d.env["SGLANG_WEIGHT_CACHE_READY_TEMPLATE"] == f"{SOCKETS}/{{device_uuid}}.ready"
    assert d.health == f"files:{SOCKETS}/*.ready:8" and d.host_pid


def test_memory_fraction_leaves_the_daemons_overhead_room():
    a = get_adapter("vllm", "0.32.0")
    assert a.memory_fraction(hv(specdeploy_gpu_memory_utilization=0.9), True) == 0.9
    assert a.memory_fraction(hv(specdeploy_gpu_memory_utilization=0.99), True) == 0.97  # (1 - 3/140) floored
    assert a.memory_fraction(hv(specdeploy_gpu_memory_utilization=0.99), False) == 0.99


def test_the_longest_socket_path_fits_a_unix_socket():
    from specdeploy.values.hostpaths import SOCKET_PATH_MAX, host_path
    vllm = f"{host_path('weight_cache_sockets', 'vllm')}/vllm_weight_cache_{'0' * 32}_draft.sock"
    uuid = f"GPU-{'0' * 8}-{'0' * 4}-{'0' * 4}-{'0' * 4}-{'0' * 12}"  # nvidia-smi's form
    sglang = f"{host_path('weight_cache_sockets', 'sglang')}/{uuid}.ready"
    assert len(vllm.encode()) <= SOCKET_PATH_MAX and len(sglang.encode()) <= SOCKET_PATH_MAX


def test_health_reads_ready_files_and_refuses_what_is_not_a_check(tmp_path):
    import os
    (tmp_path / "a.ready").write_text(f"pid={os.getpid()}\n")
    (tmp_path / "b.ready").write_text("pid=999999999\n")
    (tmp_path / "c.ready").write_text("garbage\n")
    assert health(f"files:{tmp_path}/*.ready:1") == (True, "1 of 1 ranks ready (3 ready files)")
    assert health(f"files:{tmp_path}/*.ready:2")[0] is False
    assert health("ftp://x")[0] is False and health("files:x")[0] is False


def test_compile_caches_per_release():
    v16 = get_adapter("vllm", "0.16.0").compile_cache_env("/c")
    assert v16 == {"VLLM_CACHE_ROOT": "/c/vllm", "TRITON_CACHE_DIR": "/c/triton",
                   "FLASHINFER_WORKSPACE_BASE": "/c/flashinfer", "CUDA_CACHE_PATH": "/c/nv"}
    assert get_adapter("sglang", "0.5.23").compile_cache_env("/c") == {"SGLANG_CACHE_DIR": "/c/sglang"}
    assert get_adapter("sglang", "0.5.10").compile_cache_env("/c") == {}  # not read
