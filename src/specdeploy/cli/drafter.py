"""``specdeploy drafter ...`` commands."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

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


@drafter_app.command("synth")
def synth_cmd(target: Path = typer.Option(..., "--target", help="the target's directory (its config.json)"),
              engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
              out: Path = typer.Option(..., "--out", help="a new directory for the head"),
              engine_version: str = typer.Option(None, "--engine-version",
                                                 help="the release the head is built for (default: the newest known)"),
              fill: str = typer.Option("random", "--fill", help="random: bounded random weights (the draft tokens "
                                       "vary, as a trained head's do); zeros: a sparse file that takes no disk "
                                       "(for checks that read headers only)"),
              draft_vocab: Optional[int] = typer.Option(None, "--draft-vocab", min=1,
                                                        help="draft vocabulary size (default 32000)"),
              intermediate: Optional[int] = typer.Option(None, "--intermediate-size", min=1,
                                                         help="the head's MLP width (default: the target's dense "
                                                         "MLP's)"),
              max_gb: Optional[float] = typer.Option(None, "--max-gb", help="refuse a head that needs more disk"),
              as_json: bool = Json):
    """Generate a random-weight EAGLE-3 head of the right shape from the target's config (no download, no
    training), then check it with the doctor. For `specdeploy breakeven --measure`, which generates its own."""
    from specdeploy.drafter import check, synth
    try:
        made = synth.write(out, target, engine, engine_version, fill, draft_vocab=draft_vocab,
                           intermediate=intermediate, max_bytes=None if max_gb is None else int(max_gb * 1e9))
        rep = check(out, target, engine, made["version"])
    except SpecdeployError as exc:
        fail(exc)
    if as_json:
        print(json.dumps({"head": made, "doctor": rep.to_dict()}, indent=2))
    else:
        print(f"wrote {out}: {len(made['tensors'])} tensors, {made['bytes'] / 1e9:.2f} GB ({fill}) for "
              f"{engine} {made['version']}")
        _print_report(rep, False)
    raise typer.Exit(0 if rep.ok else 1)
