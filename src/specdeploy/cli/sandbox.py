"""``specdeploy sandbox up|down|status``."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from specdeploy.engines import DEFAULT as DEFAULT_ENGINE
from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.options import ENGINE_HELP, error, fail, known_engine

sandbox_app = typer.Typer(no_args_is_help=True, help="Real Debian sandbox hosts (systemd-nspawn) for demos and CI.")


@sandbox_app.command("up")
def up_cmd(hosts: int = typer.Option(2, "--hosts", min=1, max=8, help="sandbox hosts to boot"),
           inventory: Path = typer.Option(Path("inventory/sandbox"), "-i", "--inventory",
                                            help="inventory to write"),
           engine: str = typer.Option(DEFAULT_ENGINE, "--engine", help=ENGINE_HELP),
           runtime: str = typer.Option("docker", "--runtime", help="docker (the production runtime) or venv"),
           real_engine: str = typer.Option("", "--real-engine", help="a vLLM version whose CPU build serves instead "
                                           "of the simulator (0.32.0: EAGLE-3 runs on the CPU; venv runtime)")):
    """Boot N hosts (debootstrap cached), write an inventory pointing at them."""
    from rich.console import Console

    from specdeploy.testing import sandbox
    con = Console(stderr=True)
    if runtime not in ("docker", "venv"):
        error("--runtime", f"'{runtime}'", "use docker or venv")
    known_engine(engine)
    if real_engine:
        from specdeploy.testing import realengine
        if real_engine not in realengine.RECIPES:
            error("--real-engine", f"'{real_engine}'", f"use one of {', '.join(realengine.RECIPES)}")
        if engine != realengine.ENGINE:
            error("--engine", f"'{engine}' with --real-engine",
                  f"only {realengine.ENGINE}'s CPU build runs here: --engine {realengine.ENGINE}")
        runtime = "venv"
    try:
        with con.status("sandbox") as st:
            hs = sandbox.up(hosts, progress=lambda m: (st.update(m), con.log(m)), real_engine=real_engine or None)
            st.update("drafter artifact")
            sandbox.artifacts()
            sandbox.write_inventory(hs, inventory, engine, runtime, real_engine=real_engine or None)
    except SpecdeployError as exc:
        fail(exc)
    for h in hs:
        print(f"{h.name}\t{h.address}")
    print(f"inventory: {inventory}")


@sandbox_app.command("down")
def down_cmd():
    """Stop every sandbox host and remove its network and overlay."""
    from specdeploy.testing import sandbox
    try:
        sandbox.down(progress=lambda m: print(m, file=sys.stderr))
    except SpecdeployError as exc:
        fail(exc)


@sandbox_app.command("status")
def status_cmd():
    from specdeploy.testing import sandbox
    for h in sandbox.hosts_from_state():
        print(f"{h.name}\t{h.address}\t{'running' if sandbox._pid(h) else 'stopped'}")
