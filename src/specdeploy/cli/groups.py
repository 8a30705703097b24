"""The commands by audience. An operator sees what operates a fleet and what checks and diagnoses it at the top
level; what runs on a host (units and roles call it) is under ``specdeploy host``, the sandbox and the development
tools under ``specdeploy dev``. The old top-level names of those keep working, hidden: deployed units and roles call
``specdeploy exporter``, ``specdeploy ready``, ``specdeploy simulate``, ``specdeploy patch`` and
``python -m specdeploy.cli wheelhouse``."""
from __future__ import annotations

import typer

OPERATE = "Operate a fleet"
CHECK = "Check and diagnose"
ELSEWHERE = "On a host, in the sandbox and for development"

# top-level command or group -> the panel it is listed in
PANELS = {
    **{name: OPERATE for name in ("plan", "deploy", "rollback", "verify", "status", "report", "regate", "canary")},
    **{name: CHECK for name in ("preflight", "probe", "triage", "breakeven", "gate", "drafter", "nccl")},
}
# commands and groups that move under `specdeploy host` and `specdeploy dev`, their old names kept hidden
HOST = ("ready", "exporter")
DEV = ("sandbox", "simulate", "wheelhouse", "engine", "patch", "schema")

host_app = typer.Typer(no_args_is_help=True, help="What runs on an engine host: units and roles call these.")
dev_app = typer.Typer(no_args_is_help=True, help="The sandbox, the engine simulator and the development tools.")


def group(app: typer.Typer) -> None:
    """Put every registered command and group of ``app`` in its panel, and the host-side and development ones under
    ``host`` and ``dev`` (their top-level names stay, hidden)."""
    for info in app.registered_commands:
        name = info.name or info.callback.__name__
        if name in HOST or name in DEV:
            sub = host_app if name in HOST else dev_app
            sub.command(name, help=info.help, context_settings=info.context_settings)(info.callback)
            info.hidden = True
        else:
            info.rich_help_panel = PANELS[name]
    for info in list(app.registered_groups):
        name = info.name
        if name in HOST or name in DEV:
            (host_app if name in HOST else dev_app).add_typer(info.typer_instance, name=name)
            info.hidden = True
        else:
            info.rich_help_panel = PANELS[name]
    app.add_typer(host_app, name="host", rich_help_panel=ELSEWHERE)
    app.add_typer(dev_app, name="dev", rich_help_panel=ELSEWHERE)


def version_callback(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    from specdeploy.engines import adapters, parse_version
    try:
        own = version("specdeploy")
    except PackageNotFoundError:
        own = "unknown (not installed)"
    engines = ", ".join(f"{a.label} {min(a.versions, key=parse_version)}-{max(a.versions, key=parse_version)}"
                        for a in adapters())
    print(f"specdeploy {own} (engine releases: {engines})")
    raise typer.Exit()
