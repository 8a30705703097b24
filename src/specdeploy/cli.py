"""The ``specdeploy`` command line."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .errors import SpecdeployError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Deploy an MoE model with an EAGLE-3 drafter on vLLM or SGLang, and prove it pays.")
engine_app = typer.Typer(no_args_is_help=True, help="Engine command lines.")
schema_app = typer.Typer(no_args_is_help=True, help="The inventory schema: docs and Ansible argument specs.")
app.add_typer(engine_app, name="engine")
app.add_typer(schema_app, name="schema")
from .nccl_cli import nccl_app  # noqa: E402

app.add_typer(nccl_app, name="nccl")
from .drafter_cli import drafter_app  # noqa: E402

app.add_typer(drafter_app, name="drafter")
from .patch_cli import patch_app  # noqa: E402

app.add_typer(patch_app, name="patch")
from .sandbox_cli import sandbox_app  # noqa: E402

app.add_typer(sandbox_app, name="sandbox")
from .ops_cli import register  # noqa: E402

register(app)
from .frontdoor_cli import register as register_frontdoor  # noqa: E402

register_frontdoor(app)

InvOpt = typer.Option(..., "-i", "--inventory", help="Ansible inventory directory or file.")
ExtraOpt = typer.Option(None, "-e", "--extra-vars",
                        help="KEY=VALUE, a JSON/YAML mapping, or @file.yml, like ansible-playbook -e.")


def _fail(exc: SpecdeployError, code: int = 2):
    for p in exc.problems:
        print(p.line(), file=sys.stderr)
    raise typer.Exit(code)


@app.command("plan")
def plan_cmd(inventory: str = InvOpt, limit: Optional[str] = typer.Option(None, "--limit"),
             extra_vars: Optional[List[str]] = ExtraOpt,
             out_dir: Optional[Path] = typer.Option(None, "--out", help="Write the rendered files here."),
             as_json: bool = typer.Option(False, "--json")):
    """Render, for every host, the units, environment, command line and scrape config a deploy installs."""
    from .inventory import parse_extra_vars
    from .plan import plan, write_out
    try:
        _, plans, prom = plan(inventory, limit, parse_extra_vars(extra_vars))
        if out_dir:
            write_out(out_dir, plans, prom)
    except SpecdeployError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps({"hosts": {h: p.to_dict() for h, _, p in plans}, "prometheus": prom}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    out = Console()
    for host, addr, p in plans:
        t = Table(title=f"{host} ({addr})", show_header=False)
        for k, v in [("engine", f"{p.engine} {p.version}"), ("runtime", p.runtime), ("image", p.image or "-"),
                     ("tensor parallel", str(p.tp)), ("speculation", "on" if p.spec else "off"),
                     ("drafter (converted)", p.drafter_path or "-"), ("NCCL", p.nccl_source),
                     ("NCCL env", " ".join(f"{k}={v}" for k, v in p.env.items() if k.startswith("NCCL_")) or "-"),
                     ("ports", ", ".join(f"{k} {v}" for k, v in p.ports.items())),
                     ("units", f"{p.engine_unit}, {p.exporter_unit}")]:
            t.add_row(k, v)
        out.print(t)
        out.print("[bold]command[/]: " + " ".join(p.argv), soft_wrap=True, markup=True, highlight=False)
    if out_dir:
        out.print(f"wrote files under {out_dir}")


@engine_app.command("argv")
def engine_argv(inventory: str = InvOpt, host: str = typer.Option(..., "--host"),
                extra_vars: Optional[List[str]] = ExtraOpt, as_json: bool = typer.Option(False, "--json")):
    """Print the exact engine command and environment for HOST."""
    import shlex
    from .inventory import load, parse_extra_vars
    from .nccl_env import resolve
    from .render import engine_command
    try:
        inv = load(inventory, limit=host, extra=parse_extra_vars(extra_vars))
        h = inv.host(host)
    except SpecdeployError as exc:
        _fail(exc)
    _, cmd = engine_command(h.hv)
    env, _ = resolve(h.hv)
    env.update(cmd.env)
    env.update(h.hv.specdeploy_engine_env)
    if as_json:
        print(json.dumps({"argv": cmd.argv, "env": env}, indent=2))
    else:
        for k, v in env.items():
            print(f"{k}={shlex.quote(v)} \\")
        print(" ".join(shlex.quote(a) for a in cmd.argv))


@engine_app.command("image")
def engine_image(engine: str = typer.Option(..., "--engine"), version: str = typer.Option(..., "--version"),
                 patches: str = typer.Option("auto", "--patches"),
                 field: Optional[str] = typer.Option(None, "--field", help="print one field: tag, patch_set, ...")):
    """The image tag, patch set and build arguments for an engine version."""
    from .engines import UnsupportedVersion, get
    from .images import image_tag, upstream_image
    from .patches import patch_set_id, required_patches
    try:
        info = {"tag": image_tag(engine, version, patches), "base": upstream_image(engine, version),
                "patch_set": patch_set_id(engine, version, patches),
                "patches": list(required_patches(engine, version)) if patches == "auto" else [],
                "dockerfile": f"docker/{engine}.Dockerfile",
                "build_args": {get(engine).version_arg: version,
                               "PATCH_SET": patch_set_id(engine, version, patches)}}
    except (UnsupportedVersion, KeyError) as exc:
        print(f"ERROR --version: {exc}", file=sys.stderr)
        raise typer.Exit(2)
    if field:
        if field not in info:
            print(f"ERROR --field: unknown field '{field}'; fields: {', '.join(info)}", file=sys.stderr)
            raise typer.Exit(2)
        print(info[field] if not isinstance(info[field], (dict, list)) else json.dumps(info[field]))
    else:
        print(json.dumps(info, indent=2))


@engine_app.command("standin")
def engine_standin(engine: str = typer.Option(..., "--engine"), version: str = typer.Option(..., "--version"),
                   out: Path = typer.Option(..., "--out")):
    """Sandbox: build context of the local stand-in for the official engine image (real engine sources)."""
    from .images import standin_context
    from .upstream import UpstreamError
    _known_engine(engine)
    try:
        print(standin_context(engine, version, out))
    except (UpstreamError, OSError) as exc:
        print(f"ERROR --version {version}: cannot get the {engine} sources: {exc} Fix: check the package index "
              "is reachable from the controller", file=sys.stderr)
        raise typer.Exit(2)


def _known_engine(engine: str) -> None:
    from .engines import names
    if engine not in names():
        print(f"ERROR --engine: unknown engine '{engine}' Fix: use {' or '.join(names())}", file=sys.stderr)
        raise typer.Exit(2)


@app.command("simulate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def simulate_cmd(ctx: typer.Context, engine: str = typer.Option(..., "--engine"),
                 version: str = typer.Option(..., "--version")):
    """Engine simulator for demos and tests: serves the engine's HTTP/metrics contract without a GPU.
    Usage: specdeploy simulate --engine vllm --version 0.16.0 -- vllm serve MODEL [flags]"""
    from .engines import UnsupportedVersion
    from .testing.simulator import run
    try:
        code = run(engine, version, list(ctx.args))
    except UnsupportedVersion as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        raise typer.Exit(2)
    except (ValueError, OSError, OverflowError) as exc:  # bad JSON in a flag value, a bad port, a busy address
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"ERROR simulate: {msg} Fix: check the engine flags after --", file=sys.stderr)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command("ready")
def ready_cmd(unit: str = typer.Option(..., "--unit"), url: str = typer.Option(..., "--url"),
              until: float = typer.Option(..., "--until", help="wall-clock deadline, epoch seconds"),
              slice_s: float = typer.Option(30, "--slice", help="return 'waiting' (exit 3) after this many seconds"),
              as_json: bool = typer.Option(False, "--json")):
    """On the host: wait for the engine to be ready; exit 1 at once on a crash loop, or at the deadline."""
    from .readiness import EXIT, wait
    o = wait(unit, url, until, slice_s)
    print(json.dumps(o.to_dict()) if as_json else f"{o.status}: {o.unit} after {o.elapsed_s:.0f} s: {o.detail}")
    raise typer.Exit(EXIT[o.status])


@app.command("exporter")
def exporter_cmd(engine: str = typer.Option(..., "--engine"), engine_url: str = typer.Option(..., "--engine-url"),
                 listen: str = typer.Option("0.0.0.0:9450", "--listen"), window: float = typer.Option(60, "--window"),
                 info: Optional[List[str]] = typer.Option(None, "--info", help="KEY=VALUE for specdeploy_engine_info"),
                 gate_file: Optional[Path] = typer.Option(Path("/var/lib/specdeploy/gate/report.json"),
                                                          "--gate-file")):
    """Serve speculative-decoding metrics under one engine-independent set of names."""
    import time as _t
    from .exporter import serve
    _known_engine(engine)
    from .argcheck import http_url, listen_address
    try:
        listen_address(listen, "--listen")
        http_url(engine_url, "--engine-url")
    except SpecdeployError as exc:
        _fail(exc)
    kv = dict(x.split("=", 1) for x in info or [] if "=" in x)
    try:
        serve(engine, engine_url, listen, window, kv, gate_file)
    except OSError as exc:
        print(f"ERROR --listen: cannot listen on {listen}: {exc.strerror or exc} "
              "Fix: choose a free port and an address of this host", file=sys.stderr)
        raise typer.Exit(2) from None
    print(f"exporting {engine} spec-decode metrics from {engine_url} on {listen}", flush=True)
    while True:
        _t.sleep(3600)


@app.command("wheelhouse")
def wheelhouse_cmd(out: Path = typer.Option(..., "--out"),
                   target: Optional[str] = typer.Option(None, "--target",
                                                        help="hosts' PY_VERSION:MACHINE:GLIBC, e.g. 3.11:x86_64:2.36")):
    """Build the wheelhouse hosts install specdeploy from (offline), for the hosts' Python; prints its stamp."""
    from .wheelhouse import TargetError, build
    try:
        print(build(out, target))
    except TargetError as exc:
        print(f"ERROR --target: {exc}", file=sys.stderr)
        raise typer.Exit(2)


@schema_app.command("docs")
def schema_docs():
    """Print the variable reference (docs/variables.md)."""
    from .schema_docs import variables_markdown
    sys.stdout.write(variables_markdown())


@schema_app.command("defaults")
def schema_defaults(role: str = typer.Argument(..., help="Role name")):
    """Print a role's defaults/main/schema.yml, generated from the schema."""
    from .schema_docs import role_defaults_yaml
    sys.stdout.write(role_defaults_yaml(role))


@schema_app.command("argspec")
def schema_argspec(role: str = typer.Argument(..., help="Role name")):
    """Print a role's meta/argument_specs.yml, generated from the schema."""
    from .schema_docs import argument_specs_yaml
    sys.stdout.write(argument_specs_yaml(role))


def main():
    try:
        app()
    except SpecdeployError as exc:  # any command that did not catch its own
        for p in exc.problems:
            print(p.line(), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
