"""``specdeploy probe``: the pinned engine's own verdict on a target + drafter pair (checks/probe.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specdeploy.engines import DEFAULT as DEFAULT_ENGINE
from specdeploy.cli.app import app
from specdeploy.cli.options import ENGINE_HELP, Json, LegacyVersion, engine_version, known_engine


@app.command("probe")
def probe_cmd(target: Path = typer.Option(..., "--target", help="the target's directory (config.json; no weights "
                                          "needed)"),
              drafter: Path = typer.Option(..., "--drafter", help="the drafter's directory (config.json and "
                                           "*.safetensors; only the headers are read)"),
              engine: str = typer.Option(DEFAULT_ENGINE, "--engine", help=ENGINE_HELP),
              new_version: Optional[str] = typer.Option(None, "--engine-version", help="the pinned release "
                                                        "(default: the newest known)"),
              old_version: Optional[str] = LegacyVersion,
              python: Optional[str] = typer.Option(None, "--python", help="the engine's Python (default: python3)"),
              venv: Optional[Path] = typer.Option(None, "--venv", help="the engine's venv (its bin/python)"),
              timeout: float = typer.Option(300.0, "--timeout", help="seconds before the probe is killed"),
              trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="let the engine read a "
                                                     "configuration class the target ships (auto_map)"),
              as_json: bool = Json):
    """Run the engine's own config validation, target-class check and drafter weight loading (no GPU, no
    target weights). Exit 1 when the engine rejects the pair, 2 when the probe cannot run."""
    from specdeploy.checks.probe import probe
    from specdeploy.cli.options import finite
    known_engine(engine)
    finite(timeout, "--timeout", 1.0)
    version = engine_version(new_version, old_version, required=False)
    rep, run = probe(target, drafter, engine, version, python, str(venv) if venv else None, timeout,
                     trust_remote_code=trust_remote_code)
    code = 0 if rep.ok and run.ran else 1 if not rep.ok and run.ran else 2
    if as_json:
        print(json.dumps({**rep.to_dict(), "ran": run.ran, "engine_version": run.version,
                          "raw": run.cases.get("probe")}, indent=2))
    else:
        for f in rep.findings:
            print(f.line())
        print("OK" if code == 0 else f"{len(rep.errors)} error(s)" if code == 1 else "the probe did not run")
    raise typer.Exit(code)
