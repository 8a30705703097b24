"""``specdeploy nccl ...`` commands."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

nccl_app = typer.Typer(no_args_is_help=True, help="Measure and choose the NCCL environment.")


def _die(msg: str):
    print(f"ERROR {msg}", file=sys.stderr)
    raise typer.Exit(2)


def _hidden_from_config(path: Path) -> int:
    cfg = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    return int(cfg.get("text_config", cfg)["hidden_size"])


@nccl_app.command("tune")
def tune_cmd(gpus: int = typer.Option(2, "--gpus"), hidden: Optional[int] = typer.Option(None, "--hidden"),
             model: Optional[Path] = typer.Option(None, "--model", help="Model dir; hidden size from config.json."),
             candidates: Optional[Path] = typer.Option(None, "--candidates", help="YAML/JSON: name -> env."),
             only: Optional[str] = typer.Option(None, "--only", help="Comma list of candidate names to run."),
             base_env: Optional[List[str]] = typer.Option(None, "--base-env", help="K=V added to every run."),
             pcie: bool = typer.Option(False, "--pcie", help="Add the P2P-level candidates."),
             modes: str = typer.Option("eager,graph", "--modes"), iters: int = typer.Option(50, "--iters"),
             timeout: float = typer.Option(180, "--timeout"),
             out: Path = typer.Option(Path("nccl-results.json"), "--out")):
    """Measure bf16 all-reduce of (tokens x hidden) for each candidate environment, in fresh processes."""
    import yaml
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from . import nccl as n
    from .nccl.tune import tune

    if hidden is None:
        hidden = _hidden_from_config(model) if model else 7168
    cands = n.default_candidates(pcie=pcie)
    if candidates:
        if not candidates.is_file():
            _die(f"--candidates: {candidates} does not exist")
        loaded = yaml.safe_load(candidates.read_text())
        if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
            _die(f"--candidates: {candidates} must map names to environment mappings")
        cands = {"default": {}, **{k: {kk: str(vv) for kk, vv in v.items()} for k, v in loaded.items()}}
    if only:
        names = only.split(",")
        unknown = [x for x in names if x not in cands]
        if unknown:
            _die(f"--only: unknown candidates {unknown}; known: {', '.join(cands)}")
        cands = {k: v for k, v in cands.items() if k in names}
    base = dict(kv.split("=", 1) for kv in base_env or [])
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=False) as prog:
        task = prog.add_task("NCCL sweep", total=len(cands))

        def cb(name, status):
            if status == "start":
                prog.update(task, description=f"NCCL sweep: {name}")
            else:
                prog.advance(task)
                prog.console.print(f"  {name}: {status}")
        res = tune(cands, gpus, hidden, out, modes=tuple(modes.split(",")), iters=iters, timeout=timeout,
                   base_env=base, progress=cb)
    print(f"wrote {out} ({sum(c['status'] == 'ok' for c in res['candidates'])}/{len(res['candidates'])} ok)")


@nccl_app.command("choose")
def choose_cmd(results: Path = typer.Argument(...), mode: str = typer.Option("graph", "--mode"),
               batch_mix: Optional[str] = typer.Option(None, "--batch-mix", help="TOKENS:WEIGHT,..."),
               prefill_tolerance: float = typer.Option(0.03, "--prefill-tolerance"),
               tuner_csv: Optional[Path] = typer.Option(None, "--tuner-csv"),
               write_host_vars: Optional[Path] = typer.Option(None, "--write-host-vars",
                                                              help="host_vars/HOST.yml to update"),
               chart: Optional[Path] = typer.Option(None, "--chart"),
               as_json: bool = typer.Option(False, "--json")):
    """Pick the environment with the lowest traffic-weighted decode latency that keeps prefill sizes fast."""
    import yaml
    from rich.console import Console
    from rich.table import Table

    from .nccl.choose import ChooseError, choose, explain

    if not results.is_file():
        _die(f"{results} does not exist")
    try:
        data = json.loads(results.read_text())
        ch = choose(data, mode, batch_mix, prefill_tolerance)
    except (ChooseError, json.JSONDecodeError, KeyError) as exc:
        _die(f"{results}: {exc}")
    if tuner_csv:
        tuner_csv.write_text("# colltype,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,"
                             "numPipeOps,regBuff\n" + "\n".join(ch.tuner_rows) + "\n")
    if write_host_vars:
        cur = yaml.safe_load(write_host_vars.read_text()) if write_host_vars.exists() else {}
        cur = cur or {}
        cur["specdeploy_nccl_env"] = ch.env
        write_host_vars.parent.mkdir(parents=True, exist_ok=True)
        write_host_vars.write_text("---\n# specdeploy_nccl_env written by `specdeploy nccl choose`\n"
                                   + yaml.safe_dump(cur, sort_keys=True))
    if chart:
        from .nccl.chart import sweep_chart
        sweep_chart([data], chart, mode, ch.chosen)
    if as_json:
        print(json.dumps(ch.to_dict(), indent=2))
        return
    t = Table(title=f"NCCL choice ({mode}, {data.get('gpus')} GPUs)")
    for col in ("candidate", "weighted decode us", "vs default", "worst prefill vs default", "verdict"):
        t.add_column(col)
    for row in explain(ch, data):
        t.add_row(*row)
    c = Console()
    c.print(t)
    c.print(f"chosen: {ch.chosen} -> {ch.env or '(NCCL defaults)'}")
    c.print(f"per-size best would give {ch.per_size_weighted_us:.1f} us weighted "
            f"({ch.weighted_us[ch.chosen] / ch.per_size_weighted_us:.2f}x better than the chosen global env)")


@nccl_app.command("topo")
def topo_cmd(matrix: Path = typer.Option(None, "--matrix", help="Saved `nvidia-smi topo -m` output"),
             lspci: Optional[Path] = typer.Option(None, "--lspci", help="Saved `lspci -vvv` output"),
             cmdline: Optional[Path] = typer.Option(None, "--cmdline")):
    """Explain when P2P can or cannot be used on this host (reads live tools when no file is given)."""
    import subprocess
    from .nccl.topo import explain, iommu_mode, parse_acs, parse_topo_matrix

    def read(path, cmd):
        if path:
            return path.read_text()
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    text = read(matrix, ["nvidia-smi", "topo", "-m"])
    if not text.strip():
        _die("no `nvidia-smi topo -m` output (no GPU here?); give --matrix FILE")
    try:
        topo = parse_topo_matrix(text)
    except ValueError as exc:
        _die(str(exc))
    acs = parse_acs(read(lspci, ["lspci", "-vvv"]))
    cl = read(cmdline, ["cat", "/proc/cmdline"])
    for note in explain(topo, acs, iommu_mode(cl)):
        print("-", note)
