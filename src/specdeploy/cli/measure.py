"""``specdeploy breakeven --measure``'s steps (the options are the ``breakeven`` command's, in cli/ops.py): the
inputs checked, the measurement run on this host (ops/measure.py), the surface written beside --out and renamed
in, and what it says."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer

from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.options import error, fail
from specdeploy.values.terminal import safe


MEASURE_CMD = "breakeven --measure"


def _floats(text: str, option: str, minimum: float) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or not all(math.isfinite(x) and x >= minimum for x in out):
        error(option, f"'{text}' is not a list of numbers >= {minimum:g}", f"give e.g. {option} 1.5,2,2.5,3")
    return sorted(set(out))


def _positive_ints(text: str, option: str, example: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or not all(x > 0 for x in out):
        error(option, f"'{text}' is not a list of positive integers", f"give e.g. {option} {example}")
    return sorted(set(out))


def _drafters(items: list[str] | None) -> list[tuple[str, str, float | None]]:
    out = []
    for item in items or []:
        head, sep, rest = item.partition("@")
        al = None
        if sep:
            try:
                al = float(head)
            except ValueError:
                rest = item
        path = Path(rest if sep and al is not None else item)
        if al is not None and not (math.isfinite(al) and al >= 1):
            error("--drafter", f"'{item}': {head} is not an acceptance length >= 1", "give [AL@]DIR, e.g. 1.8@/d")
        if not (path / "config.json").is_file():
            error("--drafter", f"no config.json in {path}", "give a drafter directory ([AL@]DIR)")
        out.append((path.name, str(path.resolve()), al))
    return out


def measure(inventory, host, k, acceptance_lengths, concurrency, requests, max_tokens, margin, drafter,
            no_synthetic, target, hardware, work, out, as_json, paired=False):
    """``breakeven --measure``: inputs, the measurement, the surface written, what it says."""
    from specdeploy.plan.outdir import check_target
    runner, plan, target_dir = _measure_inputs(inventory, host, k, acceptance_lengths, concurrency, requests,
                                               max_tokens, margin, drafter, no_synthetic, target, hardware, work,
                                               out)
    plan.paired = paired
    try:
        check_target(out, MEASURE_CMD)
    except SpecdeployError as exc:
        fail(exc)
    from specdeploy.ops.measure import run

    def say(m: str):
        print(f"[measure] {safe(m)}", file=sys.stderr, flush=True)
    try:
        surface = run(runner, plan, target_dir, say)
    except SpecdeployError as exc:
        fail(exc)
    except KeyboardInterrupt:
        error(MEASURE_CMD, f"interrupted: nothing was written to {safe(out)}", "run it again to measure", 130)
    surface["host"] = host
    _measure_write(surface, out)
    if as_json:
        print(json.dumps(surface, indent=2))
    else:
        _measure_print(surface, out)
    if not any(p.get("speedup") is not None for p in surface["points"]):
        raise typer.Exit(1)


def _measure_inputs(inventory, host, k, acceptance_lengths, concurrency, requests, max_tokens, margin, drafter,
                    no_synthetic, target, hardware, work, out):
    from specdeploy.hostvars import inventory as inv_mod
    from specdeploy.ops.measure import Runner
    from specdeploy.speculation.measure import Plan
    if not inventory or not host:
        error("--inventory" if not inventory else "--host", "missing", "give -i INVENTORY --host HOST with --measure")
    if not (math.isfinite(margin) and 0 <= margin <= 10):
        error("--margin", f"{margin!r} is out of range", "give a fraction from 0 to 10 (0.10 is 10%)")
    levels = _positive_ints(concurrency, "--concurrency", "1,8,32")
    als = _floats(acceptance_lengths, "--acceptance-lengths", 1.0)
    drafters = _drafters(drafter)
    if no_synthetic and not drafters:
        error("--no-synthetic", "nothing left to measure", "give --drafter DIR, or leave --no-synthetic out")
    try:
        h = inv_mod.load(inventory, host).host(host)
        hv = h.hv
        work = work or out.parent / f".{out.name}.work"
        runner = Runner(host, h.vars, work)
        target_dir = target or Path(hv.specdeploy_model_path)
        roofline = None
        profile = hardware or hv.specdeploy_hardware
        if (target_dir / "config.json").is_file() and profile != "custom":
            from specdeploy.speculation.verifycost import load_target, peaks
            roofline = (load_target(target_dir), peaks(profile))
    except SpecdeployError as exc:
        fail(exc)
    ks = _positive_ints(",".join(k or []) or "1,2,3,4", "--k", "1,2,3")
    plan = Plan(hv.specdeploy_engine, hv.specdeploy_engine_version, ks, als, levels, requests, max_tokens, margin,
                synthetic=not no_synthetic, drafters=drafters, roofline=roofline)
    return runner, plan, target_dir


def _measure_write(surface: dict, out: Path) -> None:
    from specdeploy.plan.outdir import atomic_output_dir
    from specdeploy.speculation.surface import FILE, chart
    try:
        with atomic_output_dir(out, MEASURE_CMD) as tmp:
            (tmp / FILE).write_text(json.dumps(surface, indent=2) + "\n")
            chart(surface, tmp / "surface.png")
    except SpecdeployError as exc:
        fail(exc)
    except OSError as exc:
        error("--out", f"cannot write {safe(out)} ({exc.strerror or exc})", "give a writable directory")


def _measure_print(s: dict, out: Path) -> None:
    from specdeploy.speculation.surface import summary
    r = s.get("refused")
    if r:
        print(f"synthetic method: refused. {safe(r['reason'])}")
        print(f"fallback: {safe(r['fallback'])}")
        for row in s.get("roofline_needed") or []:
            print(f"  roofline k={row['k']} c={row['concurrency']}: AL for 1.0x {row['breakeven'][0]:.2f}-"
                  f"{row['breakeven'][1]:.2f}, for {1 + s['margin']:.2f}x {row['keep'][0]:.2f}-{row['keep'][1]:.2f}")
    for f in s.get("failures") or []:
        print(f"failed: {safe(f['label'])}: {safe(f['failure'])}")
    for p in s["points"]:
        what = p.get("drafter") or f"synthetic AL {p['al_requested']:g}"
        sp, iv = p.get("speedup"), p.get("speedup_interval")
        print(f"{safe(what):<24} k={p['k']} c={p['concurrency']:<4} AL {p['al_measured'] or 0:.2f}  "
              f"tok/s {p['output_tps']:8.1f}  speedup " + (f"{sp:.2f}" if sp is not None else "-")
              + (f" ({iv[0]:.2f}-{iv[1]:.2f})" if iv else ""))
    for k in sorted({int(p["k"]) for p in s["points"] if p.get("speedup") is not None}):
        print(f"AL needed for {1 + s['margin']:.2f}x at k={k}:")
        for line in summary(s, k):
            print("  " + safe(line))
    print(f"wrote {safe(out / 'surface.json')} and {safe(out / 'surface.png')}")
