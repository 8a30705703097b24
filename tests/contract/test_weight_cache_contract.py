"""The weight-cache tables of both adapters against the releases' own sources: where the daemon exists and how each
release starts it, every flag specdeploy renders for the daemon and for the attached engine, the ipc_cache loader's
config keys, what the engine does without its daemon, the memory accounting, the quantizations the cache holds, and
the compile caches' environment. Each claimed span is read at its first and last release and just outside it."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from specdeploy.engines import get_adapter, upstream
from specdeploy.engines import sglang_tables as S
from specdeploy.engines import vllm_tables as V
from specdeploy.hostvars.schema import validate_host
from specdeploy.testing import engine_facts

from .upstream_facts import sglang_flags, vllm_flags, vllm_load_formats

pytestmark = pytest.mark.contract

WC = "vllm/model_executor/model_loader/weight_cache"
VLLM_READ = ("0.16.0", "0.22.0", "0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
SGLANG_READ = ("0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.22", "0.5.23")


def src(engine: str, version: str) -> Path:
    return upstream.source(engine, version)


def text(root: Path, rel: str) -> str:
    p = root / rel
    return p.read_text() if p.is_file() else ""


def literals(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and re.fullmatch(r"--[a-z0-9-]+", n.value)}


def vllm_has(root: Path) -> dict[str, bool]:
    """Each WEIGHT_CACHE capability as the release's sources show it."""
    ipc, daemon = text(root, f"{WC}/ipc_loader.py"), text(root, f"{WC}/daemon.py")
    utils = text(root, "vllm/model_executor/model_loader/utils.py")
    return {
        "daemon": (root / WC).is_dir() and "ipc_cache" in vllm_load_formats(root),
        "module_launcher": 'if __name__ == "__main__"' in daemon,
        "preload": (root / "vllm/entrypoints/cli/preload.py").is_file(),
        "data_parallel": bool(daemon) and "data parallelism\": parallel_config.data_parallel_size > 1" not in daemon
        and "data_parallel_size" in daemon,
        "startup_wait": "_with_startup_wait" in ipc,
        "draft_group": '"is_draft": True' in utils,
        "external_memory": "def get_external_weight_memory" in ipc,
        "engine_outlives_daemon": "keeps serving" in ipc and "def _watch_daemon" in ipc,
    }


@pytest.mark.parametrize("version", VLLM_READ)
def test_vllm_weight_cache_capabilities(version):
    have = vllm_has(src("vllm", version))
    for cap, span in V.WEIGHT_CACHE.items():
        assert have[cap] == span.contains(version), f"vLLM {version}: {cap} is {have[cap]}, the table says " \
                                                    f"{span}"


@pytest.mark.parametrize("version", [v for v in VLLM_READ if V.WEIGHT_CACHE["daemon"].contains(v)])
def test_vllm_daemon_and_engine_flags_and_loader_keys(version):
    root = src("vllm", version)
    launcher = root / ("vllm/entrypoints/cli/preload.py" if V.WEIGHT_CACHE["preload"].contains(version)
                       else f"{WC}/daemon.py")
    own = literals(launcher)
    for flag, span in V.WEIGHT_CACHE_FLAGS.items():
        assert (flag in own) == span.contains(version), f"vLLM {version}: {flag}"
    engine_flags = vllm_flags(root)
    for flag in V.WEIGHT_CACHE_ENGINE_FLAGS + ("--load-format", "--model-loader-extra-config"):
        span = V.FLAGS.get(flag)
        if span is None or span.contains(version):
            assert flag in engine_flags, f"vLLM {version} has no {flag}"
    ipc = text(root, f"{WC}/ipc_loader.py")
    for key in V.WEIGHT_CACHE_LOADER_KEYS:
        assert f'extra_config.pop("{key}"' in ipc, f"vLLM {version}: ipc_cache loader key {key}"
    # and the loader refuses any other key
    assert "Unexpected extra config keys for load format" in ipc


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_every_flag_vllm_renders_exists_in_the_release(version):
    """The daemon's and the attached engine's command lines for a host with every weight-shaping option."""
    root = src("vllm", version)
    a = get_adapter("vllm", version)
    hv = validate_host("h", {"specdeploy_engine": "vllm", "specdeploy_engine_version": version,
                             "specdeploy_model_path": "/m", "specdeploy_hardware": "h200_nvl8",
                             "specdeploy_weight_cache": "on", "specdeploy_spec_enabled": True,
                             "specdeploy_drafter_path": "/d", "specdeploy_expert_parallel": True,
                             "specdeploy_load_format": "safetensors",
                             "specdeploy_engine_extra_args": ["--dtype", "bfloat16", "--revision", "r",
                                                              "--language-model-only"]})
    d = a.weight_cache_daemon(hv, None, "/s")
    preload = literals(root / "vllm/entrypoints/cli/preload.py") | vllm_flags(root)
    assert {x for x in d.argv if x.startswith("--")} <= preload
    argv = a.command(hv, "/d").argv
    assert {x for x in argv if x.startswith("--")} <= vllm_flags(root)
    assert "ipc_cache" in vllm_load_formats(root)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert "draft_load_config" in engine_facts.extract("vllm", root)["spec_keys"] and "draft_load_config" in spec


def _declares(path: Path, cls: str) -> str | None:
    """How a quant-method class sets supports_pre_processed_weights: 'true' (a class attribute or an __init__
    assignment of True or of a condition), 'property', or None where it does not (the base's False applies)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef) and item.name == "supports_pre_processed_weights":
                    return "property"
                if isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    if any(getattr(t, "attr", getattr(t, "id", None)) == "supports_pre_processed_weights"
                           for t in targets):
                        v = item.value
                        return "false" if isinstance(v, ast.Constant) and v.value is False else "true"
            return None
    raise AssertionError(f"no class {cls} in {path}")


def _class_file(root: Path, cls: str) -> Path:
    for f in sorted((root / "vllm/model_executor").rglob("*.py")):
        if f"class {cls}(" in f.read_text(errors="replace"):
            return f
    raise AssertionError(f"no class {cls} under {root}")


@pytest.mark.parametrize("version", V.WEIGHT_CACHE_QUANT_READ)
def test_vllm_quantizations_the_cache_holds(version):
    root = src("vllm", version)
    for quant, (served, classes) in V.WEIGHT_CACHE_QUANT.items():
        for cls in classes:
            how = _declares(_class_file(root, cls), cls)
            if served:
                assert how in ("true", "property"), f"vLLM {version}: {cls} ({quant}) does not declare it"
                if how == "property":  # ModelOpt's: pre-processed weights for its FP4 weights
                    assert "FP4_DTYPE" in _class_file(root, cls).read_text()
            else:
                assert how in (None, "false"), f"vLLM {version}: {cls} ({quant}) declares it"
    assert "class UnsupportedQuantForIPCError" in text(root, f"{WC}/protocol.py")


def sglang_has(root: Path) -> dict[str, bool]:
    srt = root / "sglang/srt"
    wc = srt / "weight_cache"
    sources = "".join(f.read_text(errors="replace") for f in sorted(srt.rglob("*.py"))
                      if "weight_cache" in f.read_text(errors="replace")) if wc.is_dir() else ""
    daemon, ipc = text(root, "sglang/srt/weight_cache/daemon.py"), text(root, "sglang/srt/weight_cache/ipc_loader.py")
    return {
        "daemon": wc.is_dir(),
        "server_args_launcher": "prepare_server_args(server_argv)" in daemon,
        "refuses_speculation": "--weight-cache-mode is not supported together with speculative" in sources,
        "client_disk_fallback": "socket file missing            -> fall back to disk load" in ipc
        or "Daemon socket not found" in ipc,
        "engine_watches_daemon": "_start_daemon_liveness_watchdog" in ipc,
        "preloaded_weights_accounted": "def account_preloaded_weights" in text(
            root, "sglang/srt/model_executor/model_runner.py"),
    }


@pytest.mark.parametrize("version", SGLANG_READ)
def test_sglang_weight_cache_capabilities(version):
    have = sglang_has(src("sglang", version))
    for cap, span in S.WEIGHT_CACHE.items():
        assert have[cap] == span.contains(version), f"SGLang {version}: {cap} is {have[cap]}, the table says {span}"


@pytest.mark.parametrize("version", [v for v in SGLANG_READ if S.WEIGHT_CACHE_RENDERED.contains(v)])
def test_every_key_and_flag_sglang_renders_exists_in_the_release(version):
    root = src("sglang", version)
    server = sglang_flags(root)
    daemon = literals(root / "sglang/srt/weight_cache/daemon.py")
    for flag, span in S.WEIGHT_CACHE_FLAGS.items():
        assert (flag in server or flag in daemon) == span.contains(version), f"SGLang {version}: {flag}"
    env = text(root, "sglang/srt/environ.py")
    for var in S.WEIGHT_CACHE_ENV:
        assert var in env and "{device_uuid}" in env, var
    a = get_adapter("sglang", version)
    hv = validate_host("h", {"specdeploy_engine": "sglang", "specdeploy_engine_version": version,
                             "specdeploy_model_path": "/m", "specdeploy_hardware": "h200_nvl8",
                             "specdeploy_weight_cache": "on", "specdeploy_expert_parallel": True,
                             "specdeploy_engine_extra_args": ["--dtype", "bfloat16", "--moe-a2a-backend", "deepep"]})
    d = a.weight_cache_daemon(hv, None, "/s")
    assert {x for x in d.argv if x.startswith("--")} <= server | daemon
    assert {x for x in a.command(hv).argv if x.startswith("--")} <= server
    # the allowlist: unquantized, and FP8 only block-wise
    proto = ast.parse(text(root, "sglang/srt/weight_cache/protocol.py"))
    allow = next(n.value for n in ast.walk(proto) if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", "") == "IPC_QUANT_ALLOWLIST" for t in n.targets))
    assert {k.value for k in allow.keys} == {"", "fp8"}
    assert "weight_block_size" in text(root, "sglang/srt/weight_cache/protocol.py")
    served = {q for q, (ok, _) in S.WEIGHT_CACHE_QUANT.items() if ok}
    assert served == {"none", "fp8-block"}


@pytest.mark.parametrize("engine,version", [("vllm", "0.16.0"), ("vllm", "0.32.0"), ("vllm", "0.33.0"),
                                            ("sglang", "0.5.19"), ("sglang", "0.5.23")])
def test_compile_cache_environment(engine, version):
    """The variables specdeploy points at the persistent compile cache are the ones the release reads (vLLM's own,
    Triton's, which vLLM's compiler interface sets and reads; FlashInfer's workspace and CUDA's JIT cache, named by
    SGLang's environ.py, which sets them under its one root)."""
    root = src(engine, version)
    env = get_adapter(engine, version).compile_cache_env("/c")
    if engine == "vllm":
        assert "VLLM_CACHE_ROOT" in text(root, "vllm/envs.py")
        assert "TRITON_CACHE_DIR" in text(root, "vllm/compilation/compiler_interface.py")
        assert "torch_compile_cache" in text(root, "vllm/compilation/backends.py")
        sg = text(src("sglang", "0.5.23"), "sglang/srt/environ.py")
        assert '"FLASHINFER_WORKSPACE_BASE"' in sg and '"CUDA_CACHE_PATH"' in sg
        assert set(env) == {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH"}
    else:
        e = text(root, "sglang/srt/environ.py")
        assert "SGLANG_CACHE_DIR" in e and "def redirect_third_party_caches" in e
        for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"):
            assert var in e
        assert env == {"SGLANG_CACHE_DIR": "/c/sglang"}
