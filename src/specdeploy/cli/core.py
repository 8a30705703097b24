"""``specdeploy plan``, ``engine argv|image|standin``, ``schema docs|defaults|argspec`` and ``wheelhouse``: what the
controller renders and builds."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.app import app
from specdeploy.cli.options import (ENGINE_HELP, ENGINE_VERSION_HELP, ExtraVars, Inventory, Json, LegacyVersion, Limit,
                                    VaultIds, VaultPasswordFiles, engine_version, error, fail, known_engine,
                                    output_dir, vault)



def _limit(limit: str | None) -> str | None:
    if limit is not None and not limit.strip():
        error("--limit", "is empty", "give hosts or groups of the inventory, or leave --limit out")
    return limit

engine_app = typer.Typer(no_args_is_help=True, help="Engine command lines.")
schema_app = typer.Typer(no_args_is_help=True, help="The inventory schema: docs and Ansible argument specs.")


@app.command("plan")
def plan_cmd(inventory: str = Inventory, limit: Optional[str] = Limit,
             extra_vars: Optional[List[str]] = ExtraVars,
             out_dir: Optional[Path] = typer.Option(None, "--out", help="Write the rendered files here."),
             as_json: bool = Json, vault_id: Optional[List[str]] = VaultIds,
             vault_password_file: Optional[List[str]] = VaultPasswordFiles):
    """Render, for every host, the units, environment, command line and scrape config a deploy installs."""
    from specdeploy.hostvars.inventory import parse_extra_vars
    from specdeploy.plan import plan, write_out
    from specdeploy.plan.host import PLAN_CMD
    from specdeploy.values.terminal import safe
    _limit(limit)
    try:
        if out_dir is not None:  # before any work: what --out may be (plan.outdir)
            from specdeploy.plan.outdir import check_target
            check_target(out_dir, PLAN_CMD)
        secrets = vault(vault_id, vault_password_file)
        inv, plans, prom = plan(inventory, limit, parse_extra_vars(extra_vars, secrets), secrets)
        if out_dir is not None:
            write_out(out_dir, plans, prom)
    except SpecdeployError as exc:
        fail(exc)
    except OSError as exc:
        error("--out", f"cannot write {safe(exc.filename or out_dir)} ({exc.strerror or exc})",
              "give a writable directory")
    if as_json:  # the inventory's warnings in the JSON, not on stderr beside it
        print(json.dumps({"hosts": {h: p.to_dict() for h, _, p in plans}, "prometheus": prom,
                          **({"warnings": [w.to_dict() for w in inv.warnings]} if inv.warnings else {})}, indent=2))
        return
    for w in inv.warnings:
        print(w.line(), file=sys.stderr)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from specdeploy.values.hostranges import compact
    out = Console()
    # hosts whose plan reads the same (a fleet's hosts mostly do) share one table, titled with their names
    same: dict[tuple, list[tuple[str, str]]] = {}
    for host, addr, p in plans:
        rows = ((("engine", f"{p.engine} {p.version}"), ("runtime", p.runtime), ("image", p.image or "-"),
                 ("serving group", _rank_text(p.rank)),
                 ("tensor parallel", str(p.tp)), ("speculation", "on" if p.spec else "off"),
                 ("drafter (converted)", p.drafter_path or "-"), ("NCCL", p.nccl_source),
                 ("NCCL env", " ".join(f"{k}={v}" for k, v in p.env.items() if k.startswith("NCCL_")) or "-"),
                 ("ports", ", ".join(f"{k} {v}" for k, v in p.ports.items())),
                 ("units", ", ".join(u for u in (p.engine_unit, p.exporter_unit) if u)),
                 ("weight cache", _weight_cache_text(p)), ("compile cache", p.compile_cache or "-")),
                " ".join(p.argv), " ".join(p.weight_cache["argv"]) if p.weight_cache else "")
        same.setdefault(rows, []).append((host, addr))
    for (rows, argv, daemon_argv), hosts in same.items():
        title = (f"{hosts[0][0]} ({hosts[0][1]})" if len(hosts) == 1
                 else f"{len(hosts)} hosts: {compact([h for h, _ in hosts])}")
        t = Table(title=Text(safe(title)), show_header=False)
        for k, v in rows:
            t.add_row(k, Text(safe(v)))
        out.print(t)
        out.print("command: " + safe(argv), soft_wrap=True, markup=False, highlight=False)
        if daemon_argv:
            out.print("weight-cache daemon: " + safe(daemon_argv), soft_wrap=True, markup=False, highlight=False)
    if out_dir is not None:
        out.print(f"wrote files under {safe(out_dir)}", markup=False, highlight=False)


def _weight_cache_text(p) -> str:
    """The plan's weight cache in a line: the daemon the engine attaches to, or why the engine loads from disk."""
    wc = p.weight_cache
    if not wc:
        return f"none: {p.weight_cache_why}"
    return (f"{wc['unit']} holds the weights ({wc['local_ranks']} local ranks), started before the engine and ready "
            f"on {wc['health']}; an engine restart attaches, a change of weights, quantization, layout or release "
            f"restarts the daemon (a full load). Drafter: {wc['drafter']}. Without its daemon the engine "
            f"{wc['without_daemon']}")


def _rank_text(rank: dict | None) -> str:
    if rank is None or len(rank.get("hosts") or []) <= 1 and rank.get("layout") == "single":
        return "single (a host of its own)"
    if rank["layout"] == "pd":
        return f"{rank['group']}: pd {rank['role']}"
    role = "leader, serves HTTP" if rank["rank"] == 0 else f"follower of {rank['leader']}, headless"
    return f"{rank['group']}: {rank['layout']} rank {rank['rank']} of {len(rank['hosts'])} ({role})"


@engine_app.command("argv")
def engine_argv(inventory: str = Inventory, host: str = typer.Option(..., "--host", help="the inventory host"),
                extra_vars: Optional[List[str]] = ExtraVars, as_json: bool = Json,
                vault_id: Optional[List[str]] = VaultIds,
                vault_password_file: Optional[List[str]] = VaultPasswordFiles):
    """Print the exact engine command and environment for HOST."""
    from specdeploy.hostvars.inventory import load, parse_extra_vars
    from specdeploy.nccl.env import resolve
    from specdeploy.plan import engine_command
    from specdeploy.plan.render.quoting import shell_arg, shell_line
    try:
        secrets = vault(vault_id, vault_password_file)
        inv = load(inventory, limit=host, extra=parse_extra_vars(extra_vars, secrets), vault=secrets)
        h = inv.host(host)
    except SpecdeployError as exc:
        fail(exc)
    _, cmd = engine_command(h.hv)
    env, _ = resolve(h.hv)
    env.update(cmd.env)
    env.update(h.hv.specdeploy_engine_env)
    if as_json:
        print(json.dumps({"argv": cmd.argv, "env": env}, indent=2))
    else:
        for k, v in env.items():
            print(f"{k}={shell_arg(v)} \\")
        print(shell_line(cmd.argv))


@engine_app.command("image")
def engine_image(engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
                 new_version: Optional[str] = typer.Option(None, "--engine-version", help=ENGINE_VERSION_HELP),
                 old_version: Optional[str] = LegacyVersion,
                 patches: str = typer.Option("auto", "--patches", help="auto: the patch set the release needs; "
                                             "none: the official image as it is"),
                 field: Optional[str] = typer.Option(None, "--field", help="print one field: tag, patch_set, ...")):
    """The image tag, patch set and build arguments for an engine version."""
    version = engine_version(new_version, old_version)
    from specdeploy.engines import UnsupportedVersion, get
    from specdeploy.plan.images import image_tag, upstream_image
    from specdeploy.engines.patches import patch_set_id, required_patches
    if patches not in ("auto", "none"):
        error("--patches", f"unknown patch mode '{patches}'", "use auto or none")
    try:
        info = {"tag": image_tag(engine, version, patches), "base": upstream_image(engine, version),
                "patch_set": patch_set_id(engine, version, patches),
                "patches": list(required_patches(engine, version)) if patches == "auto" else [],
                "dockerfile": f"docker/{engine}.Dockerfile",
                "build_args": {get(engine).version_arg: version,
                               "PATCH_SET": patch_set_id(engine, version, patches)}}
    except (UnsupportedVersion, KeyError) as exc:
        error("--engine-version", str(exc).strip("'\""), "use a supported engine and version")
    if field is not None:
        if field not in info:
            error("--field", f"unknown field '{field}'", f"use one of {', '.join(info)}")
        print(info[field] if not isinstance(info[field], (dict, list)) else json.dumps(info[field]))
    else:
        print(json.dumps(info, indent=2))


@engine_app.command("standin")
def engine_standin(engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
                   new_version: Optional[str] = typer.Option(None, "--engine-version", help=ENGINE_VERSION_HELP),
                   old_version: Optional[str] = LegacyVersion,
                   out: Path = typer.Option(..., "--out", help="a new directory for the build context (only an "
                                            "earlier output of this command is replaced)")):
    """Sandbox: build context of the local stand-in for the official engine image (real engine sources)."""
    version = engine_version(new_version, old_version)
    from specdeploy.plan.images import standin_context
    from specdeploy.engines.upstream import UpstreamError
    known_engine(engine)
    try:
        print(standin_context(engine, version, out))
    except SpecdeployError as exc:
        fail(exc)
    except (UpstreamError, OSError) as exc:
        error(f"--version {version}", f"cannot get the {engine} sources: {exc}",
              "check the package index is reachable from the controller")


@app.command("wheelhouse")
def wheelhouse_cmd(out: Path = typer.Option(..., "--out", help="a new directory for the wheels (only an earlier "
                                            "wheelhouse is replaced)"),
                   target: Optional[str] = typer.Option(None, "--target",
                                                        help="hosts' PY_VERSION:MACHINE:GLIBC, e.g. 3.11:x86_64:2.36")):
    """Build the wheelhouse hosts install specdeploy from (offline), for the hosts' Python; prints its stamp."""
    from specdeploy.ops.wheelhouse import TargetError, build
    output_dir(out, "--out", "a directory for the wheels")
    if target is not None and not target.strip():
        error("--target", "is empty", "give PY_VERSION:MACHINE:GLIBC, e.g. 3.11:x86_64:2.36, or leave it out")
    try:
        print(build(out, target))
    except SpecdeployError as exc:
        fail(exc)
    except TargetError as exc:
        error("--target", str(exc), "give PY_VERSION:MACHINE:GLIBC, e.g. 3.11:x86_64:2.36")


@schema_app.command("docs")
def schema_docs():
    """Print the variable reference (docs/variables.md)."""
    from specdeploy.hostvars.schema_docs import variables_markdown
    sys.stdout.write(variables_markdown())


@schema_app.command("defaults")
def schema_defaults(role: str = typer.Argument(..., help="Role name")):
    """Print a role's defaults/main/schema.yml, generated from the schema."""
    from specdeploy.hostvars.schema_docs import role_defaults_yaml
    sys.stdout.write(role_defaults_yaml(role))


@schema_app.command("write")
def schema_write(check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when a file is stale")):
    """Regenerate every file made from the schema: each role's defaults/main/schema.yml and
    meta/argument_specs.yml, and docs/variables.md."""
    from specdeploy.hostvars.schema_docs import write_generated
    changed = write_generated(check=check)
    for p in changed:
        print(("stale: " if check else "wrote: ") + str(p))
    if check and changed:
        raise typer.Exit(1)


@schema_app.command("argspec")
def schema_argspec(role: str = typer.Argument(..., help="Role name")):
    """Print a role's meta/argument_specs.yml, generated from the schema."""
    from specdeploy.hostvars.schema_docs import argument_specs_yaml
    sys.stdout.write(argument_specs_yaml(role))
