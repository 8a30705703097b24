"""``specdeploy deploy|rollback|verify``, ``status``, ``regate``, ``canary`` and ``report``."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.app import app
from specdeploy.cli.options import (ExtraVars, Inventory, Json, Limit, VaultIds, VaultPasswordFiles, error, fail,
                      inventory_optional, vault)
from specdeploy.values.terminal import safe

if TYPE_CHECKING:  # rich is imported by the commands that draw, not when the CLI loads
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

PHASE_STYLE = {"preflight": "blue",
               "provision": "cyan", "image": "cyan", "stage": "cyan", "start": "yellow", "load": "yellow",
               "ready": "green", "gate": "magenta", "rollback": "red"}


def _console() -> Console:
    from rich.console import Console
    c = Console()
    return c if c.is_terminal else Console(width=160)


def _esc(text, newlines: bool = False) -> str:
    """Text from outside (a host name, a task, a log line, a label) for a rich table or panel: control
    characters escaped (values.terminal; line breaks kept with ``newlines``), rich markup neutralised."""
    from rich.markup import escape
    return escape(safe("" if text is None else text, newlines))


def _rows_table(run, title: str) -> Table:
    from rich.table import Table

    from specdeploy.ops.progress import fmt_s
    t = Table(title=_esc(title), expand=False)
    for c in ("host", "phase", "progress", "elapsed", "result"):
        t.add_column(c)
    now = time.time()
    for r in run.rows.values():
        escape = _esc
        res = escape(r.result) or (f"[red]error in: {escape(r.failed_task)}[/]" if r.failed_task else "")
        if r.result == "ok":
            res = f"[green]ok[/] ({r.changed} changed)"
        elif r.result in ("failed", "unreachable"):
            res = f"[bold red]{r.result.upper()}[/]" + (f" at {escape(r.failed_task)}" if r.failed_task else "")
        t.add_row(escape(r.host), f"[{PHASE_STYLE.get(r.phase, 'white')}]{r.phase}[/]",
                  escape(r.progress or r.task[:48]), fmt_s(now - r.started), res)
    return t


def _fleet_view(run, title: str):
    """The live view of a fleet (ops/fleetview): hosts per phase and result, failures grouped by triaged root
    cause, the slowest hosts; about 25 lines whatever the fleet's size."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from specdeploy.ops.fleetview import deploy_summary
    from specdeploy.ops.progress import fmt_s
    s = deploy_summary(run.rows.values())
    head = Text(safe(f"{title}: {s['hosts']} hosts, {fmt_s(time.time() - run.started)}, {s['changed']} changes"),
                style="bold")
    phases = "  ".join(f"[{PHASE_STYLE.get(p, 'white')}]{_esc(p)}[/] {n}" for p, n in s["phases"]) or "-"
    styles = {"ok": "green", "failed": "bold red", "unreachable": "bold red", "not run": "yellow"}
    results = "  ".join(f"[{styles.get(k, 'white')}]{_esc(k)}[/] {n}" for k, n in s["results"]) or "-"
    parts = [head, Text.from_markup(f"working: {phases}"), Text.from_markup(f"done:    {results}")]
    f = s["failures"]
    if f["groups"]:
        t = Table(title=f"failures: {f['hosts']} host(s)", expand=False, title_justify="left")
        for c in ("root cause", "hosts", "fix"):
            t.add_column(c, overflow="fold")
        for g in f["groups"]:
            t.add_row(_esc(g["cause"][:200]), _esc(f"{g['hosts']}: {g['names']}"), _esc(g["fix"][:160] or "-"))
        if f["more_causes"]:
            t.add_row(f"... and {f['more_causes']} other root causes (events log)", "", "")
        parts.append(t)
    if s["slowest"]:
        t = Table(title="slowest", expand=False, title_justify="left")
        for c in ("host", "phase", "in phase", "progress"):
            t.add_column(c)
        for r in s["slowest"]:
            t.add_row(_esc(r["host"]), f"[{PHASE_STYLE.get(r['phase'], 'white')}]{_esc(r['phase'])}[/]",
                      fmt_s(r["in_phase_s"]), _esc((r["progress"] or "")[:60]))
        parts.append(t)
    return Group(*parts)


def _triage_panel(row) -> Panel:
    from rich.panel import Panel
    escape = _esc
    tr = row.triage or {}
    if tr:
        body = "\n".join(f"[bold]{k:10s}[/] {escape(str(tr.get(k)), True)}" for k in
                         ("outcome", "root_cause", "location", "worker", "signature", "confidence", "fix",
                          "next_step") if tr.get(k) or k == "root_cause")
    else:
        body = f"[bold]task[/]    {escape(row.failed_task)}\n[bold]message[/] {escape(row.message or '-', True)}"
    return Panel(body, title=f"triage: {escape(row.host)}", border_style="red")


def _playbook(action: str, inventory: str, limit: Optional[str], extra_vars: Optional[List[str]],
              events: Optional[Path], skip_preflight: bool, secrets=None):
    from specdeploy.hostvars.inventory import load, parse_extra_vars
    from specdeploy.ops.fleet import targets_of
    from specdeploy.ops.runner import PLAYBOOKS, Run, new_run_dir, redact, run_playbook, secret_values
    from specdeploy.values.outputs import check_file, check_forbidden, refuse
    out = _console()
    vaulted: set[str] = set()
    vaulted_paths: list[Path] = []
    try:
        if events is not None:  # before anything runs: the event log is a new file (values.outputs)
            if os.path.lexists(events):
                check_forbidden(events, "--events", "a new file path for the event log")
                raise refuse("--events", events, "exists; specdeploy writes the event log as a new file each run "
                             "and never appends to or changes a file it did not create",
                             "give a new file path for the event log (or leave --events out)")
            check_file(events, "--events", "deploy", None, "a new file path for the event log")
        if secrets is not None:  # a secret ansible-playbook could not be given under the runner: before any prompt
            secrets.playbook_args()
        extra = parse_extra_vars(extra_vars, secrets, vaulted, vaulted_paths)
        inv = load(inventory, limit=limit, extra=extra, vault=secrets)
        hosts, _ = targets_of(inv)
    except SpecdeployError as exc:
        fail(exc)
    for w in inv.warnings:
        out.print(w.line(), markup=False, highlight=False)
    if not hosts:
        error("--limit", f"no engine host of {inventory} matches '{limit}'",
              "give hosts or groups of the inventory's specdeploy_engines group")
    if action == "deploy" and not skip_preflight:
        from specdeploy.checks.preflight import preflight
        try:
            reports = preflight(inventory, limit, extra, secrets)
        except SpecdeployError as exc:
            fail(exc)
        from specdeploy.checks.preflight import grouped
        from specdeploy.values.hostranges import compact
        for names, ok_, errors, lines in grouped(reports):  # hosts with the same findings once, by name ranges
            who = names[0] if len(names) == 1 else f"{compact(names)} ({len(names)} hosts)"
            out.print(f"preflight {safe(who)}: " + ("OK" if ok_ else f"{errors} error(s)"), markup=False,
                      highlight=False)
            for line in lines:
                out.print("  " + line, markup=False, highlight=False)
        if not all(r.ok for r in reports.values()):
            out.print("[red]preflight failed: nothing was changed on any host[/]")
            raise typer.Exit(1)
    try:  # the run's own directory: its event log, nothing else (ops.runner); older runs pruned
        base = new_run_dir(Path(".cache/runs"), action)
    except OSError as exc:
        error(".cache/runs", f"cannot be created ({exc.strerror or exc})", "run from a directory you can write to")
    events = events or base / "events.jsonl"
    live_tty = out.is_terminal
    shown: set[str] = set()

    def changed(run, host):
        row = run.rows[host]
        if not live_tty:  # a log, not a screen: one line per change
            msg = f"{host}: {row.phase}" + (f" - {row.progress}" if row.progress else "")
            if row.failed_task:
                msg += f" - error in: {row.failed_task}"
            out.print(safe(msg), markup=False, highlight=False)
        if row.triage and host not in shown:
            shown.add(host)
            if not live_tty and len(run.rows) <= ROWS_MAX:
                out.print(_triage_panel(row))

    shown_extra, hidden = redact(extra, vaulted)
    hidden |= secret_values(inv)
    # values that came out of a vault reach ansible-playbook as their encrypted files, which it decrypts itself
    vaulted_files = [str(p) for p in vaulted_paths]
    runner_extra = {k: v for k, v in extra.items() if k not in vaulted}
    try:
        run = Run(hosts, events, changed, hidden)
    except SpecdeployError as exc:
        fail(exc)
    run.log(event="started", action=action, playbook=PLAYBOOKS[action], inventory=str(inventory), limit=limit,
            extra=shown_extra)
    title = f"specdeploy {action} - {inventory}"
    from specdeploy.ops.fleetview import ROWS_MAX

    from rich.console import Group
    from rich.live import Live

    def view():
        if len(run.rows) > ROWS_MAX:  # a fleet: one screen of counts, grouped failures and the slowest hosts
            return _fleet_view(run, title)
        return Group(_rows_table(run, title), *[_triage_panel(r) for r in run.rows.values() if r.triage])
    from specdeploy.ops.fleet import forks_for
    forks = forks_for(inv, len(hosts))
    if live_tty:
        with Live(view(), console=out, refresh_per_second=2, get_renderable=view):
            rc = run_playbook(run, PLAYBOOKS[action], inventory, limit, runner_extra, secrets, vaulted_files, forks)
    else:
        rc = run_playbook(run, PLAYBOOKS[action], inventory, limit, runner_extra, secrets, vaulted_files, forks)
        out.print(view())
    for r in run.rows.values():
        if len(run.rows) <= ROWS_MAX and r.result in ("failed", "unreachable") and not r.triage \
                and r.host not in shown:
            out.print(_triage_panel(r))
    ok = sum(r.result == "ok" for r in run.rows.values())
    out.print(f"{action}: {ok}/{len(run.rows)} hosts ok (ansible rc {rc}); events in {safe(events)}", markup=False,
              highlight=False)
    raise typer.Exit(run.exit_code)


def _status_table(st: dict) -> Table:
    from rich.table import Table

    from specdeploy.ops.status import weight_cache_text
    escape = _esc
    t = Table(title=f"fleet status ({time.strftime('%H:%M:%S', time.localtime(st['time']))}, prometheus: "
                    f"{escape(st['prometheus'] or 'unreachable')})")
    grouped = any(r.get("group") for r in st["hosts"])
    cached = any(r.get("weight_cache") for r in st["hosts"])  # a weights column where any engine attaches
    for c in ("host",) + (("group",) if grouped else ()) + ("up", "engine", "release", "spec", "gate", "AL",
                                                           "accept", "tok/s", "TTFT p50/p99", "restarts") \
            + (("weights",) if cached else ()):
        t.add_column(c)

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    for r in st["hosts"]:
        head = [escape(r["host"])] + ([escape(f"{r['group']} rank {r['rank']}" + (f" (via {r['via']})"
                                                                                  if r.get("via") else ""))
                                       if r.get("group") else "-"] if grouped else [])
        if not r["reachable"] or r.get("error"):  # a host that answered garbage is one bad row, with the reason
            state = "unreachable" if not r["reachable"] else r.get("group_state") or "bad answer"
            t.add_row(*head, f"[bold red]{state}[/]", escape(r.get("error", "")), "", "", "", "", "", "", "", "",
                      *([""] if cached else []))
            continue
        up = "[green]up[/]" if r.get("up") else "[red]engine down[/]"
        ttft = "-" if r.get("ttft_p50") is None else f"{r['ttft_p50'] * 1000:.0f}/{r.get('ttft_p99', 0) * 1000:.0f} ms"
        t.add_row(*head, up, escape(f"{r.get('engine') or '?'} {r.get('version') or ''}"),
                  escape(r.get("release") or "-"),
                  escape(str(r.get("speculation", "?")) + (f" k={r['spec_tokens']}" if r.get("speculation") == "on"
                                                          else "")),
                  escape(r.get("gate") or "-"), f(r.get("acceptance_length"), ".2f"),
                  f(r.get("acceptance_rate"), ".0%"),
                  f(r.get("tokens_per_s"), ".1f"), ttft, f(r.get("restarts"), ".0f"),
                  *([escape(weight_cache_text(r.get("weight_cache")))] if cached else []))
    return t


def _rows_max() -> int:
    from specdeploy.ops.fleetview import ROWS_MAX
    return ROWS_MAX


def _status_summary(st: dict):
    """A fleet's status on one screen (ops/fleetview.status_summary): hosts per state, per release and per serving
    group, what is wrong where, the fleet's figures; ``--all`` or ``--json`` for every host."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from specdeploy.ops.fleetview import status_summary
    s = status_summary(st)
    styles = {"up": "green", "unreachable": "bold red", "engine down": "red"}
    head = Text.from_markup(f"[bold]fleet status[/] ({time.strftime('%H:%M:%S', time.localtime(st['time']))}, "
                            f"prometheus: {_esc(st['prometheus'] or 'unreachable')}): {s['hosts']} hosts  "
                            + "  ".join(f"[{styles.get(k, 'yellow')}]{_esc(k)}[/] {n}" for k, n in s["states"].items()))
    parts = [head]
    t = Table(title="serving, per release", expand=False, title_justify="left")
    for c in ("engine", "release", "spec", "hosts"):
        t.add_column(c, overflow="fold")
    for r in s["releases"]:
        t.add_row(_esc(f"{r['engine']} {r['version']}"), _esc(r["release"]),
                  _esc(r["speculation"] + (f" k={r['spec_tokens']}" if r["speculation"] == "on" else "")),
                  _esc(f"{r['hosts']}: {r['names']}"))
    if s["more_releases"]:
        t.add_row(f"... and {s['more_releases']} more releases", "", "", "")
    parts.append(t)
    if s["groups"]:
        parts.append(Text(f"serving groups: {s['groups']}, {len(s['groups_broken']) + s['more_groups_broken']} "
                          "not whole: " + (", ".join(safe(g["group"]) for g in s["groups_broken"]) or "none")))
    if s["trouble"]:
        t = Table(title="needs a look", expand=False, title_justify="left")
        for c in ("what", "hosts"):
            t.add_column(c, overflow="fold")
        for r in s["trouble"]:
            t.add_row(_esc(r["what"]), _esc(f"{r['hosts']}: {r['names']}"))
        if s["more_trouble"]:
            t.add_row(f"... and {s['more_trouble']} more (--all or --json)", "")
        parts.append(t)
    fig = s["figures"]
    if fig:
        bits = []
        if "acceptance_length" in fig:
            a = fig["acceptance_length"]
            bits.append(f"acceptance length mean {a['mean']:.2f} (min {a['min']:.2f}, max {a['max']:.2f})")
        if "tokens_per_s" in fig:
            bits.append(f"output {fig['tokens_per_s']['sum']:.0f} tok/s in all")
        parts.append(Text("; ".join(bits)))
    return Group(*parts)


for action, doc in (("deploy", "Provision, build, deploy (+gate) and verify through Ansible, one row per host."),
                    ("rollback", "Roll every host back to its previous release."),
                    ("verify", "Check every engine answers a real generation.")):
    def cmd(inventory: str = Inventory, limit: Optional[str] = Limit, extra_vars: Optional[List[str]] = ExtraVars,
            events: Optional[Path] = typer.Option(None, "--events", help="JSON lines event log (default "
                                                  ".cache/runs/<time>-<action>/events.jsonl)"),
            skip_preflight: bool = typer.Option(False, "--skip-preflight", help="run the playbook without specdeploy's "
                                                "preflight first (the playbook runs its own)"),
            vault_id: Optional[List[str]] = VaultIds, vault_password_file: Optional[List[str]] = VaultPasswordFiles,
            _action: str = typer.Option(action, hidden=True)):
        _playbook(_action, inventory, limit, extra_vars, events, skip_preflight, vault(vault_id, vault_password_file))
    cmd.__doc__ = doc + " Exit 0 all hosts ok, 1 any host failed, 2 bad input."
    app.command(action)(cmd)

@app.command("status")
def status_cmd(inventory: str = Inventory, limit: Optional[str] = Limit,
               prometheus: Optional[str] = typer.Option(None, "--prometheus", help="default: the monitoring "
                                                        "host's :9090"),
               as_json: bool = Json,
               watch: bool = typer.Option(False, "--watch", help="redraw every --interval seconds"),
               interval: float = typer.Option(5.0, "--interval", help="seconds between redraws with --watch"),
               timeout: float = typer.Option(2.0, "--timeout", help="total deadline of each host's and query's "
                                             "answer, seconds"),
               concurrency: int = typer.Option(128, "--concurrency", help="requests in flight at once"),
               deadline: Optional[float] = typer.Option(None, "--deadline", help="seconds within which status "
                                                        "answers for every host (default: enough for every "
                                                        "request to use its --timeout)"),
               every_host: bool = typer.Option(False, "--all", help="one row per host even for a fleet (more "
                                               "than 24 hosts get a summary per state, group and release)"),
               vault_id: Optional[List[str]] = VaultIds,
               vault_password_file: Optional[List[str]] = VaultPasswordFiles):
    """The fleet: up, engine, release, speculation, gate verdict, acceptance, tokens/s, TTFT, restarts."""
    from specdeploy.hostvars.argcheck import finite
    from specdeploy.ops.fleet import targets
    from specdeploy.ops.status import fleet_status, prometheus_urls
    try:
        finite(timeout, "--timeout", positive=True)
        finite(interval, "--interval", positive=True)
        if deadline is not None:
            finite(deadline, "--deadline", positive=True)
        if concurrency < 1:
            from specdeploy.values.errors import Finding
            raise SpecdeployError([Finding("error", "--concurrency", f"{concurrency} is below 1",
                                           "give a count of at least 1")])
        hosts, mon = targets(inventory, limit, vault=vault(vault_id, vault_password_file))
    except SpecdeployError as exc:
        fail(exc)
    proms = prometheus_urls(mon, prometheus)
    out = _console()

    def ask():
        return fleet_status(hosts, proms, timeout, concurrency, deadline)

    def shown(st):
        return _status_table(st) if every_host or len(st["hosts"]) <= _rows_max() else _status_summary(st)
    if watch and not as_json:
        from rich.live import Live
        with Live(shown(ask()), console=out) as live:
            try:
                while True:
                    time.sleep(interval)
                    live.update(shown(ask()))
            except KeyboardInterrupt:
                pass
        return
    while True:
        st = ask()
        if as_json:
            from specdeploy.ops.fleetview import status_summary
            print(json.dumps({**st, "summary": status_summary(st)}), flush=True)
        else:
            out.print(shown(st))
        if not watch:
            break
        time.sleep(interval)
    raise typer.Exit(0 if all(r["reachable"] and r.get("up") for r in st["hosts"]) else 1)

@app.command("regate")
def regate_cmd(inventory: str = Inventory, limit: Optional[str] = Limit,
               prometheus: Optional[str] = typer.Option(None, "--prometheus", help="default: the monitoring "
                                                        "host's :9090"),
               watch: Optional[float] = typer.Option(None, "--watch", help="check again every SECONDS until "
                                                     "interrupted (default: one pass)"),
               cooldown: float = typer.Option(3600.0, "--cooldown", help="seconds after a host's re-gate before "
                                              "it is re-gated again"),
               state: Optional[Path] = typer.Option(None, "--state", help="the record of re-gates (default: "
                                                    "$XDG_STATE_HOME/specdeploy/regate.json)"),
               dry_run: bool = typer.Option(False, "--dry-run", help="say what would be re-gated, run nothing"),
               as_json: bool = Json,
               vault_id: Optional[List[str]] = VaultIds,
               vault_password_file: Optional[List[str]] = VaultPasswordFiles):
    """The continuous gate: re-run the speculation gate (a deploy with specdeploy_spec_gate) on each host whose
    alert asks for it (live speedup below 1.0 for the rules' regate_after), one host at a time."""
    from specdeploy.hostvars.argcheck import finite
    from specdeploy.ops.fleet import targets
    from contextlib import ExitStack

    from specdeploy.ops.regate import check_state_path, default_state, read_state, regate, state_lock
    from specdeploy.ops.status import prometheus_urls
    from specdeploy.values.peerhttp import PeerError
    held = ExitStack()
    try:
        finite(cooldown, "--cooldown", positive=False)
        if watch is not None:
            finite(watch, "--watch", positive=True)
        state_path = state or default_state()
        check_state_path(state_path)  # a bad state path is an error before anything runs
        read_state(state_path)
        hosts, mon = targets(inventory, limit, vault=vault(vault_id, vault_password_file))
        # before anything is deployed: the state file's lock (a second regate on it is refused), which also
        # makes sure the state can be written
        held.enter_context(state_lock(state_path))
        read_state(state_path)  # as the run that held the lock before left it
    except SpecdeployError as exc:
        held.close()
        fail(exc)
    proms = prometheus_urls(mon, prometheus)
    if not proms:
        error("--prometheus", f"{inventory} has no monitoring host", "give --prometheus URL")

    def say(m: str) -> None:
        print(safe(m, newlines=True), file=sys.stderr if as_json else sys.stdout, flush=True)
    with held:
        while True:
            try:
                done = regate(inventory, proms[0], {t.host: t.address for t in hosts}, state_path, cooldown,
                              dry_run, say)
            except PeerError as exc:
                error("--prometheus", f"cannot read the alerts: {exc}", "check that Prometheus is up at that URL")
            except SpecdeployError as exc:
                fail(exc)
            if as_json:
                print(json.dumps({"time": time.time(), "hosts": done}), flush=True)
            else:
                for d in done:
                    if d["action"] == "skipped":
                        print(f"regate {safe(d['host'])}: left alone - {safe(d['why'])}")
                if not done:
                    print("regate: no host needs it")
            if watch is None:
                break
            time.sleep(watch)
    raise typer.Exit(1 if any(d.get("rc") not in (None, 0) for d in done) else 0)


@app.command("canary")
def canary_cmd(inventory: str = Inventory,
               host: str = typer.Option(..., "--host", help="the engine host that takes the change first"),
               extra_vars: Optional[List[str]] = ExtraVars,
               control: Optional[str] = typer.Option(None, "--control", help="the host on the serving release it "
                                                     "is measured against (default: the first other engine host)"),
               concurrency: int = typer.Option(4, "--concurrency", help="matched load: streams on each side"),
               requests: int = typer.Option(8, "--requests", help="requests per round and side"),
               rounds: int = typer.Option(6, "--rounds", help="interleaved rounds per side (at least 2)"),
               max_tokens: int = typer.Option(64, "--max-tokens", help="tokens each measured request generates"),
               tolerance: float = typer.Option(0.05, "--tolerance", help="how far the bottom of a 95%% interval "
                                               "may reach below 1 (noise) when the point beats the serving release"),
               out: Path = typer.Option(Path(".cache/canary"), "--out", help="directory for canary.json and "
                                        "canary.png"),
               as_json: bool = Json,
               vault_id: Optional[List[str]] = VaultIds,
               vault_password_file: Optional[List[str]] = VaultPasswordFiles):
    """A canary for a new drafter or release: deploy the change (-e, or what the inventory now holds) to one host,
    measure it against a host on the serving release at matched load, and promote it to every host only when its
    time per output token and acceptance length beat the serving ones; otherwise roll the canary back."""
    from specdeploy.hostvars.argcheck import finite
    from specdeploy.hostvars.inventory import parse_extra_vars
    from specdeploy.ops.canary import canary
    from specdeploy.ops.fleet import targets
    from specdeploy.values.peerhttp import PeerError
    from specdeploy.values.errors import Finding
    from specdeploy.ops.canary import CANARY_CMD
    from specdeploy.plan.outdir import check_target
    try:
        check_target(out, CANARY_CMD)  # before anything is deployed: what --out may be (plan.outdir)
        for name, v, lo in (("--concurrency", concurrency, 1), ("--requests", requests, 1), ("--rounds", rounds, 2),
                            ("--max-tokens", max_tokens, 1)):
            if v < lo:
                raise SpecdeployError([Finding("error", name, f"{v} is below {lo}", f"give {name} >= {lo}")])
        finite(tolerance, "--tolerance", positive=False)
        if not 0 <= tolerance < 1:
            raise SpecdeployError([Finding("error", "--tolerance", f"{tolerance} is outside [0, 1)",
                                           "give a fraction such as 0.05")])
        secrets = vault(vault_id, vault_password_file)
        extra = parse_extra_vars(extra_vars, secrets, set(), [])
        hosts, _ = targets(inventory, None, extra, secrets)
    except SpecdeployError as exc:
        fail(exc)
    def say(m: str) -> None:
        print(safe(m, newlines=True), file=sys.stderr if as_json else sys.stdout, flush=True)
    try:
        rep = canary(inventory, host, list(extra_vars or []), hosts, control, concurrency, requests, max_tokens,
                     rounds, tolerance, out, say=say,
                     passthrough=[a for v in vault_id or [] for a in ("--vault-id", v)]
                     + [a for v in vault_password_file or [] for a in ("--vault-password-file", v)])
    except PeerError as exc:
        error("canary", f"an engine did not answer the measurement: {exc}", "check the hosts with specdeploy status; "
              "the canary host may need `specdeploy rollback --limit HOST`")
    except SpecdeployError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(rep), flush=True)
    else:
        print(f"canary {host}: {rep['decision']['decision']}; fleet "
              + ("on its serving releases" if rep["fleet_on_serving"] else f"now on {rep['after']}")
              + f" (report: {safe(out / 'canary.json')})")
    promoted = rep["decision"]["decision"] == "promote" and rep.get("promote_rc") == 0
    raise typer.Exit(0 if promoted else 1 if rep["fleet_on_serving"] else 2)


@app.command("report")
def report_cmd(inventory: Optional[str] = inventory_optional(),
               prometheus: Optional[str] = typer.Option(None, "--prometheus", help="Prometheus base URL (default: the "
                                                        "inventory's monitoring host)"),
               range_: str = typer.Option("1h", "--range", help="30m, 1h, 6h, ..."),
               nccl: Optional[Path] = typer.Option(None, "--nccl", help="`specdeploy nccl tune` result JSON, "
                                                   "for the all-reduce share"),
               layers: int = typer.Option(61, "--layers", min=1, help="decoder layers (Kimi-K2.5 / DeepSeek-V3: 61)"),
               k: int = typer.Option(3, "--k", min=0, help="draft tokens per step"),
               out: Path = typer.Option(Path("report.png"), "--out", help="the PNG to write (only an earlier report "
                                        "is replaced)"),
               by: str = typer.Option("auto", "--by", help="one line per host, serving group or release (auto: "
                                      "per host up to 12 hosts, else per release)"),
               host: Optional[List[str]] = typer.Option(None, "--host", help="only this host (repeat for more)"),
               group: Optional[List[str]] = typer.Option(None, "--group", help="only this serving group's hosts"),
               release: Optional[List[str]] = typer.Option(None, "--release", help="only the hosts on this release"),
               as_json: bool = Json, vault_id: Optional[List[str]] = VaultIds,
               vault_password_file: Optional[List[str]] = VaultPasswordFiles):
    """Key dashboard panels as a PNG from Prometheus: acceptance length, speedup, tokens/s, all-reduce share; per
    host, or for a fleet per serving group or release, drilling down with --host, --group and --release."""
    from specdeploy.hostvars.argcheck import duration, label_values
    from specdeploy.ops.fleet import targets
    from specdeploy.ops.status import prometheus_urls
    from specdeploy.speculation.report import BY, LINES, render
    try:
        secs = duration(range_, "--range")
    except SpecdeployError as exc:
        fail(exc)
    if layers < 1 or k < 1:
        error("--layers" if layers < 1 else "--k", f"{layers if layers < 1 else k} is not a positive count",
              "give a count of at least 1")
    if by not in BY:
        error("--by", f"{by!r} is not a way to group the lines", f"give one of {', '.join(BY)}")
    try:
        select = {"host": label_values(host, "--host"), "group": label_values(group, "--group"),
                  "release": label_values(release, "--release")}
    except SpecdeployError as exc:
        fail(exc)
    if not prometheus and not inventory:
        error("--prometheus", "no Prometheus given", "give --prometheus URL or -i INVENTORY (its monitoring host)")
    from specdeploy.values.outputs import check_png
    try:  # before any query: the suffix and what the rule lets report write (values.outputs)
        check_png(out, "--out", "report")
    except SpecdeployError as exc:
        fail(exc)
    nccl_data = None
    if nccl:
        from specdeploy.hostvars.argcheck import read_json
        try:
            nccl_data = read_json(nccl, "--nccl", "a `specdeploy nccl tune` result JSON")
        except SpecdeployError as exc:
            fail(exc)
        from specdeploy.nccl.choose import ChooseError, check_results
        try:
            check_results(nccl_data, str(nccl))
        except ChooseError as exc:
            error("--nccl", str(exc), "give the results file `specdeploy nccl tune` wrote")
    urls = [prometheus] if prometheus else []
    if inventory:
        try:
            urls = prometheus_urls(targets(inventory, vault=vault(vault_id, vault_password_file))[1], prometheus)
        except SpecdeployError as exc:
            fail(exc)
    errors = []
    for url in urls:
        try:
            res = render(url, out, secs, nccl_data, layers, k, by=by, select=select)
            break
        except SpecdeployError as exc:
            fail(exc)
        except OSError as exc:
            errors.append(f"{url}: {getattr(exc, 'reason', exc)}")
    else:
        error("--prometheus", f"cannot query {'; '.join(errors) or 'no Prometheus'}",
              "check the monitoring host is up")
    cut = any(len(res["drawn"][k]) < len(v) for k, v in res["last"].items())
    print(json.dumps(res, indent=2) if as_json else f"wrote {safe(res['png'])} from {safe(res['prometheus'])}: "
          f"{res['hosts']} hosts, one line per {res['by']}"
          + (f" (a panel with more lines draws the {LINES} worst)" if cut else ""))
