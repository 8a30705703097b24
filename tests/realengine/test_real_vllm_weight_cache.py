"""vLLM 0.32.0's CPU build on the weight cache, on what runs without a GPU:

- its own parsers take every flag specdeploy renders: `vllm preload` (the daemon's unit) and `vllm serve` attached
  to it (``--load-format ipc_cache``, the ipc_cache loader's config, the speculative config's
  ``draft_load_config``), and the engine's config classes build from them: the draft loads from disk with the
  engine instead of the daemon's draft group;
- the daemon does not start on a CPU: the release refuses the platform before it loads anything, in its own words,
  and triage names it.

What only a GPU can show: the daemon's load and its memory, the CUDA IPC mapping, how fast an engine attaches, the
engine's accounting of the daemon's weights (docs in bench/README.md)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from specdeploy.testing import realengine, tinymodels
from specdeploy.values.errors import SpecdeployError

pytestmark = pytest.mark.realengine
VERSION = "0.32.0"

PARSE = r'''
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.preload import PreloadSubcommand
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import get_draft_load_config
daemon, engine = json.loads(sys.argv[1]), json.loads(sys.argv[2])
p = FlexibleArgumentParser()
subs = p.add_subparsers(dest="subparser")
for cmd in (PreloadSubcommand(), ServeSubcommand()):
    cmd.subparser_init(subs)
d = p.parse_args(daemon[1:])
e = p.parse_args(engine[1:])
if getattr(e, "model_tag", None):  # `vllm serve MODEL`: the serve command moves its positional into --model
    e.model = e.model_tag
out = {"daemon": {k: getattr(d, k) for k in ("model", "tensor_parallel_size", "weight_cache_socket_dir",
                                               "weight_cache_master_port", "weight_cache_health_port",
                                               "weight_cache_health_host", "trust_remote_code")}}
ea = EngineArgs.from_cli_args(e)
vc = ea.create_engine_config()
draft = get_draft_load_config(vc)
out["engine"] = {"load_format": vc.load_config.load_format,
                 "extra": vc.load_config.model_loader_extra_config,
                 "draft_load_format": draft.load_format, "draft_extra": draft.model_loader_extra_config,
                 "gpu_memory_utilization": vc.cache_config.gpu_memory_utilization}
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def venv():
    try:
        return realengine.venv(VERSION)
    except SpecdeployError as exc:
        pytest.fail(f"the vLLM {VERSION} CPU venv could not be built: {exc}")


@pytest.fixture(scope="module")
def plan(venv, tmp_path_factory):
    """The plan specdeploy renders for a host of one GPU attached to its daemon, on the tiny Llama target (an
    unquantized checkpoint the weight cache holds) with its EAGLE-3 drafter."""
    from specdeploy.hostvars.schema import validate_host
    from specdeploy.plan import render_host
    try:
        target, drafter = tinymodels.target("llama"), tinymodels.drafter("llama", "good")
    except SpecdeployError as exc:
        pytest.fail(f"the tiny models could not be built: {exc}")
    sockets = tmp_path_factory.mktemp("s")
    hv = validate_host("h", {"specdeploy_engine": "vllm", "specdeploy_engine_version": VERSION,
                             "specdeploy_model_path": str(target), "specdeploy_drafter_path": str(drafter),
                             "specdeploy_spec_enabled": True, "specdeploy_hardware": "h200_nvl8",
                             "specdeploy_tensor_parallel_size": 1, "specdeploy_runtime": "venv",
                             "specdeploy_model_config_copy": str(target), "specdeploy_max_model_len": 512,
                             "specdeploy_engine_extra_args": ["--enforce-eager"]})
    p = render_host("h", hv)
    assert p.weight_cache, p.weight_cache_why
    return p, target, drafter, sockets


def env():
    return {**os.environ, **realengine.env(VERSION), "VLLM_LOGGING_LEVEL": "WARNING"}


def test_the_releases_parsers_take_every_flag_specdeploy_renders(venv, plan):
    p, target, drafter, _ = plan
    # the engine's drafter path is the converted one on a host: the tiny drafter's here
    engine = [drafter if a == "/var/lib/specdeploy/drafter/vllm" else a for a in p.argv]
    engine = [a.replace("/var/lib/specdeploy/drafter/vllm", str(drafter)) for a in engine]
    r = subprocess.run([str(venv / "bin/python"), "-c", PARSE, json.dumps(p.weight_cache["argv"]),
                        json.dumps(engine)], capture_output=True, text=True, env=env(), timeout=600)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(line[len("RESULT "):])
    assert got["daemon"] == {"model": str(target), "tensor_parallel_size": 1,
                             "weight_cache_socket_dir": "/var/lib/specdeploy/weight-cache/vllm",
                             "weight_cache_master_port": 29600, "weight_cache_health_port": 9461,
                             "weight_cache_health_host": "127.0.0.1", "trust_remote_code": True}
    e = got["engine"]
    assert e["load_format"] == "ipc_cache"
    assert e["extra"] == {"socket_dir": "/var/lib/specdeploy/weight-cache/vllm", "fallback": False,
                          "state_timeout_s": 120}
    # the drafter loads from disk with the engine, not from a draft group no daemon serves
    assert e["draft_load_format"] == "auto" and "is_draft" not in (e["draft_extra"] or {})


def test_the_daemon_refuses_this_platform_before_it_loads(venv, plan, tmp_path):
    from specdeploy.triage import triage_lines
    p, _, _, sockets = plan
    argv = [str(venv / "bin/vllm")] + p.weight_cache["argv"][1:]
    argv[argv.index("--weight-cache-socket-dir") + 1] = str(sockets)
    r = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    line = next(x for x in out.splitlines() if "UnsupportedPlatformForIPCError:" in x)
    assert "platform 'cpu' does not support CUDA IPC weight sharing; only CUDA and ROCm are supported" in line
    assert not any(sockets.iterdir())  # nothing bound
    assert triage_lines(out.splitlines()).signature == "weight-cache-platform"
