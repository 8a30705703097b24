"""``specdeploy simulate``, ``ready`` and ``exporter``: the commands units and roles run on a host."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.app import app
from specdeploy.cli.options import (ENGINE_HELP, ENGINE_VERSION_HELP, Json, LegacyVersion, engine_version, error, fail,
                                    known_engine)
from specdeploy.values.hostpaths import host_path


@app.command("simulate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def simulate_cmd(ctx: typer.Context, engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
                 new_version: Optional[str] = typer.Option(None, "--engine-version", help=ENGINE_VERSION_HELP),
                 old_version: Optional[str] = LegacyVersion):
    """Engine simulator for demos and tests: serves the engine's HTTP/metrics contract without a GPU.
    Usage: specdeploy dev simulate --engine vllm --engine-version 0.16.0 -- vllm serve MODEL [flags]"""
    from specdeploy.engines import UnsupportedVersion
    from specdeploy.testing.simulator import run
    version = engine_version(new_version, old_version)
    try:
        code = run(engine, version, list(ctx.args))
    except UnsupportedVersion as exc:
        error("--engine-version", str(exc), "use a supported engine and version")
    except (ValueError, OSError, OverflowError) as exc:  # bad JSON in a flag value, a bad port, a busy address
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        error("simulate", msg, "check the engine flags after --")
    raise typer.Exit(code)


@app.command("ready")
def ready_cmd(unit: Optional[str] = typer.Option(None, "--unit", help="the engine's systemd unit (leave out to "
                                                 "only generate, e.g. through a router)"),
              url: Optional[str] = typer.Option(None, "--url", help="the engine's readiness URL (with --unit); a "
                                                "weight-cache daemon's health check (an URL or files:GLOB:N)"),
              until: Optional[float] = typer.Option(None, "--until", help="wall-clock deadline, epoch seconds"),
              within: Optional[float] = typer.Option(None, "--within", help="the deadline in seconds from now "
                                                     "(instead of --until)"),
              slice_s: float = typer.Option(30, "--slice", help="return 'waiting' (exit 3) after this many seconds"),
              generate: Optional[str] = typer.Option(None, "--generate", help="once ready, a real chat completion "
                                                     "at this base URL (http://HOST:PORT) must answer with text"),
              model: Optional[str] = typer.Option(None, "--model", help="the served model name (with --generate)"),
              api_key_env: str = typer.Option("SPECDEPLOY_API_KEY", "--api-key-env", help="environment variable "
                                              "that holds the API key for --generate (never on the command line)"),
              as_json: bool = Json):
    """On the host: wait for the engine to be ready (exit 1 at once on a crash loop, or at the deadline), then
    with --generate check a real chat completion; without --unit, only the generation, retried until --until, or
    only --url (a weight-cache daemon's health, as its unit's ExecStartPost waits for it)."""
    import os
    import time as _t

    from specdeploy.checks.readiness import EXIT, NO_TEXT, READY, generate as gen, generate_until, wait, wait_url
    if unit is None and generate is None and not url:
        error("--unit", "neither --unit, --url nor --generate is given", "give --unit and --url, --generate, or both")
    if unit is not None and not url:
        error("--url", "is required with --unit", "give the engine's readiness URL")
    if (until is None) == (within is None):
        error("--until", "give exactly one of --until and --within", "give the deadline as epoch seconds (--until) "
              "or seconds from now (--within)")
    until = until if until is not None else _t.time() + float(within)
    if generate is not None and not model:
        error("--model", "is required with --generate", "give the served model name")
    key = os.environ.get(api_key_env) or None
    if unit is None and generate is None:  # under systemd's ExecStartPost, MAINPID is the daemon's process
        main_pid = os.environ.get("MAINPID", "")
        o = wait_url(url, until, main_pid=int(main_pid) if main_pid.isdigit() and int(main_pid) > 0 else None)
    elif unit is None:
        o = generate_until(generate, model, until, key)
    else:
        o = wait(unit, url, until, slice_s)
        if o.status == READY and generate is not None:
            ok, what = gen(generate, model, key)
            o.status, o.detail = (READY, f"{o.detail}; answered: {what}") if ok else (NO_TEXT, what)
    print(json.dumps(o.to_dict()) if as_json else f"{o.status}: {o.unit} after {o.elapsed_s:.0f} s: {o.detail}")
    raise typer.Exit(EXIT[o.status])


@app.command("exporter")
def exporter_cmd(engine: str = typer.Option(..., "--engine", help=ENGINE_HELP),
                 engine_url: str = typer.Option(..., "--engine-url", help="the engine's base URL (its /metrics)"),
                 listen: str = typer.Option("0.0.0.0:9450", "--listen", help="ADDRESS:PORT to serve /metrics on"),
                 window: float = typer.Option(60, "--window", help="seconds of counters the rates are taken over"),
                 info: Optional[List[str]] = typer.Option(None, "--info", help="KEY=VALUE for specdeploy_engine_info"),
                 gate_file: Optional[Path] = typer.Option(Path(host_path("gate_report")), "--gate-file",
                                                          help="the speculation gate's report the exporter "
                                                          "publishes"),
                 group_port: Optional[int] = typer.Option(None, "--group-port", help="a serving group's leader: "
                                                          "its rendezvous port"),
                 group_rank: Optional[List[str]] = typer.Option(None, "--group-rank", help="HOST=ADDRESS of each "
                                                                "other rank of the group, in rank order"),
                 weight_cache_health: Optional[str] = typer.Option(None, "--weight-cache-health", help="the engine's "
                                                                   "weight-cache daemon's health check (its plan's)"),
                 weight_cache_record: Optional[Path] = typer.Option(None, "--weight-cache-record", help="the deploy's "
                                                                    "record of the daemon's last load"),
                 surface_file: Optional[Path] = typer.Option(Path(host_path("surface_file")), "--surface-file",
                                                             help="the price of speculation measured on this host "
                                                             "(breakeven --measure's surface.json): the acceptance "
                                                             "length each load band needs")):
    """Serve speculative-decoding metrics under one engine-independent set of names."""
    import time as _t
    from specdeploy.speculation.exporter import serve
    known_engine(engine)
    from specdeploy.hostvars.argcheck import finite, http_url, listen_address
    try:
        finite(window, "--window", positive=True)
        listen_address(listen, "--listen")
        http_url(engine_url, "--engine-url")
    except SpecdeployError as exc:
        fail(exc)
    kv = dict(x.split("=", 1) for x in info or [] if "=" in x)
    if (group_port is None) != (not group_rank):
        error("--group-port" if group_port is None else "--group-rank", "goes with the other",
              "give both --group-port and one --group-rank HOST=ADDRESS per other rank, or neither")
    if group_port is not None and not 0 < group_port < 65536:
        error("--group-port", f"{group_port} is not a TCP port", "give 1-65535")
    bad = [r for r in group_rank or [] if "=" not in r or not r.split("=", 1)[0] or not r.split("=", 1)[1]]
    if bad:
        error("--group-rank", f"{bad[0]!r} is not HOST=ADDRESS", "give the rank's host name and its address")
    group = (group_port, list(group_rank)) if group_port is not None else None
    if weight_cache_record is not None and not weight_cache_health:
        error("--weight-cache-record", "goes with --weight-cache-health", "give the daemon's health check too")
    if weight_cache_health and not weight_cache_health.startswith(("http://", "https://", "files:")):
        error("--weight-cache-health", f"{weight_cache_health!r} is neither an http(s) URL nor files:GLOB:N",
              "give the health check from the host's plan")
    wc = (weight_cache_health, weight_cache_record) if weight_cache_health else None
    try:
        serve(engine, engine_url, listen, window, kv, gate_file, group, wc, surface_file)
    except OSError as exc:
        error("--listen", f"cannot listen on {listen}: {exc.strerror or exc}",
              "choose a free port and an address of this host")
    print(f"exporting {engine} spec-decode metrics from {engine_url} on {listen}", flush=True)
    while True:
        _t.sleep(3600)
