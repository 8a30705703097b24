"""systemd rendering: the Jinja2 templates in ``templates/`` (every value goes in through a filter of
:mod:`specdeploy.plan.render.quoting`: ``exec_line``, ``unit_value``, ``env_line``, ``docker_env_line``, ``yaml``,
``yaml_plain``), and the router unit."""
from __future__ import annotations

from pathlib import Path

import jinja2

from specdeploy.plan.render.paths import SERVICE_USER
from specdeploy.plan.render.quoting import (docker_env_file_line, environment_file_line, exec_arg,  # noqa: F401
                                            exec_line, parse_env_file, unit_value, yaml_scalar)


def templates_dir() -> Path:
    here = Path(__file__).resolve().parents[2]
    for cand in (here / "templates", here.parents[1] / "templates"):
        if (cand / "engine.service.j2").is_file():
            return cand
    raise FileNotFoundError("specdeploy templates/ not found next to the package or in the source tree")


# Kept under their old names for callers of this module; the quoting itself lives in render/quoting.py.
systemd_quote = exec_arg


_env = None


def jinja_env() -> jinja2.Environment:
    global _env
    if _env is None:
        _env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                                  undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                                  trim_blocks=True, lstrip_blocks=True)
        _env.filters["exec_line"] = exec_line
        _env.filters["unit_value"] = unit_value
        _env.filters["env_line"] = lambda kv: environment_file_line(*kv)
        _env.filters["docker_env_line"] = lambda kv: docker_env_file_line(*kv)
        _env.filters["yaml"] = yaml_scalar
        _env.filters["yaml_plain"] = lambda v: yaml_scalar(v, quote=False)
    return _env


def render_router(worker_urls: list[str], port: int, venv: str, policy: str = "round_robin",
                  prefill: list[tuple[str, int]] | None = None, decode: list[str] | None = None) -> str:
    """systemd unit for sglang-router in front of the replicas (it serves vLLM and SGLang workers alike), or in PD
    mode in front of prefill (each with its bootstrap port) and decode instances."""
    argv = [f"{venv}/bin/python", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", str(port),
            "--policy", policy, "--health-check-interval-secs", "5", "--retry-max-retries", "3"]
    if prefill or decode:
        argv.append("--pd-disaggregation")
        for u, bootstrap in prefill or []:
            argv += ["--prefill", u, str(bootstrap)]
        for u in decode or []:
            argv += ["--decode", u]
    else:
        argv += ["--worker-urls", *worker_urls]
    return jinja_env().get_template("router.service.j2").render(exec_argv=argv, user=SERVICE_USER)
