"""systemd rendering: the Jinja2 templates in ``templates/`` and the quoting of what goes into them (``ExecStart=``
arguments, ``EnvironmentFile=`` and ``docker --env-file`` lines), and the router unit."""
from __future__ import annotations

import re
from pathlib import Path

import jinja2

from .paths import SERVICE_USER


def templates_dir() -> Path:
    here = Path(__file__).resolve().parents[1]
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


def render_router(worker_urls: list[str], port: int, venv: str, policy: str = "round_robin") -> str:
    """systemd unit for sglang-router in front of the replicas (it serves vLLM and SGLang workers alike)."""
    argv = [f"{venv}/bin/python", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", str(port),
            "--policy", policy, "--health-check-interval-secs", "5", "--retry-max-retries", "3",
            "--worker-urls", *worker_urls]
    return jinja_env().get_template("router.service.j2").render(exec_argv=argv, user=SERVICE_USER)
