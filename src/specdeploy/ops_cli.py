"""``specdeploy preflight``, ``triage`` and ``breakeven``."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from .errors import SpecdeployError


def register(app: typer.Typer):
    @app.command("preflight")
    def preflight_cmd(inventory: str = typer.Option(..., "-i", "--inventory"),
                      limit: Optional[str] = typer.Option(None, "--limit"),
                      extra_vars: Optional[List[str]] = typer.Option(None, "-e", "--extra-vars"),
                      as_json: bool = typer.Option(False, "--json")):
        """Check everything knowable before the model load; change nothing. Exit 1 on any error."""
        from .inventory import parse_extra_vars
        from .preflight import preflight
        t0 = time.perf_counter()
        try:
            reports = preflight(inventory, limit, parse_extra_vars(extra_vars))
        except SpecdeployError as exc:
            for p in exc.problems:
                print(p.line(), file=sys.stderr)
            raise typer.Exit(2)
        ok = all(r.ok for r in reports.values())
        if as_json:
            print(json.dumps({"ok": ok, "hosts": {h: r.to_dict() for h, r in reports.items()}}, indent=2))
        else:
            for host, r in reports.items():
                print(f"== {host}: {'OK' if r.ok else f'{len(r.errors)} error(s)'}")
                for f in r.findings:
                    f.host = None
                    print("  " + f.line())
            print(f"preflight {'passed' if ok else 'FAILED'} in {time.perf_counter() - t0:.1f} s")
        raise typer.Exit(0 if ok else 1)

    @app.command("triage")
    def triage_cmd(logfiles: Optional[List[Path]] = typer.Argument(None),
                   journal: Optional[str] = typer.Option(None, "--journal", help="systemd unit to read"),
                   as_json: bool = typer.Option(False, "--json")):
        """Find the root exception in multi-process engine logs and name known failures."""
        import subprocess
        from .triage import triage_files, triage_lines
        if journal:
            r = subprocess.run(["journalctl", "-u", journal, "--no-pager", "-o", "cat", "-n", "20000"],
                               capture_output=True, text=True)
            res = triage_lines(r.stdout.splitlines())
        else:
            missing = [str(p) for p in logfiles or [] if not p.is_file()]
            if not logfiles or missing:
                print(f"ERROR LOGFILE: {', '.join(missing) or 'none given'} Fix: give log files or --journal UNIT",
                      file=sys.stderr)
                raise typer.Exit(2)
            res = triage_files(logfiles)
        if as_json:
            print(json.dumps(res.to_dict(), indent=2))
        else:
            for k, v in res.to_dict().items():
                print(f"{k:11s} {v}")
        raise typer.Exit(0 if res.root_cause else 1)

    @app.command("breakeven")
    def breakeven_cmd(acceptance_length: float = typer.Option(..., "--acceptance-length"),
                      step_ratio: float = typer.Option(..., "--step-ratio", help="T_spec / T_base"),
                      margin: float = typer.Option(0.10, "--margin"), as_json: bool = typer.Option(False, "--json")):
        """Predicted speedup of speculation and whether to keep it."""
        from .gate import breakeven
        try:
            b = breakeven(acceptance_length, step_ratio, margin)
        except ValueError as exc:
            print(f"ERROR {exc}", file=sys.stderr)
            raise typer.Exit(2)
        if as_json:
            print(json.dumps(b.to_dict(), indent=2))
        else:
            print(f"speedup {b.speedup:.2f}x (AL {b.acceptance_length:g} / step ratio {b.step_ratio:g}); "
                  f"break-even AL {b.step_ratio:g}, with {b.margin:.0%} margin {b.breakeven_al:.2f}: {b.verdict}")
