"""``specdeploy preflight``, ``triage``, ``breakeven`` and ``gate``."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from ..engines import DEFAULT as DEFAULT_ENGINE
from ..errors import SpecdeployError
from .app import app
from .options import ExtraVars, Inventory, Json, Limit, error, fail, finite, known_engine, output_dir


@app.command("preflight")
def preflight_cmd(inventory: str = Inventory, limit: Optional[str] = Limit,
                  extra_vars: Optional[List[str]] = ExtraVars, as_json: bool = Json,
                  hosts: bool = typer.Option(False, "--hosts", help="Read the hosts over SSH (read-only): "
                                             "driver, GPUs, fabric manager, ACS, IOMMU, Docker.")):
    """Check everything knowable before the model load; change nothing. Exit 1 on any error."""
    from ..inventory import parse_extra_vars
    from ..preflight import preflight
    t0 = time.perf_counter()
    try:
        if hosts:
            from ..hostfacts import preflight_hosts
            reports = preflight_hosts(inventory, limit, parse_extra_vars(extra_vars))
        else:
            reports = preflight(inventory, limit, parse_extra_vars(extra_vars))
    except SpecdeployError as exc:
        fail(exc)
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
               journal: Optional[str] = typer.Option(None, "--journal", help="systemd unit to read (also reads "
                                                     "the kernel log for OOM kills)"),
               kernel_log: Optional[Path] = typer.Option(None, "--kernel-log", help="saved dmesg / journalctl -k "
                                                         "output, evidence for OOM kills"),
               as_json: bool = Json):
    """Root exception of engine logs, how the engine ended (failed, clean-shutdown, killed), known fixes."""
    import subprocess

    from ..triage import read_log, triage_lines

    kernel: list[str] = []
    if kernel_log is not None:
        if not kernel_log.is_file():
            error("--kernel-log", f"{kernel_log} is not a file", "give a saved `dmesg` or `journalctl -k` output")
        kernel = read_log(kernel_log)
    if journal:
        try:
            r = subprocess.run(["journalctl", "-u", journal, "--no-pager", "-o", "cat", "-n", "20000"],
                               check=False, capture_output=True, text=True, errors="replace")
        except OSError as exc:
            error(f"--journal {journal}", f"cannot run journalctl ({exc})",
                  "run on the host, or save the log and pass it as a file")
        if r.returncode != 0 and not r.stdout:
            error(f"--journal {journal}", f"journalctl failed: {r.stderr.strip()[:200]}",
                  "check the unit name (systemctl list-units 'specdeploy-*')")
        lines = r.stdout.splitlines()
        if not kernel:
            try:
                k = subprocess.run(["journalctl", "-k", "--no-pager", "-o", "short-iso", "-n", "5000"],
                                   check=False, capture_output=True, text=True, errors="replace")
                kernel = k.stdout.splitlines()
            except OSError:
                kernel = []
    else:
        bad = [f"{p} ({'missing' if not p.exists() else 'not a file'})" for p in logfiles or [] if not p.is_file()]
        if not logfiles or bad:
            error("LOGFILE", ', '.join(bad) or 'none given', "give engine log files or --journal UNIT")
        lines = []
        for p in logfiles:
            try:
                lines.extend(read_log(p))
            except OSError as exc:
                error(f"LOGFILE {p}", str(exc.strerror or exc), "make it readable or copy it somewhere readable")
    res = triage_lines(lines, kernel)
    if as_json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        for k, v in res.to_dict().items():
            if k == "evidence":
                for e in v:
                    where = f"line {e['line']}" if e.get("line") else "kernel log"
                    print(f"{'evidence':11s} {where}: {e['text']}  ({e['why']})")
            elif v is not None and not (k == "next_step" and v in (res.fix or "")):
                print(f"{k:11s} {v}")
    raise typer.Exit(0 if res.root_cause or res.outcome == "clean-shutdown" else 1)

@app.command("breakeven")
def breakeven_cmd(acceptance_length: float = typer.Option(..., "--acceptance-length"),
                  step_ratio: float = typer.Option(..., "--step-ratio", help="T_spec / T_base"),
                  margin: float = typer.Option(0.10, "--margin"), as_json: bool = Json):
    """Predicted speedup of speculation and whether to keep it."""
    from ..gate import breakeven
    finite(acceptance_length, "--acceptance-length", 1)
    finite(step_ratio, "--step-ratio", 0, above=True)
    try:
        b = breakeven(acceptance_length, step_ratio, margin)
    except ValueError as exc:
        error("--acceptance-length" if "acceptance" in str(exc) else "--step-ratio", str(exc),
              "give --acceptance-length >= 1 and --step-ratio > 0")
    if as_json:
        print(json.dumps(b.to_dict(), indent=2))
    else:
        print(f"speedup {b.speedup:.2f}x (AL {b.acceptance_length:g} / step ratio {b.step_ratio:g}); "
              f"break-even AL {b.step_ratio:g}, with {b.margin:.0%} margin {b.breakeven_al:.2f}: {b.verdict}")

@app.command("gate")
def gate_cmd(url: str = typer.Option(..., "--url"), engine: str = typer.Option(DEFAULT_ENGINE, "--engine"),
             prompts: Optional[Path] = typer.Option(None, "--prompts"),
             concurrency: str = typer.Option("1,8,32", "--concurrency"),
             requests: Optional[int] = typer.Option(None, "--requests", min=1, help="per level; default 4 x c, >= 16"),
             max_tokens: int = typer.Option(128, "--max-tokens", min=1),
             baseline: Optional[Path] = typer.Option(None, "--baseline",
                                                     help="report of a run without speculation"),
             k: Optional[int] = typer.Option(None, "--k", min=1, help="draft tokens deployed (default: from metrics)"),
             margin: float = typer.Option(0.10, "--margin"),
             api_key_file: Optional[Path] = typer.Option(None, "--api-key-file"),
             out: Path = typer.Option(Path("gate"), "--out"), as_json: bool = Json):
    """Measure whether speculation pays under a bounded load of real chat prompts; write report + chart."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from ..gate import chart, check_baseline, gate, load_prompts
    known_engine(engine)
    output_dir(out, "--out", "a directory for report.json and report.png")
    try:
        levels = [int(c) for c in concurrency.split(",")]
        assert levels and all(c > 0 for c in levels)
    except (ValueError, AssertionError):
        error("--concurrency", f"'{concurrency}' is not a list of positive numbers", "give a list like 1,8,32")
    from ..argcheck import http_url, read_json_object, read_text
    try:
        url = http_url(url, "--url")
        base = read_json_object(baseline, "--baseline", "a report.json written by `specdeploy gate`") \
            if baseline else None
        key = read_text(api_key_file, "--api-key-file", "a file holding the API key").strip() \
            if api_key_file else None
        if base is not None:
            check_baseline(base, baseline)
        load_prompts(prompts)
    except SpecdeployError as exc:
        fail(exc)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as prog:
        task = prog.add_task("gate", total=len(levels))

        def cb(c, n):
            prog.update(task, description=f"gate: concurrency {c}, {n} requests",
                        completed=levels.index(c))
        try:
            report = gate(url, engine, levels, requests, max_tokens, prompts, base, k, margin, key, cb)
        except OSError as exc:
            error("--url", f"cannot reach {url}: {exc}", "check the engine is up")
        except SpecdeployError as exc:
            fail(exc)
        prog.update(task, completed=len(levels))
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    chart(report, out / "report.png")
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for lv in report["levels"]:
            al = lv.get("acceptance_length")
            sp = lv.get("speedup")
            print(f"c={lv['concurrency']:<4} failed {lv.get('errors', 0)}/{lv.get('requests')}  "
                  f"tok/s {lv['output_tps']:8.1f}  AL {al and round(al, 2)}  "
                  f"accept {lv.get('acceptance_rate') and round(lv['acceptance_rate'], 2)}  "
                  f"speedup {sp and round(sp, 2)}  "
                  f"break-even AL {lv.get('breakeven_al') and round(lv['breakeven_al'], 2)}")
        k_rec = ("k=" + str(report["recommended_k"])) if report.get("recommended_k") else ""
        print(f"verdict: {report.get('verdict')} {k_rec} - {report.get('reason')}")
        print(f"wrote {out / 'report.json'} and {out / 'report.png'}")
    if report.get("refused"):  # no verdict: whoever applies verdicts keeps the previous one
        print(f"gate refused to decide: {report['refused']}", file=sys.stderr)
        raise typer.Exit(1)
