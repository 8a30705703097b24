"""Where specdeploy keeps things on a host. Renderers take these from here; the Ansible roles through the
``specdeploy_path`` filter (``{{ 'state' | specdeploy_path }}``); the stdlib-only host scripts, which import
nothing of ours, repeat the two they need and a test holds them equal."""
from __future__ import annotations

STATE_DIR = "/var/lib/specdeploy"       # releases, gate reports, drafters, NCCL results
CONFIG_DIR = "/etc/specdeploy"          # env files, argv records, secrets
OPT_DIR = "/opt/specdeploy"             # what specdeploy installs: venvs, wheelhouse, build contexts
SERVICE_USER = "specdeploy"
SANDBOX_BASE_ARCHIVE = "/opt/specdeploy-sandbox/base-image.tar"  # a sandbox host's baked base image

HOST_PATHS: dict[str, str] = {
    "state": STATE_DIR,
    "config": CONFIG_DIR,
    "opt": OPT_DIR,
    "venv": f"{OPT_DIR}/venv",
    "wheelhouse": f"{OPT_DIR}/wheelhouse",
    "build": f"{OPT_DIR}/build",
    "router": f"{OPT_DIR}/router",
    "router_wheels": f"{OPT_DIR}/router-wheels",
    "drafter": f"{STATE_DIR}/drafter",
    "gate": f"{STATE_DIR}/gate",
    "nccl": f"{STATE_DIR}/nccl",
    "releases": f"{STATE_DIR}/releases",
    "sandbox_base_archive": SANDBOX_BASE_ARCHIVE,
}


def host_path(name: str) -> str:
    try:
        return HOST_PATHS[name]
    except KeyError:
        raise KeyError(f"no host path {name!r}; known: {', '.join(HOST_PATHS)}") from None


def expand(text: str) -> str:
    """A role default that uses the path filter, as plain text: "{{ 'state' | specdeploy_path }}/x" ->
    "/var/lib/specdeploy/x" (other template expressions are left as they are)."""
    import re
    return re.sub(r"\{\{\s*'(\w+)'\s*\|\s*specdeploy_path\s*\}\}", lambda m: host_path(m.group(1)), text)
