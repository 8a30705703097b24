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
    if re.fullmatch(r"[A-Za-z0-9_./:,=@+-]*", value):
        return f"{key}={value}"
    return f'{key}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_env = None


def jinja_env() -> jinja2.Environment:
    global _env
    if _env is None:
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                                  undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                  trim_blocks=True, lstrip_blocks=True)
        _env.filters["systemd_quote"] = systemd_quote
        _env.filters["env_line"] = lambda kv: _env_line(*kv)
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


def exec_argv(hv: HostVars, argv: list[str], image: str | None) -> list[str]:
    """Wrap the engine command for the runtime: docker run, the host venv, or the simulator (sandbox)."""
    engine = hv.specdeploy_engine
    if hv.specdeploy_sandbox:
        # The sandbox has no GPUs: the engine simulator takes the same command line.
        return [f"{hv.specdeploy_venv_path}/bin/specdeploy", "simulate", "--engine", engine,
                "--version", hv.specdeploy_engine_version, "--"] + argv
    if hv.specdeploy_runtime == "venv":
        if argv[0] == "python":
            return [f"{hv.specdeploy_venv_path}/bin/python"] + argv[1:]
        return [f"{hv.specdeploy_venv_path}/bin/{argv[0]}"] + argv[1:]
    name = f"specdeploy-{engine}"
    mounts = [hv.specdeploy_model_path]
    drafter = converted_drafter_path(hv)
    if drafter:
        mounts.append(drafter)
    run = ["/usr/bin/docker", "run", "--rm", "--name", name, "--gpus", "all", "--ipc", "host",
           "--network", "host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
           "--env-file", f"{CONFIG_DIR}/{name}.env"]
    if hv.specdeploy_api_key_file and engine == "vllm":
        run += ["--env-file", f"{CONFIG_DIR}/secrets/{name}.env"]
    inner = list(argv)
    if any(CRED_TOKEN in a for a in inner):
        run += ["-v", f"{CRED_TOKEN}:/run/specdeploy-credentials:ro"]
        inner = [a.replace(CRED_TOKEN, "/run/specdeploy-credentials") for a in inner]
    for m in mounts:
        run += ["-v", f"{m}:{m}:ro"]
    entry = inner[0]
    return run + ["--entrypoint", entry, image] + inner[1:]


def render_host(host: str, hv: HostVars, address: str | None = None) -> HostPlan:
    adapter, cmd = engine_command(hv)
    env_vars, nccl_source = nccl_env.resolve(hv)
    env = dict(env_vars)
    env.update(cmd.env)
    env.update(hv.specdeploy_engine_env)
    image = None
    if hv.specdeploy_runtime == "docker" and not hv.specdeploy_sandbox:
        image = hv.specdeploy_image or image_tag(hv.specdeploy_engine, hv.specdeploy_engine_version,
                                                 hv.specdeploy_engine_patches)
    unit = unit_name(hv.specdeploy_engine)
    name = unit.removesuffix(".service")
    execv = exec_argv(hv, cmd.argv, image)
    ctx = dict(
        host=host, hv=hv, engine=hv.specdeploy_engine, version=hv.specdeploy_engine_version,
        unit=unit, name=name, exec_argv=execv, env_file=f"{CONFIG_DIR}/{name}.env",
        secret_env_file=(f"{CONFIG_DIR}/secrets/{name}.env"
                         if hv.specdeploy_api_key_file and cmd.secret_env else None),
        credential=(f"sglang-api-key.yaml:{CONFIG_DIR}/secrets/sglang-api-key.yaml"
                    if any(CRED_TOKEN in a for a in cmd.argv) else None),
        docker=(hv.specdeploy_runtime == "docker" and not hv.specdeploy_sandbox),
        user=SERVICE_USER, state_dir=STATE_DIR,
        start_timeout=hv.specdeploy_start_timeout,
    )
    j = jinja_env()
    files = {
        f"/etc/systemd/system/{unit}": j.get_template("engine.service.j2").render(**ctx),
        ctx["env_file"]: j.get_template("engine.env.j2").render(env=sorted(env.items()), nccl_source=nccl_source,
                                                                  host=host),
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
        runtime="simulator" if hv.specdeploy_sandbox else hv.specdeploy_runtime, tp=hv.tp,
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


def render_prometheus(targets: list[dict], rules_files: list[str] | None = None, scrape_interval: str = "15s") -> str:
    """Scrape config for engines, exporters, node exporter and DCGM exporter."""
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
