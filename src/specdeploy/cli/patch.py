"""``specdeploy patch status|apply``."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from specdeploy.cli.options import ENGINE_HELP, Json, error

patch_app = typer.Typer(no_args_is_help=True, help="Engine patch sets (vLLM 0.16/0.17 Kimi-K2.5 EAGLE-3).")


def _run(action: str, engine: str, root: Path, as_json: bool):
    from specdeploy.engines import UnsupportedVersion, get, names
    try:
        adapter = get(engine)
    except UnsupportedVersion:
        error("--engine", f"unknown engine '{engine}'", f"use {' or '.join(names())}")
    pv = adapter.patch_module()
    if pv is None:
        results = []
    else:
        try:
            results = pv.status(root) if action == "status" else pv.apply(root)
        except pv.PatchError as exc:
            if exc.anchor == f"{engine}/__init__.py":
                error(f"--root {root}", f"no {engine} package there",
                      f"give the directory that contains {engine}/ (an image's site-packages or an unpacked release)")
            patched = [v for v in adapter.versions if adapter(v).patch_ids()]
            fixed = [v for v in adapter.versions if not adapter(v).patch_ids()]
            pin = (f"; pin a tested version ({patched[0]}-{patched[-1]})" if patched else "") + \
                (f" or >= {fixed[0]}, which needs no patches" if fixed else "")
            error(exc.file, f"anchor '{exc.anchor}' {exc.why}. Nothing was changed.",
                  f"this {adapter.label} tree differs from the release the patch set was written for{pin}", 1)
    if as_json:
        print(json.dumps({"engine": engine, "root": str(root),
                          "patches": [r.__dict__ for r in results]}, indent=2))
    else:
        if not results:
            print(f"{engine}: no patches defined")
        for r in results:
            print(f"{r.id:32s} {r.status:9s} {', '.join(r.files)} {r.detail}")
    if action == "status" and any(r.status == "drift" for r in results):
        raise typer.Exit(1)


@patch_app.command("status")
def status_cmd(engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
               root: Path = typer.Option(..., "--root", help="the directory that holds the engine's package"),
               as_json: bool = Json):
    """Report per patch: upstream, needed, applied or drift."""
    _run("status", engine, root, as_json)


@patch_app.command("apply")
def apply_cmd(engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
              root: Path = typer.Option(..., "--root", help="the directory that holds the engine's package"),
              as_json: bool = Json):
    """Apply the needed patches (idempotent, all or nothing)."""
    _run("apply", engine, root, as_json)
