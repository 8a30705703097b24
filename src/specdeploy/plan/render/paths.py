"""Where a deployment puts things on a host: state and config directories, the service user, unit names, the
converted drafter. Every renderer takes these from here."""
from __future__ import annotations

from specdeploy.hostvars.schema import HostVars
from specdeploy.values import hostpaths
from specdeploy.hostvars.varsfile import gate_vars_file, host_vars_file  # noqa: F401 (re-exported)
from specdeploy.values.hostpaths import CONFIG_DIR, SERVICE_USER, STATE_DIR  # noqa: F401 (re-exported)

CRED_TOKEN = "${CREDENTIALS_DIRECTORY}"


def unit_name(engine: str) -> str:
    """The engine's unit (values/hostpaths.py names every unit)."""
    return hostpaths.unit_name("engine", engine)


def secret_path(name: str) -> str:
    """A 0600 file under the secrets directory (the API key in the form the engine reads it)."""
    return f"{hostpaths.host_path('secrets')}/{name}"


def engine_files(engine: str) -> list[str]:
    """The files a deployment installs for an engine's unit: the unit, its environment and its argv record."""
    stem = unit_name(engine).removesuffix(".service")
    return [hostpaths.unit_file(unit_name(engine)), f"{CONFIG_DIR}/{stem}.env", f"{CONFIG_DIR}/{stem}.argv"]


def secret_env_path(engine: str) -> str:
    """The engine's second env file, holding only the API key (EnvironmentFile= or docker --env-file)."""
    return secret_path(unit_name(engine).removesuffix(".service") + ".env")


def converted_drafter_path(hv: HostVars) -> str | None:
    """Where the drafter role puts the drafter converted for the engine; None where the method drafts without a
    drafter checkpoint of its own (MTP: the target's layers; n-gram)."""
    if not hv.uses_drafter:
        return None
    return hostpaths.host_path("drafter_out", hv.specdeploy_engine)
