"""``specdeploy preflight``, ``triage``, ``breakeven`` and ``gate``."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from specdeploy.engines import DEFAULT as DEFAULT_ENGINE
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.cli.app import app
from specdeploy.cli.options import (ENGINE_HELP, ExtraVars, Inventory, Json, Limit, VaultIds, VaultPasswordFiles, error,
                                    fail, inventory_optional, known_engine, vault)
from specdeploy.values.terminal import safe


@app.command("preflight")
def preflight_cmd(inventory: str = Inventory, limit: Optional[str] = Limit,
                  extra_vars: Optional[List[str]] = ExtraVars, as_json: bool = Json,
                  hosts: bool = typer.Option(False, "--hosts", help="Read the hosts over SSH (read-only): "
                                             "driver, GPUs, fabric manager, ACS, IOMMU, Docker."),
                  vault_id: Optional[List[str]] = VaultIds,
                  vault_password_file: Optional[List[str]] = VaultPasswordFiles,
                  probe: bool = typer.Option(False, "--probe", help="Also run the pinned engine's own config "
                                             "validation and drafter loading (specdeploy probe) on the target and "
                                             "drafter copies."),
                  probe_python: Optional[str] = typer.Option(None, "--probe-python", help="The engine's Python for "
                                                             "--probe (default: python3).")):
    """Check everything knowable before the model load; change nothing. Exit 1 on any error."""
    from specdeploy.hostvars.inventory import parse_extra_vars
    from specdeploy.checks.preflight import preflight
    t0 = time.perf_counter()
    try:
        secrets = vault(vault_id, vault_password_file)
        extra = parse_extra_vars(extra_vars, secrets)
        if hosts:
            from specdeploy.gpuhost.remote import preflight_hosts
            reports = preflight_hosts(inventory, limit, extra, vault=secrets)
        else:
            reports = preflight(inventory, limit, extra, secrets,
                                probe_python=(probe_python or "python3") if probe else None)
    except SpecdeployError as exc:
        fail(exc)
    ok = all(r.ok for r in reports.values())
    if as_json:
        print(json.dumps({"ok": ok, "hosts": {h: r.to_dict() for h, r in reports.items()}}, indent=2))
    else:
        from specdeploy.checks.preflight import grouped
        from specdeploy.values.hostranges import compact
        # hosts with the same findings (a fleet's hosts mostly have them) are listed once, by name ranges
        for names, ok_, errors, lines in grouped(reports):
            who = safe(names[0]) if len(names) == 1 else f"{safe(compact(names))} ({len(names)} hosts)"
            print(f"== {who}: {'OK' if ok_ else f'{errors} error(s)'}")
            for line in lines:
                print("  " + line)
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

    from specdeploy.triage import read_log, triage_files, triage_lines

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
        for p in logfiles:
            try:
                with open(p, "rb"):
                    pass
            except OSError as exc:
                error(f"LOGFILE {p}", str(exc.strerror or exc), "make it readable or copy it somewhere readable")
    # files: each read as its head and tail, a log of any size in bounded time and memory
    res = triage_lines(lines, kernel) if journal else triage_files(logfiles, kernel)
    if as_json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        for k, v in res.to_dict().items():
            if k == "evidence":
                for e in v:
                    where = f"line {e['line']}" if e.get("line") else "kernel log"
                    print(f"{'evidence':11s} {where}: {safe(e['text'])}  ({safe(e['why'])})")
            elif v is not None and not (k == "next_step" and v in (res.fix or "")):
                print(f"{k:11s} {safe(v)}")
    raise typer.Exit(0 if res.root_cause or res.outcome == "clean-shutdown" else 1)

@app.command("breakeven")
def breakeven_cmd(acceptance_length: Optional[float] = typer.Option(None, "--acceptance-length",
                                                                   help="tokens accepted per step, >= 1"),
                  step_ratio: Optional[float] = typer.Option(None, "--step-ratio", help="T_spec / T_base"),
                  margin: Optional[float] = typer.Option(None, "--margin", help="default: the gate's"),
                  target: Optional[Path] = typer.Option(None, "--target", help="model directory (config.json): "
                                                        "predict the step ratio before any drafter exists"),
                  hardware: Optional[str] = typer.Option(None, "--hardware", help="hardware profile (default "
                                                         "h200_nvl8; with --measure, the host's)"),
                  batch: Optional[List[str]] = typer.Option(None, "--batch", help="batch sizes (1,8,32,64)"),
                  k: Optional[List[str]] = typer.Option(None, "--k", help="draft tokens (1,2,3,4)"),
                  routing_trace: Optional[Path] = typer.Option(None, "--routing-trace",
                                                               help="expert ids per token per layer (JSON lines)"),
                  locality: float = typer.Option(0.75, "--locality", help="fraction of the previous position's "
                                                 "experts a draft position keeps (local routing)"),
                  draft_cost: Optional[float] = typer.Option(None, "--draft-cost", help="one draft position's cost "
                                                             "as a fraction of a decode step (default: one dense "
                                                             "layer's weights over the bandwidth)"),
                  context: int = typer.Option(0, "--context", help="tokens of context each sequence's KV cache "
                                              "holds (0: weights only)"),
                  one_layer: bool = typer.Option(False, "--one-layer", help="one MoE layer at 16 bits, as "
                                                 "bench/verify_cost.py builds it"),
                  measure: bool = typer.Option(False, "--measure", help="measure the price on this host: start its "
                                               "engine with the synthetic rejection method (and --drafter), sweep "
                                               "AL, k and load, write the surface (docs/speculation.md)"),
                  inventory: Optional[str] = inventory_optional("With --measure: the inventory that holds --host."),
                  host: Optional[str] = typer.Option(None, "--host", help="with --measure: the engine host to "
                                                     "measure (this machine; its engine unit stopped)"),
                  acceptance_lengths: str = typer.Option("1.5,2,2.5,3", "--acceptance-lengths",
                                                         help="with --measure: the synthetic acceptance lengths"),
                  concurrency: str = typer.Option("1,8,32", "--concurrency", help="with --measure: load levels "
                                                  "(the gate's)"),
                  requests: Optional[int] = typer.Option(None, "--requests", min=1, help="with --measure: "
                                                         "requests per level (default 4 x c, >= 16)"),
                  max_tokens: int = typer.Option(128, "--max-tokens", min=1, help="with --measure: tokens each "
                                                 "request generates"),
                  drafter: Optional[List[str]] = typer.Option(None, "--drafter", help="with --measure: also measure "
                                                              "this drafter directory at each k ([AL@]DIR: AL is "
                                                              "the acceptance length it is expected to reach)"),
                  no_synthetic: bool = typer.Option(False, "--no-synthetic", help="with --measure: the given "
                                                    "drafters only"),
                  paired: bool = typer.Option(False, "--paired", help="with --measure: keep the baseline engine up "
                                              "(frozen while idle) and measure each round of a point right after a "
                                              "round of it; for hosts that hold two engines at once"),
                  work: Optional[Path] = typer.Option(None, "--work", help="with --measure: where the generated "
                                                      "head and the engine logs go (default: a new directory "
                                                      "beside --out)"),
                  out: Path = typer.Option(Path("surface"), "--out", help="with --measure: a new directory for "
                                           "surface.json and surface.png"),
                  as_json: bool = Json):
    """Predicted speedup of speculation and whether to keep it (--acceptance-length, --step-ratio); with --target,
    the step ratio verification costs and the acceptance length a drafter needs; with --measure -i INV --host H,
    the same measured by the host's own engine (the speedup surface and the AL each load band needs)."""
    from specdeploy.hostvars.argcheck import finite
    from specdeploy.speculation.gate import breakeven
    from specdeploy.speculation.verifycost import gate_margin
    margin = gate_margin() if margin is None else margin
    if measure:
        from specdeploy.cli.measure import measure as _measure
        _measure(inventory, host, k, acceptance_lengths, concurrency, requests, max_tokens, margin, drafter,
                 no_synthetic, target, hardware, work, out, as_json, paired)
        return
    hardware = hardware or "h200_nvl8"
    if target is not None:
        _verify_cost(target, hardware, batch, k, routing_trace, locality, draft_cost, context, one_layer, margin,
                     acceptance_length, as_json)
        return
    if acceptance_length is None or step_ratio is None:
        error("--acceptance-length" if acceptance_length is None else "--step-ratio", "missing",
              "give --acceptance-length and --step-ratio, or --target MODEL_DIR")
    try:
        finite(acceptance_length, "--acceptance-length", 1.0)
        finite(step_ratio, "--step-ratio", positive=True)
        finite(margin, "--margin", maximum=10.0)  # a fraction: 0.10 is 10%
        b = breakeven(acceptance_length, step_ratio, margin)
    except SpecdeployError as exc:
        fail(exc)
    except ValueError as exc:
        error("--acceptance-length" if "acceptance" in str(exc) else "--step-ratio", str(exc),
              "give --acceptance-length >= 1 and --step-ratio > 0")
    if as_json:
        print(json.dumps(b.to_dict(), indent=2))
    else:
        print(f"speedup {b.speedup:.2f}x (AL {b.acceptance_length:g} / step ratio {b.step_ratio:g}); "
              f"break-even AL {b.step_ratio:g}, with {b.margin:.0%} margin {b.breakeven_al:.2f}: {b.verdict}")


def _ints(values: Optional[List[str]], default: list[int], option: str) -> list[int]:
    out = []
    for v in values or []:
        for part in v.split(","):
            try:
                n = int(part)
                assert n >= 1
            except (ValueError, AssertionError):
                error(option, f"'{part}' is not a positive integer", f"give e.g. {option} 1,8,32")
            out.append(n)
    return out or default


def _verify_cost(target, hardware, batch, k, routing_trace, locality, draft_cost, context, one_layer, margin,
                 acceptance_length, as_json):
    import math

    from specdeploy.speculation.verifycost import load_target, load_trace, peaks, predict
    batches, ks = _ints(batch, [1, 8, 32, 64], "--batch"), _ints(k, [1, 2, 3, 4], "--k")
    for name, v, ok in (("--margin", margin, 0 <= margin <= 10), ("--context", context, context >= 0),
                        ("--draft-cost", draft_cost, draft_cost is None or draft_cost >= 0),
                        ("--acceptance-length", acceptance_length,
                         acceptance_length is None or acceptance_length >= 1)):
        if v is not None and (not math.isfinite(v) or not ok):
            error(name, f"{v!r} is out of range", f"give a number >= {1 if 'acceptance' in name else 0}")
    try:
        shape = load_target(target)
        if one_layer:
            if not shape.moe:
                error("--one-layer", f"{target} is a dense model", "leave --one-layer out")
            shape = shape.one_moe_layer()
            draft_cost = 0.0 if draft_cost is None else draft_cost  # a drafter against one layer means nothing
        hw = peaks(hardware, 1 if one_layer else None)
        trace = load_trace(routing_trace, shape.experts) if routing_trace else None
        if trace is not None and not shape.moe:
            error("--routing-trace", f"{target} is a dense model: it routes nothing", "leave --routing-trace out")
        rows = predict(shape, hw, batches, ks, locality, margin, draft_cost, context=context, trace=trace)
    except SpecdeployError as exc:
        fail(exc)
    drafter = (f"{draft_cost:g} of a decode step per draft position (--draft-cost)" if draft_cost is not None else
               "one draft position reads one dense layer's weights (attention + MLP, 16 bits)")
    if as_json:
        out = {"target": str(target), "shape": shape.describe(), "hardware": hardware, "margin": margin,
               "locality": locality, "context": context, "drafter": drafter,
               "trace": {"file": str(routing_trace), "locality": trace.locality()} if trace else None,
               "rows": [r.to_dict() for r in rows]}
        if acceptance_length is not None:
            for r, d in zip(rows, out["rows"]):
                d["speedup"] = [acceptance_length / r.needed_al[1], acceptance_length / r.needed_al[0]]
        print(json.dumps(out, indent=2))
        return
    print(f"target   {shape.describe()}")
    print(f"hardware {hw.name}: {hw.gpus} x {hw.bandwidth_gbs:g} GB/s, {hw.gpus} x {hw.tflops:g} TFLOPS dense BF16"
          + (f"; KV cache of {context} tokens per sequence" if context else "; weights only"))
    if shape.moe:
        print(f"routing  uniform (each token draws top-{shape.top_k} of {shape.experts}) to local (a draft position "
              f"keeps {locality:.0%} of the previous one's experts)"
              + (f"; trace {routing_trace}: locality {trace.locality():.2f}" if trace else ""))
    print(f"drafter  {drafter}; margin {margin:.0%}")
    head = f"{'batch':>5} {'k':>2} {'decode ms':>9}  {'verify/decode':>13}"
    head += f" {'trace':>6}" if trace else ""
    head += f" {'+draft':>6}  {'AL for 1.0x':>11}  {'AL for ' + format(1 + margin, '.2f') + 'x':>12}"
    head += f"  {'speedup at AL ' + format(acceptance_length, 'g'):>18}" if acceptance_length is not None else ""
    print(head)
    for r in rows:
        line = f"{r.batch:>5} {r.k:>2} {r.decode_ms:9.3f}  {r.ratio_local:5.2f} - {r.ratio_uniform:5.2f}"
        line += f" {r.ratio_trace:6.2f}" if trace else ""
        line += (f" {r.draft_ratio:+6.2f}  {r.needed_al[0]:4.2f} - {r.needed_al[1]:4.2f}"
                 f"  {r.needed_al_margin[0]:5.2f} - {r.needed_al_margin[1]:4.2f}")
        if acceptance_length is not None:
            line += f"  {acceptance_length / r.needed_al[1]:8.2f} - {acceptance_length / r.needed_al[0]:4.2f}x"
        if not r.reachable:
            line += f"  (above k+1 = {r.k + 1}: out of reach at uniform routing)"
        print(line)


GATE_CMD = "gate"


@app.command("gate")
def gate_cmd(url: str = typer.Option(..., "--url", help="the engine's base URL"),
             engine: str = typer.Option(DEFAULT_ENGINE, "--engine", help=ENGINE_HELP),
             prompts: Optional[Path] = typer.Option(None, "--prompts", help="chat prompts, one JSON per line "
                                                    "(default: the built-in set)"),
             concurrency: str = typer.Option("1,8,32", "--concurrency", help="load levels: concurrent requests, "
                                             "comma-separated"),
             requests: Optional[int] = typer.Option(None, "--requests", min=1, help="per level; default 4 x c, >= 16"),
             max_tokens: int = typer.Option(128, "--max-tokens", min=1, help="tokens each request generates"),
             baseline: Optional[Path] = typer.Option(None, "--baseline",
                                                     help="report of a run without speculation"),
             k: Optional[int] = typer.Option(None, "--k", min=1, help="draft tokens deployed (default: from metrics)"),
             margin: float = typer.Option(0.10, "--margin", help="the speedup speculation must beat 1.0 by "
                                          "(0.10: 10%)"),
             weights: Optional[str] = typer.Option(
                 None, "--weights", help="each level's share of the traffic, as --concurrency lists them "
                 "(e.g. 0.5,0.3,0.2); default equal"),
             target: Optional[Path] = typer.Option(
                 None, "--target", help="the target's config directory: each level gets the roofline's predicted "
                 "step-time ratio beside the measured one (see `specdeploy breakeven`)"),
             hardware: str = typer.Option("h200_nvl8", "--hardware", help="hardware profile, with --target"),
             api_key_file: Optional[Path] = typer.Option(None, "--api-key-file", help="a file holding the engine's API "
                                                         "key"),
             schedule: Optional[Path] = typer.Option(
                 None, "--schedule", help="a gate report whose verdict keeps bands of k per load: measure the engine "
                 "serving them (rendered) at each band's load and both sides of each threshold against --baseline, "
                 "and write the verdict after it (--concurrency is then the schedule's loads)"),
             surface: Optional[Path] = typer.Option(
                 None, "--surface", help="the price of speculation measured on this host (breakeven --measure's "
                 "surface.json): each level gets the AL its load band needs there beside the measured figures"),
             out: Path = typer.Option(Path("gate"), "--out", help="a new directory for report.json and its chart "
                                      "(only an earlier gate output is replaced)"),
             as_json: bool = Json):
    """Measure whether speculation pays under a bounded load of real chat prompts; write report + chart."""
    known_engine(engine)
    from specdeploy.plan.outdir import check_target
    try:  # before any measurement: what --out may be (plan.outdir)
        check_target(out, GATE_CMD)
    except SpecdeployError as exc:
        fail(exc)
    levels, shares = _gate_levels(concurrency, weights)
    price = None
    if surface is not None:
        from specdeploy.speculation.surface import load as load_surface
        try:
            price = load_surface(surface)
        except SpecdeployError as exc:
            fail(exc)
    try:
        url, base, key, roofline = _gate_inputs(url, margin, requests, max_tokens, k, baseline, api_key_file,
                                                prompts, target, hardware)
    except SpecdeployError as exc:
        fail(exc)
    if schedule is not None:
        report = _gate_schedule(schedule, url, engine, base, requests, max_tokens, prompts, key, shares, out)
    else:
        report = _gate_measure(url, engine, levels, requests, max_tokens, prompts, base, k, margin, key, shares, out)
    if roofline is not None:
        from specdeploy.speculation.verifycost import add_predictions
        try:
            add_predictions(report, *roofline)
        except SpecdeployError as exc:
            fail(exc)
    if price is not None:
        from specdeploy.speculation.surface import add_to_report
        add_to_report(report, price)
    _gate_write(report, out)
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _gate_print(report, out)
    if report.get("refused"):  # no verdict: whoever applies verdicts keeps the previous one
        print(f"gate refused to decide: {safe(report['refused'])}", file=sys.stderr)
        raise typer.Exit(1)


def _gate_levels(concurrency: str, weights: str | None) -> tuple[list[int], list[float] | None]:
    """The load levels of --concurrency and each one's share of the traffic (--weights)."""
    try:
        levels = [int(c) for c in concurrency.split(",")]
    except ValueError:
        levels = []
    if not levels or not all(c > 0 for c in levels):
        error("--concurrency", f"'{concurrency}' is not a list of positive numbers", "give a list like 1,8,32")
    if not weights:
        return levels, None
    from specdeploy.speculation.kbands import level_weights
    try:
        return levels, level_weights(levels, [float(w) for w in weights.split(",")])
    except ValueError:
        error("--weights", f"'{weights}' is not one share of the traffic per level of --concurrency "
              f"({concurrency})", f"give {len(levels)} numbers >= 0, not all 0, e.g. " + ",".join(["1"] * len(levels)))


def _gate_inputs(url, margin, requests, max_tokens, k, baseline, api_key_file, prompts, target, hardware):
    """(the checked URL, the baseline report, the API key, the roofline's target and peaks), each read within
    bounds; a SpecdeployError names the option that is wrong."""
    from specdeploy.hostvars.argcheck import finite, http_url, read_json_object, read_text
    from specdeploy.speculation.gate import check_baseline, load_prompts
    url = http_url(url, "--url")
    finite(margin, "--margin", maximum=10.0)  # a fraction: 0.10 is 10%
    for name, n in (("--requests", requests), ("--max-tokens", max_tokens), ("--k", k)):
        if n is not None and n < 1:
            raise SpecdeployError([Finding("error", name, f"{n} is not a positive count",
                                           "give a count of at least 1")])
    base = read_json_object(baseline, "--baseline", "a report.json written by `specdeploy gate`") \
        if baseline else None
    key = read_text(api_key_file, "--api-key-file", "a file holding the API key").strip() if api_key_file else None
    if api_key_file and not key:  # an empty key would silently send no authentication at all
        raise SpecdeployError([Finding("error", "--api-key-file", f"{api_key_file} is empty",
                                       "put the engine's API key in it, or leave --api-key-file out when "
                                       "the engine needs none")])
    if key and any(c in key for c in "\r\n\0"):
        raise SpecdeployError([Finding("error", "--api-key-file", f"{api_key_file} holds more than one line",
                                       "keep only the API key in it, on one line")])
    if base is not None:
        check_baseline(base, baseline)
    load_prompts(prompts)
    roofline = None
    if target is not None:
        from specdeploy.speculation.verifycost import load_target, peaks
        roofline = (load_target(target), peaks(hardware))
    return url, base, key, roofline


def _gate_measure(url, engine, levels, requests, max_tokens, prompts, base, k, margin, key, shares, out) -> dict:
    """The gate's measurement, with a progress bar; Ctrl-C stops it having written nothing."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from specdeploy.speculation.gate import gate
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as prog:
        task = prog.add_task("gate", total=len(levels))

        def cb(c, n):
            prog.update(task, description=f"gate: concurrency {c}, {n} requests", completed=levels.index(c))
        try:
            report = gate(url, engine, levels, requests, max_tokens, prompts, base, k, margin, key, cb, shares)
        except OSError as exc:
            error("--url", f"cannot use {safe(url)}: {safe(exc)}", "check the engine is up and is the --engine given")
        except SpecdeployError as exc:
            fail(exc)
        except KeyboardInterrupt:
            prog.stop()
            error("gate", f"interrupted: nothing was written to {safe(out)}", "run it again to measure", 130)
        prog.update(task, completed=len(levels))
    return report


def _gate_schedule(path, url, engine, base, requests, max_tokens, prompts, key, shares, out) -> dict:
    """``gate --schedule``: the kept bands measured as rendered (speculation/schedule.py)."""
    from specdeploy.hostvars.argcheck import read_json_object
    from specdeploy.speculation.schedule import report
    if base is None:
        error("--baseline", "missing", "give the baseline report (speculation off) measured at the schedule's loads")
    try:
        kept = read_json_object(path, "--schedule", "a report.json written by `specdeploy gate`")
        return report(kept, url, engine, base, requests, max_tokens, prompts, key, shares)
    except SpecdeployError as exc:
        fail(exc)
    except OSError as exc:
        error("--url", f"cannot use {safe(url)}: {safe(exc)}", "check the engine is up and serves the schedule")
    except KeyboardInterrupt:
        error("gate", f"interrupted: nothing was written to {safe(out)}", "run it again to measure", 130)


def _gate_write(report: dict, out: Path) -> None:
    """report.json and its chart, written beside --out and renamed in (plan.outdir)."""
    from specdeploy.plan.outdir import atomic_output_dir
    from specdeploy.speculation.gate import chart
    try:
        with atomic_output_dir(out, GATE_CMD) as tmp:
            (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
            chart(report, tmp / "report.png")
    except SpecdeployError as exc:
        fail(exc)
    except OSError as exc:
        error("--out", f"cannot write {safe(out)} ({exc.strerror or exc})", "give a writable directory")
    except KeyboardInterrupt:
        error("gate", f"interrupted: {safe(out)} was left as it was", "run it again to measure", 130)


def _gate_print(report: dict, out: Path) -> None:
    for lv in report["levels"]:
        al = lv.get("acceptance_length")
        sp = lv.get("speedup")
        print(f"c={lv['concurrency']:<4} failed {lv.get('errors', 0)}/{lv.get('requests')}  "
              f"tok/s {lv['output_tps']:8.1f}  AL {al and round(al, 2)}  "
              f"accept {lv.get('acceptance_rate') and round(lv['acceptance_rate'], 2)}  "
              f"speedup {sp and round(sp, 2)}  "
              f"break-even AL {lv.get('breakeven_al') and round(lv['breakeven_al'], 2)}"
              + (f"  step ratio {lv['step_ratio']:.2f} (roofline {lv['predicted_step_ratio'][0]:.2f}-"
                 f"{lv['predicted_step_ratio'][1]:.2f})" if lv.get("predicted_step_ratio")
                 and lv.get("step_ratio") else "")
              + (f"  needs AL {lv['surface_needed_al'][0]:.2f} (measured price)"
                 if (lv.get("surface_needed_al") or [None])[0] is not None else ""))
    for b in report.get("k_by_batch") or []:
        print(f"band from {b['from_batch']:<4} running requests (c={b['concurrency']}): k={b['k']}  "
              f"predicted {b['predicted_speedup']:.2f}x")
    for r in (report.get("schedule_check") or {}).get("rows", []):
        sp, iv = r["speedup"], r["interval"]
        print(f"as rendered at {r['load']:<4} running requests ({r['role']}, k={r['k']}): "
              + (f"{sp:.2f}x" if sp is not None else "-") + (f" (95% {iv[0]:.2f}-{iv[1]:.2f})" if iv else "")
              + f" against speculation off: {r['outcome']}")
    for r in (report.get("schedule_check") or {}).get("replaced", []):
        print(f"band from {r['from_batch']}: k={r['k_was']} -> k={r['k_now']}: {safe(r['why'])}")
    one = report.get("single_k")
    if one and len(report.get("k_by_batch") or []) > 1:
        print(f"one k for every load: k={one['k']} at {one['weighted_speedup']:.2f}x traffic-weighted"
              + "".join(f"; c={x['concurrency']} loses ({x['speedup_at_single_k']:.2f}x against "
                        f"{x['own_speedup']:.2f}x at k={x['k']})" for x in one["loses"]))
    k_rec = ("k=" + str(report["recommended_k"])) if report.get("recommended_k") else ""
    print(f"verdict: {report.get('verdict')} {k_rec} - {safe(report.get('reason'))}")
    print(f"wrote {safe(out / 'report.json')} and {safe(out / 'report.png')}")
