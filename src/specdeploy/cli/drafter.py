"""``specdeploy drafter ...`` commands."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.options import ENGINE_HELP, Json, error, fail

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
              skip_target_check: bool = SkipTargetCheck,
              surface: Optional[Path] = typer.Option(None, "--surface", help="the price of speculation measured on "
                                                     "the host (breakeven --measure's surface.json): say the "
                                                     "acceptance length this drafter needs there per load band"),
              k: Optional[int] = typer.Option(None, "--k", help="with --surface: the draft length the drafter "
                                              "will run at (default: the one k the surface measured)"),
              as_json: bool = Json):
    """Check a drafter against its target for one engine (config and headers only; no weights read)."""
    from specdeploy.drafter import check
    price = _price(surface, k, engine) if surface is not None else None
    try:
        rep = check(drafter_dir, target, engine, engine_version, target_check=not skip_target_check)
    except SpecdeployError as exc:
        fail(exc)
    if as_json:
        print(json.dumps({**rep.to_dict(), **({"price": price} if price else {})}, indent=2))
    else:
        _print_report(rep, False)
        for line in (price or {}).get("lines", []):
            print(line)
    raise typer.Exit(0 if rep.ok else 1)


def _price(path: Path, k: Optional[int], engine: str) -> dict:
    """What the host's measured price asks of a drafter at k: the AL per load band for 1.0x and 1 + margin."""
    from specdeploy.speculation import surface as S
    from specdeploy.values.terminal import safe
    try:
        sf = S.load(path)
    except SpecdeployError as exc:
        fail(exc)
    measured_ks = sorted({int(p["k"]) for p in sf.get("points", [])})
    if sf.get("engine") != engine:
        error("--surface", f"{path} was measured on {sf.get('engine')}, not {engine}",
              f"give the surface measured on the {engine} host")
    if k is None:
        if len(measured_ks) != 1:
            error("--k", f"the surface measured k={measured_ks}", "say which k the drafter will run at")
        k = measured_ks[0]
    rows = S.band_needs(sf, k)
    if not rows:
        error("--k", f"{path} measured no point at k={k} (it has k={measured_ks})",
              f"give one of {measured_ks}, or measure k={k} with breakeven --measure")
    lines = [f"price on this host ({safe(S.stamp(sf))}): at k={k} the drafter needs, per load band:"]
    lines += ["  " + safe(x) for x in S.summary(sf, k)]
    return {"k": k, "bands": [{"from_batch": r.get("from_batch"), "breakeven_al": r["breakeven"]["al"],
                               "keep_al": r["keep"]["al"], "reachable": r["keep"]["reachable"]} for r in rows],
            "lines": lines}


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
