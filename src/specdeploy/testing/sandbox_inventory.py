"""The sandbox's inventory and checkpoints: ``inventory/sandbox`` for the hosts ``sandbox up`` booted (the
simulator or a real vLLM CPU build serving), and how the realistic-size sparse model and drafter they stage are
built and keyed. ``testing/sandbox.py`` boots the hosts and calls these with its state (the key, the state
directory, the base image); nothing here reads that state itself."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from specdeploy.engines import DEFAULT as DEFAULT_ENGINE
from specdeploy.engines import adapters as engine_adapters
from specdeploy.testing import cache as _cache


def write_inventory(hosts: list, dest: Path, key: Path, artifacts: Path, base_image: str | None,
                    engine: str = DEFAULT_ENGINE, runtime: str = "docker", real_engine: str | None = None,
                    target: str = "deepseek_v3") -> Path:
    """inventory/sandbox: the hosts above as engine hosts (the first also runs the router and Prometheus).
    ``docker`` (the production runtime) runs the engine image built on each host; ``venv`` the host venv.
    ``real_engine``: the real vLLM of that version serves instead of the simulator (the venv runtime, from the
    venv ``up`` bound in), a tiny real ``target`` (``testing/tinymodels``) with its good EAGLE-3 drafter. ``key``:
    the sandbox's ssh key; ``artifacts``: where its model and drafter are; ``base_image``: what the stand-in engine
    images build from (the docker runtime)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "group_vars").mkdir(exist_ok=True)
    inv = {"all": {"children": {
        "specdeploy_engines": {"hosts": {h.name: {"ansible_host": h.address} for h in hosts}},
        "specdeploy_monitoring": {"hosts": {hosts[0].name: {}}},
        "specdeploy_routers": {"hosts": {hosts[0].name: {}}},
    }}}
    import yaml
    (dest / "hosts.yml").write_text("# Written by `specdeploy sandbox up`.\n" + yaml.safe_dump(inv, sort_keys=False))
    gv = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(key),
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        "ansible_python_interpreter": "/usr/bin/python3",
        "specdeploy_sandbox": True,
        "specdeploy_runtime": runtime,
        "specdeploy_engine": engine,
        # each engine's release: editing specdeploy_engine alone switches the hosts to the other engine
        "specdeploy_engine_versions": {e.name: e.sandbox_version for e in engine_adapters()},
        "specdeploy_hardware": "rtx_pro_6000_pcie",
        "specdeploy_model_path": "/models/kimi-k2.5-int4",
        "specdeploy_model_source": "controller",
        "specdeploy_model_controller_path": str(artifacts / "kimi-k2.5-int4"),
        "specdeploy_served_model_name": "moonshotai/Kimi-K2.5",
        "specdeploy_spec_enabled": True,
        "specdeploy_spec_method": "eagle3",
        "specdeploy_drafter_path": "/models/kimi-k2.5-eagle3",
        "specdeploy_drafter_controller_path": str(artifacts / "kimi-k2.5-eagle3"),
        # the sandbox's checkpoints are sparse files, mostly holes: compressed in transit, the 2 GB drafter's copy
        # costs a sixth of the CPU alone and two thirds inside a deploy (bench/README.md, "The suite's CPU: sparse
        # copies"); real weights do not compress, so the role's default sends them as they are
        "model_store_rsync_args": ["--compress"],
        "specdeploy_spec_num_tokens": 3,
        "specdeploy_port": 8000,
        "specdeploy_router": "sglang-router" if len(hosts) > 1 else "none",
        "specdeploy_engine_env": {"SPECDEPLOY_SIM_LOAD_SECONDS": "3", "SPECDEPLOY_SIM_STEP_MS": "5"},
    }
    if real_engine:
        gv.update(real_engine_vars(real_engine, target))
    elif runtime == "docker":
        gv["engine_image_sandbox_base"] = base_image
    (dest / "group_vars" / "specdeploy_engines.yml").write_text(
        "---\n# Written by `specdeploy sandbox up`; edit freely: specdeploy_engine: sglang switches both hosts to "
        "SGLang\n# (its release is in specdeploy_engine_versions).\n"
        + yaml.safe_dump(gv, sort_keys=False))
    return dest


def real_engine_vars(version: str, target: str = "deepseek_v3") -> dict:
    """The variables of a sandbox host that serves a tiny real ``target`` with the real vLLM ``version``: the
    CPU build's needs (its KV-cache size, eager mode, a short context, one rank) through the ordinary variables."""
    from specdeploy.testing import realengine, tinymodels
    model = tinymodels.target(target)
    return {
        "specdeploy_runtime": "venv", "specdeploy_sandbox_engine": "real", "specdeploy_engine": realengine.ENGINE,
        "specdeploy_engine_version": version, "specdeploy_engine_venv_path": str(realengine.venv(version)),
        "specdeploy_hardware": "h200_nvl8", "specdeploy_tensor_parallel_size": 1,
        "specdeploy_model_path": f"/models/tiny-{target}",
        "specdeploy_model_controller_path": str(model),
        "specdeploy_drafter_path": f"/models/tiny-{target}-eagle3",
        "specdeploy_drafter_controller_path": str(tinymodels.drafter(target, "good")),
        "specdeploy_served_model_name": f"tiny-{target}", "specdeploy_spec_num_tokens": 1,
        "specdeploy_max_model_len": 512, "specdeploy_engine_extra_args": ["--max-num-seqs", "4", "--enforce-eager"],
        # TORCH_COMPILE_DISABLE: the hosts have no C++ compiler, which torch's inductor needs for the few small
        # functions vLLM compiles even with --enforce-eager (the vocabulary mask of a tensor-parallel embedding,
        # so a group's ranks need it); they run eagerly instead
        "specdeploy_engine_env": {**realengine.env(version, realengine.uses_mla(model)),
                                  "TORCH_COMPILE_DISABLE": "1"},
        "specdeploy_router": "none",
        # the CPU build shares no weights between processes (UnsupportedPlatformForIPCError): no daemon
        "specdeploy_weight_cache": "off",
    }


ARTIFACT_MODEL = "kimi-k2.5-int4"
ARTIFACT_DRAFTER = "kimi-k2.5-eagle3"


def example_model() -> Path:
    return Path(__file__).resolve().parents[3] / "examples" / "models" / ARTIFACT_MODEL


def artifacts_key() -> str:
    """What the sandbox checkpoints are made of: the fixture code and the example model's non-weight files."""
    from specdeploy.testing import fixtures
    return _cache.inputs_key(Path(fixtures.__file__), build_artifacts, example_model())


def build_artifacts(out: Path):
    from specdeploy.testing.fixtures import drafter_config, write_drafter, write_model
    # a realistic-size sparse EAGLE-3 drafter (trained convention: vLLM ids, layers.0.*)
    write_drafter(out / ARTIFACT_DRAFTER, drafter_config(eagle_config=None))
    # a small sharded checkpoint with every non-weight file a real Kimi-K2.5 checkpoint carries
    example = example_model()
    m = write_model(out / ARTIFACT_MODEL, json.loads((example / "config.json").read_text()))
    for f in sorted(example.iterdir()):
        if f.is_file() and f.name != "config.json":
            shutil.copyfile(f, m / f.name)
