"""Where a deployment puts things on a host: state and config directories, the service user, unit names, the
converted drafter. Every renderer takes these from here."""
from __future__ import annotations

from ..schema import HostVars

STATE_DIR = "/var/lib/specdeploy"
CONFIG_DIR = "/etc/specdeploy"
CRED_TOKEN = "${CREDENTIALS_DIRECTORY}"
SERVICE_USER = "specdeploy"


def unit_name(engine: str) -> str:
    return f"specdeploy-{engine}.service"


def converted_drafter_path(hv: HostVars) -> str | None:
    if not (hv.specdeploy_spec_enabled and hv.specdeploy_drafter_path):
        return None
    return f"{STATE_DIR}/drafter/{hv.specdeploy_engine}"
