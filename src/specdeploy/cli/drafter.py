"""``specdeploy drafter ...`` commands."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.options import ENGINE_HELP, Json, fail

drafter_app = typer.Typer(no_args_is_help=True, help="Validate and convert EAGLE-3 drafters.")


def _print_report(rep, as_json: bool):
    if as_json:
        print(json.dumps(rep.to_dict(), indent=2))
        return
    for f in rep.findings:
        print(f.line())
    print("OK" if rep.ok else f"{len(rep.errors)} error(s)")


SkipTargetCheck = typer.Option(False, "--skip-target-check", help="leave out whether the release serves the "
                               "target's model class as an EAGLE-3 target (the deploy's preflight decides that, "
                               "knowing the engine image's patch set)")


@drafter_app.command("check")
def check_cmd(drafter_dir: Path = typer.Argument(..., help="the drafter's directory"),
              target: Path = typer.Option(..., "--target", help="the target's directory (its config.json)"),
              engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
              engine_version: str = typer.Option(None, "--engine-version",
                                                 help="rules of this engine release (default: the newest known)"),
              skip_target_check: bool = SkipTargetCheck, as_json: bool = Json):
    """Check a drafter against its target for one engine (config and headers only; no weights read)."""
    from specdeploy.drafter import check
    try:
        rep = check(drafter_dir, target, engine, engine_version, target_check=not skip_target_check)
    except SpecdeployError as exc:
        fail(exc)
    _print_report(rep, as_json)
    raise typer.Exit(0 if rep.ok else 1)


@drafter_app.command("convert")
def convert_cmd(drafter_dir: Path = typer.Argument(..., help="the drafter's directory"),
                target: Path = typer.Option(..., "--target", help="the target's directory (its config.json)"),
                engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
                out: Path = typer.Option(..., "--out", help="a new directory for the converted drafter (only an "
                                         "earlier conversion is replaced)"),
                engine_version: str = typer.Option(None, "--engine-version",
                                                   help="rules of this engine release (default: the newest known)"),
                skip_target_check: bool = SkipTargetCheck, as_json: bool = Json):
    """Write an engine-ready copy: architecture name, layout, explicit aux ids, layer count, verifier."""
    from specdeploy.drafter import convert
    from specdeploy.cli.options import output_dir
    output_dir(out, "--out", "a new directory for the converted drafter")
    # what --out may be (not the input, nor holding it; only an earlier conversion replaced) is outdir's
    try:
        meta = convert(drafter_dir, target, engine, out, engine_version, not skip_target_check)
    except SpecdeployError as exc:
        fail(exc, 1)
    if as_json:
        print(json.dumps(meta, indent=2))
    else:
        for a in meta["actions"]:
            print("-", a)
        print(f"wrote {out}")
