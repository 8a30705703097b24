"""Render what a deployment installs on a host, from the Jinja2 templates in ``templates/``.

The CLI (``specdeploy plan``) and Ansible (filter plugin ``specdeploy_render``) both call :func:`render_host`,
so a plan and a deploy cannot disagree.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from . import nccl_env
from .engines import get_adapter
from .images import image_tag
from .schema import HostVars

STATE_DIR = "/var/lib/specdeploy"
CONFIG_DIR = "/etc/specdeploy"
CRED_TOKEN = "${CREDENTIALS_DIRECTORY}"
SERVICE_USER = "specdeploy"


def templates_dir() -> Path:
    here = Path(__file__).resolve().parent
    for cand in (here / "templates", here.parents[1] / "templates"):
        if (cand / "engine.service.j2").is_file():
            return cand
    raise FileNotFoundError("specdeploy templates/ not found next to the package or in the source tree")


def systemd_quote(arg: str) -> str:
    """Quote one argument for an ExecStart= line. ``$`` and ``%`` are escaped except the credentials dir."""
    s = arg.replace("%", "%%")
    s = re.sub(r"\$(?!\{CREDENTIALS_DIRECTORY\})", "$$", s)
    if s and re.fullmatch(r"[A-Za-z0-9_@%+=:,./${}-]+", s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_line(key: str, value: str) -> str:
    """One line of a systemd ``EnvironmentFile=`` (which unquotes and unescapes)."""
    if re.fullmatch(r"[A-Za-z0-9_./:,=@+-]*", value):
        return f"{key}={value}"
    return f'{key}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _docker_env_line(key: str, value: str) -> str:
    """One line of a ``docker run --env-file`` file: docker takes everything after the first ``=`` verbatim
    (no quotes, no escapes), so a value is written as is and cannot hold a newline."""
    if "\n" in value or "\r" in value:
        raise ValueError(f"environment variable {key}: docker --env-file cannot carry a newline; "
                         "remove it from specdeploy_engine_env")
    return f"{key}={value}"


def parse_env_file(text: str, consumer: str) -> dict[str, str]:
    """Read an env file the way ``consumer`` (``systemd`` or ``docker``) does; used to check what we render."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, _, value = line.lstrip().partition("=")
        if consumer == "systemd":
            import shlex
            value = "".join(shlex.split(value, posix=True)) if value else ""
        out[key] = value
    return out


_env = None


def jinja_env() -> jinja2.Environment:
    global _env
    if _env is None:
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                                  undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                  trim_blocks=True, lstrip_blocks=True)
        _env.filters["systemd_quote"] = systemd_quote
        _env.filters["env_line"] = lambda kv: _env_line(*kv)
        _env.filters["docker_env_line"] = lambda kv: _docker_env_line(*kv)
    return _env


@dataclass
class HostPlan:
    host: str
    engine: str
    version: str
    runtime: str
    tp: int
    spec: bool
    nccl_source: str
    engine_unit: str
    exporter_unit: str
    argv: list[str]
    env: dict[str, str]
    image: str | None
    drafter_path: str | None
    files: dict[str, str] = field(default_factory=dict)  # path on host -> content
    ports: dict[str, int] = field(default_factory=dict)
    health: dict[str, str] = field(default_factory=dict)
    served_model_name: str = ""

    def summary(self) -> dict:
        return {"engine": self.engine, "version": self.version, "runtime": self.runtime, "tp": self.tp,
                "speculation": self.spec, "nccl": self.nccl_source, "ports": self.ports,
                "engine_unit": self.engine_unit, "exporter_unit": self.exporter_unit, "image": self.image,
                "drafter_path": self.drafter_path, "health": self.health,
                "served_model_name": self.served_model_name, "release": self.release_id()}

    def release_id(self) -> str:
        """Content hash of everything installed: the same inputs give the same release."""
        import hashlib
        import json
        blob = json.dumps({"files": self.files, "image": self.image}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def to_dict(self) -> dict:
        d = self.summary()
        d.update({"argv": self.argv, "env": self.env, "files": self.files})
        return d


def converted_drafter_path(hv: HostVars) -> str | None:
    if not (hv.specdeploy_spec_enabled and hv.specdeploy_drafter_path):
        return None
    return f"{STATE_DIR}/drafter/{hv.specdeploy_engine}"


def unit_name(engine: str) -> str:
    return f"specdeploy-{engine}.service"


def engine_command(hv: HostVars):
    adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    return adapter, adapter.command(hv, converted_drafter_path(hv))


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
        if hv.specdeploy_sandbox:
            # The sandbox has no GPUs: the engine simulator takes the same command line.
            return [f"{hv.specdeploy_venv_path}/bin/specdeploy", "simulate", "--engine", engine,
                    "--version", hv.specdeploy_engine_version, "--"] + argv
        if argv[0] == "python":
            return [f"{hv.specdeploy_venv_path}/bin/python"] + argv[1:]
        return [f"{hv.specdeploy_venv_path}/bin/{argv[0]}"] + argv[1:]
    name = f"specdeploy-{engine}"
    env_files = [f"{CONFIG_DIR}/{name}.env"]
    if hv.specdeploy_api_key_file and secret_env:
        env_files.append(f"{CONFIG_DIR}/secrets/{name}.env")
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
        head = [f"{hv.specdeploy_venv_path}/bin/specdeploy"] if module else [f"{hv.specdeploy_venv_path}/bin/python"]
        return {"runtime": "venv", "argv": head + list(args)}
    spec = container_spec(hv, image, name, rw_mounts)
    return {"runtime": "docker", "argv": docker_run_argv(spec, [], "python3", inner),
            "params": container_params(spec, "python3", inner)}


def render_host(host: str, hv: HostVars, address: str | None = None) -> HostPlan:
    adapter, cmd = engine_command(hv)
    env_vars, nccl_source = nccl_env.resolve(hv)
    env = dict(env_vars)
    env.update(cmd.env)
    env.update(hv.specdeploy_engine_env)
    image = engine_image(hv)
    unit = unit_name(hv.specdeploy_engine)
    name = unit.removesuffix(".service")
    execv = exec_argv(hv, cmd.argv, image, bool(cmd.secret_env))
    ctx = dict(
        host=host, hv=hv, engine=hv.specdeploy_engine, version=hv.specdeploy_engine_version,
        unit=unit, name=name, exec_argv=execv, env_file=f"{CONFIG_DIR}/{name}.env",
        secret_env_file=(f"{CONFIG_DIR}/secrets/{name}.env"
                         if hv.specdeploy_api_key_file and cmd.secret_env else None),
        credential=(f"{cmd.credential}:{CONFIG_DIR}/secrets/{cmd.credential}" if cmd.credential else None),
        docker=hv.specdeploy_runtime == "docker",
        user=SERVICE_USER, state_dir=STATE_DIR,
        start_timeout=hv.specdeploy_start_timeout,
    )
    j = jinja_env()
    files = {
        f"/etc/systemd/system/{unit}": j.get_template("engine.service.j2").render(**ctx),
        # One reader per env file: the container (docker --env-file) or systemd (venv), each in its own syntax.
        ctx["env_file"]: j.get_template("engine.env.j2").render(env=sorted(env.items()), nccl_source=nccl_source,
                                                                  host=host, consumer="docker" if ctx["docker"]
                                                                  else "systemd"),
        f"{CONFIG_DIR}/{name}.argv": " ".join(shlex.quote(a) for a in cmd.argv) + "\n",
    }
    exp_argv = [f"{hv.specdeploy_venv_path}/bin/specdeploy", "exporter", "--engine", hv.specdeploy_engine,
                "--engine-url", f"http://127.0.0.1:{hv.specdeploy_port}",
                "--listen", f"0.0.0.0:{hv.specdeploy_exporter_port}",
                "--info", f"version={hv.specdeploy_engine_version}",
                "--info", f"spec_tokens={hv.specdeploy_spec_num_tokens if hv.specdeploy_spec_enabled else 0}",
                "--info", f"drafter={converted_drafter_path(hv) or ''}",
                "--info", f"patch_set={image_patch_label(hv)}"]
    files["/etc/systemd/system/specdeploy-exporter.service"] = j.get_template("exporter.service.j2").render(
        exec_argv=exp_argv, engine_unit=unit, user=SERVICE_USER, state_dir=STATE_DIR)
    return HostPlan(
        host=host, engine=hv.specdeploy_engine, version=hv.specdeploy_engine_version,
        runtime=hv.specdeploy_runtime + ("+simulator" if hv.specdeploy_sandbox else ""), tp=hv.tp,
        spec=hv.specdeploy_spec_enabled, nccl_source=nccl_source, engine_unit=unit,
        exporter_unit="specdeploy-exporter.service", argv=cmd.argv, env=env, image=image,
        drafter_path=converted_drafter_path(hv), files=files,
        ports={"engine": hv.specdeploy_port, "exporter": hv.specdeploy_exporter_port},
        health={"liveness": adapter.health.liveness, "readiness": adapter.health.readiness},
        served_model_name=hv.served_model_name,
    )


def image_patch_label(hv: HostVars) -> str:
    from .patches import patch_set_id
    return patch_set_id(hv.specdeploy_engine, hv.specdeploy_engine_version, hv.specdeploy_engine_patches)


# Default listen ports of the host exporters the scrape config targets: Debian's prometheus-node-exporter
# (--web.listen-address ":9100") and NVIDIA's dcgm-exporter (-a ":9400"); sources in docs/monitoring.md.
NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400


def render_prometheus(targets: list[dict], rules_files: list[str] | None = None, scrape_interval: str = "15s") -> str:
    """Scrape config for engines, exporters, node exporter and DCGM exporter (a target's node_port and dcgm_port
    default to those exporters' own default ports)."""
    targets = [{"node_port": NODE_EXPORTER_PORT, "dcgm_port": DCGM_EXPORTER_PORT, **t} for t in targets]
    return jinja_env().get_template("prometheus.yml.j2").render(
        targets=targets, rules_files=rules_files or [], scrape_interval=scrape_interval)


def prometheus_targets(plans: list[tuple[str, str, HostPlan]]) -> list[dict]:
    """(host, address, plan) -> one target dict per host."""
    return [{"host": h, "address": a, "engine": p.engine, "engine_port": p.ports["engine"],
             "exporter_port": p.ports["exporter"]} for h, a, p in plans]


def render_router(worker_urls: list[str], port: int, venv: str, policy: str = "round_robin") -> str:
    """systemd unit for sglang-router in front of the replicas (it serves vLLM and SGLang workers alike)."""
    argv = [f"{venv}/bin/python", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", str(port),
            "--policy", policy, "--health-check-interval-secs", "5", "--retry-max-retries", "3",
            "--worker-urls", *worker_urls]
    return jinja_env().get_template("router.service.j2").render(exec_argv=argv, user=SERVICE_USER)
