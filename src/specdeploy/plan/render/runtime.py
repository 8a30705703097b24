"""Runtime wrapping: how the engine command runs on a host, in a container (``docker run`` for the unit,
community.docker parameters for Ansible) or from the host venv (the engine simulator's on a sandbox host)."""
from __future__ import annotations

from specdeploy.plan.images import image_tag
from specdeploy.hostvars.schema import HostVars
from specdeploy.plan.render.paths import CRED_TOKEN, converted_drafter_path, engine_files, secret_env_path, unit_name


def gpu_count(hv: HostVars) -> int:
    """GPUs a container gets: the hardware profile's, none on a sandbox host (it has no GPUs)."""
    return 0 if hv.specdeploy_sandbox else hv.profile().gpu_count


# Unlimited locked memory is for the GPUs (CUDA pinned host memory, NCCL); a host without GPUs gets the stack
# limit only. (A sandbox host could not raise it anyway: its MEMLOCK hard limit is the controller's.)
GPU_ULIMITS = {"memlock": "-1"}
ULIMITS = {"stack": "67108864"}


def container_spec(hv: HostVars, image: str, name: str, rw_mounts: tuple[str, ...] = ()) -> dict:
    """What every container of this host's engine gets (the engine unit, NCCL tuning): image, GPUs, IPC,
    network, ulimits and the read-only model and drafter mounts. One place, two renderings: ``docker run``
    argv (:func:`docker_run_argv`) and community.docker.docker_container parameters (:func:`container_params`)."""
    mounts = [(hv.specdeploy_model_path, True)]
    drafter = converted_drafter_path(hv)
    if drafter:
        mounts.append((drafter, True))
    mounts += [(m, False) for m in rw_mounts]
    gpus = gpu_count(hv)
    return {"name": name, "image": image, "gpus": gpus, "ipc": "host", "network": "host",
            "ulimits": {**(GPU_ULIMITS if gpus else {}), **ULIMITS}, "mounts": mounts}


def docker_run_argv(spec: dict, env_files: list[str], entry: str, args: list[str],
                    extra_volumes: list[str] = ()) -> list[str]:
    run = ["/usr/bin/docker", "run", "--rm", "--name", spec["name"]]
    if spec["gpus"]:
        run += ["--gpus", "all"]
    run += ["--ipc", spec["ipc"], "--network", spec["network"]]
    for k, v in spec["ulimits"].items():
        run += ["--ulimit", f"{k}={v}"]
    for f in env_files:
        run += ["--env-file", f]
    for v in extra_volumes:
        run += ["-v", v]
    for path, ro in spec["mounts"]:
        run += ["-v", f"{path}:{path}" + (":ro" if ro else "")]
    return run + ["--entrypoint", entry, spec["image"]] + list(args)


def container_params(spec: dict, entry: str, args: list[str], env: dict[str, str] | None = None) -> dict:
    """The same container as :func:`docker_run_argv`, as community.docker.docker_container parameters."""
    p = {"name": spec["name"], "image": spec["image"], "ipc_mode": spec["ipc"], "network_mode": spec["network"],
         "ulimits": [f"{k}:{v}:{v}" for k, v in spec["ulimits"].items()],
         "volumes": [f"{path}:{path}" + (":ro" if ro else "") for path, ro in spec["mounts"]],
         "entrypoint": [entry], "command": list(args), "env": dict(env or {})}
    if spec["gpus"]:
        p["device_requests"] = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    return p


def exec_argv(hv: HostVars, argv: list[str], image: str | None, secret_env: bool = False) -> list[str]:
    """Wrap the engine command for the runtime: docker run, or the host venv (the simulator's on a sandbox host).
    ``secret_env``: the engine takes its API key from the environment (a second, 0600 env file)."""
    engine = hv.specdeploy_engine
    if hv.specdeploy_runtime == "venv":
        if hv.specdeploy_sandbox and hv.specdeploy_sandbox_engine == "simulator":
            # The sandbox has no GPUs: the engine simulator takes the same command line.
            return [f"{hv.specdeploy_venv_path}/bin/specdeploy", "simulate", "--engine", engine,
                    "--engine-version", hv.specdeploy_engine_version, "--"] + argv
        if argv[0] == "python":
            return [f"{hv.engine_venv}/bin/python"] + argv[1:]
        return [f"{hv.engine_venv}/bin/{argv[0]}"] + argv[1:]
    name = unit_name(engine).removesuffix(".service")  # the container is named as the unit
    env_files = [engine_files(engine)[1]]
    if hv.specdeploy_api_key_file and secret_env:
        env_files.append(secret_env_path(engine))
    inner, volumes = list(argv), []
    if any(CRED_TOKEN in a for a in inner):
        volumes.append(f"{CRED_TOKEN}:/run/specdeploy-credentials:ro")
        inner = [a.replace(CRED_TOKEN, "/run/specdeploy-credentials") for a in inner]
    return docker_run_argv(container_spec(hv, image, name), env_files, inner[0], inner[1:], volumes)


def engine_image(hv: HostVars) -> str | None:
    if hv.specdeploy_runtime != "docker":
        return None
    return hv.specdeploy_image or image_tag(hv.specdeploy_engine, hv.specdeploy_engine_version,
                                            hv.specdeploy_engine_patches)


def tool_container(hv: HostVars, name: str, args: list[str], rw_mounts: tuple[str, ...] = (),
                   module: bool = True) -> dict:
    """A command in the engine's own environment (e.g. ``nccl tune``): the engine image with the engine unit's
    GPUs, IPC, ulimits and mounts (docker runtime), or the host venv. ``module``: ``args`` are specdeploy CLI
    arguments; else they are the Python interpreter's."""
    inner = (["-m", "specdeploy.cli"] if module else []) + list(args)
    image = engine_image(hv)
    if image is None:
        # the engine's own Python (its venv, where it has one of its own); specdeploy's CLI from specdeploy's venv
        head = [f"{hv.specdeploy_venv_path}/bin/specdeploy"] if module else [f"{hv.engine_venv}/bin/python"]
        return {"runtime": "venv", "argv": head + list(args)}
    spec = container_spec(hv, image, name, rw_mounts)
    return {"runtime": "docker", "argv": docker_run_argv(spec, [], "python3", inner),
            "params": container_params(spec, "python3", inner)}
