"""``specdeploy nccl ...`` commands."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from specdeploy.cli.options import (ENGINE_VERSION_HELP, Json, VaultIds, VaultPasswordFiles, error, fail, finite,
                                    inventory_optional, vault)
from specdeploy.values.terminal import safe

nccl_app = typer.Typer(no_args_is_help=True, help="Measure and choose the NCCL environment.")


def _hidden_from_config(path: Path) -> int:
    from specdeploy.hostvars.argcheck import read_json_object
    from specdeploy.values.errors import SpecdeployError
    try:
        cfg = read_json_object(path / "config.json" if path.is_dir() else path, "--model",
                               "a model directory with a config.json")
        hidden = cfg.get("text_config", cfg)["hidden_size"]
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(hidden)
        return hidden
    except SpecdeployError as exc:
        fail(exc)
    except (KeyError, TypeError, ValueError, AttributeError):
        error("--model", f"{path} has no integer hidden_size (nor text_config.hidden_size)",
              "give the model directory, or --hidden N")


@nccl_app.command("tune")
def tune_cmd(gpus: int = typer.Option(2, "--gpus", min=1, help="GPUs (ranks) of the all-reduce"),
             hidden: Optional[int] = typer.Option(None, "--hidden", min=1, help="the model's hidden size (default: "
                                                 "from --model)"),
             model: Optional[Path] = typer.Option(None, "--model", help="Model dir; hidden size from config.json."),
             candidates: Optional[Path] = typer.Option(None, "--candidates", help="YAML/JSON: name -> env."),
             only: Optional[str] = typer.Option(None, "--only", help="Comma list of candidate names to run."),
             base_env: Optional[List[str]] = typer.Option(None, "--base-env", help="K=V added to every run."),
             pcie: bool = typer.Option(False, "--pcie", help="Add the P2P-level candidates."),
             modes: str = typer.Option("eager,graph", "--modes", help="eager, graph or both: CUDA-graph capture as "
                                       "the engine decodes"),
             iters: int = typer.Option(50, "--iters", min=1, help="timed all-reduces per size"),
             timeout: float = typer.Option(180, "--timeout", help="seconds one candidate may run before it is killed"),
             rounds: int = typer.Option(1, "--rounds", min=1,
                                        help="Rounds; each runs every candidate in a freshly shuffled order."),
             seed: Optional[int] = typer.Option(None, "--seed", help="Shuffle seed (recorded in the results)."),
             aa: bool = typer.Option(True, "--aa/--no-aa", help="Run the default twice per round (A/A control)."),
             out: Path = typer.Option(Path("nccl-results.json"), "--out", help="the results JSON (only an earlier "
                                      "results file is replaced)")):
    """Measure bf16 all-reduce of (tokens x hidden) for each candidate environment, in fresh processes,
    interleaved over --rounds rounds with the default as control in every round."""
    import yaml
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from specdeploy import nccl as n
    from specdeploy.nccl.tune import tune

    from specdeploy.hostvars.argcheck import read_text
    from specdeploy.values.errors import SpecdeployError
    finite(timeout, "--timeout", 0, above=True)
    mode_list = modes.split(",")
    if not all(m in ("eager", "graph") for m in mode_list):
        error("--modes", f"'{modes}' is not a list of eager and graph", "give eager, graph or eager,graph")
    from specdeploy.nccl.tune import TUNE_CMD
    from specdeploy.values.outputs import check_file, json_marked
    try:  # before any run: what --out may be (values.outputs)
        check_file(out, "--out", TUNE_CMD, json_marked(TUNE_CMD), "a new JSON file path for the results")
    except SpecdeployError as exc:
        fail(exc)
    if hidden is None:
        hidden = _hidden_from_config(model) if model else 7168
    cands = n.default_candidates(pcie=pcie)
    if candidates:
        from specdeploy.values.bounded import yaml_depth
        try:
            text = read_text(candidates, "--candidates", "a YAML/JSON file: name -> env")
            deep = yaml_depth(text)
            if deep:
                error("--candidates", f"{safe(candidates)} {deep}", "give a YAML/JSON file: name -> env")
            loaded = yaml.safe_load(text)
        except SpecdeployError as exc:
            fail(exc)
        except yaml.YAMLError as exc:
            error("--candidates", f"{candidates} is not YAML/JSON ({str(exc).splitlines()[0]})",
                  "give a YAML/JSON file: name -> env")
        if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
            error("--candidates", f"{candidates} must map names to environment mappings",
                  "give a YAML/JSON file: name -> env")
        if not loaded:
            error("--candidates", f"{candidates} names no candidates", "give a YAML/JSON file: name -> env")
        cands = {"default": {}, **{k: {kk: str(vv) for kk, vv in v.items()} for k, v in loaded.items()}}
    if only:
        names = only.split(",")
        unknown = [x for x in names if x not in cands]
        if unknown:
            error("--only", f"unknown candidates {unknown}", f"use some of {', '.join(cands)}")
        cands = {k: v for k, v in cands.items() if k in names}
    bad = [kv for kv in base_env or [] if not kv.partition("=")[0].strip() or "=" not in kv]
    if bad:
        error("--base-env", f"{bad[0]!r} is not KEY=VALUE", "give KEY=VALUE")
    base = dict(kv.split("=", 1) for kv in base_env or [])
    runs_per_round = len({"default", *cands}) + (1 if aa else 0)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=False) as prog:
        task = prog.add_task("NCCL sweep", total=runs_per_round * rounds)

        def cb(name, status, rnd):
            if status == "start":
                prog.update(task, description=f"NCCL sweep, round {rnd + 1}/{rounds}: {name}")
            else:
                prog.advance(task)
                prog.console.print(f"  round {rnd + 1} {name}: {status}")
        try:
            res = tune(cands, gpus, hidden, out, modes=tuple(mode_list), iters=iters, timeout=timeout,
                       base_env=base, progress=cb, rounds=rounds, seed=seed, aa=aa)
        except SpecdeployError as exc:
            fail(exc)
        except OSError as exc:
            error("--out", f"cannot write {safe(out)} ({exc.strerror or exc})", "give a writable results path")
    runs = [c for r in res["rounds"] for c in r["candidates"]]
    ok = sum(c['status'] == 'ok' for c in runs)
    print(f"wrote {safe(out)} ({len(res['rounds'])} round(s), {ok}/{len(runs)} runs ok, seed {res['seed']})")
    if not ok:
        statuses = sorted({c["status"] for c in runs})
        error("nccl tune", f"no run succeeded ({', '.join(statuses)}); {out} holds their log tails",
              "read the log tails in the results file (torch with CUDA and NCCL, GPUs visible, --gpus)", 1)


@nccl_app.command("choose")
def choose_cmd(results: List[Path] = typer.Argument(..., help="One or more `nccl tune` results files (pooled)."),
               mode: str = typer.Option("graph", "--mode", help="compare eager or graph latencies"),
               batch_mix: Optional[str] = typer.Option(None, "--batch-mix", help="TOKENS:WEIGHT,..."),
               prefill_tolerance: float = typer.Option(0.03, "--prefill-tolerance", help="how much slower a prefill "
                                                       "size may get (0.03: 3%)"),
               min_gain: float = typer.Option(0.03, "--min-gain", help="Smallest weighted decode gain to act on."),
               min_rounds: int = typer.Option(3, "--min-rounds", min=1, help="interleaved rounds needed to tell a "
                                               "gain from noise"),
               engine: Optional[str] = typer.Option(None, "--engine", help="vllm or sglang: weight only what "
                                                    "that engine sends to NCCL."),
               engine_version: Optional[str] = typer.Option(None, "--engine-version", help=ENGINE_VERSION_HELP),
               hardware: Optional[str] = typer.Option(None, "--hardware", help="Hardware profile name."),
               custom_all_reduce: Optional[bool] = typer.Option(
                   None, "--custom-all-reduce/--no-custom-all-reduce", help="Default: the profile's."),
               inventory: Optional[str] = inventory_optional("Take engine, version, profile from this inventory."),
               host: Optional[str] = typer.Option(None, "--host", help="Host in --inventory."),
               tuner_csv: Optional[Path] = typer.Option(None, "--tuner-csv", help="write the per-size choice as an "
                                                        "NCCL tuner plugin CSV"),
               write_host_vars: Optional[Path] = typer.Option(None, "--write-host-vars",
                                                              help="host_vars/HOST.yml to update"),
               chart: Optional[Path] = typer.Option(None, "--chart", help="write a PNG of the candidates' ratios"),
               as_json: bool = Json, vault_id: Optional[List[str]] = VaultIds,
               vault_password_file: Optional[List[str]] = VaultPasswordFiles):
    """Keep NCCL's default unless a candidate beats it consistently, beyond noise, on the traffic NCCL carries."""
    from specdeploy.nccl.choose import ChooseError, choose
    from specdeploy.nccl.traffic import TrafficError, traffic, traffic_for_host

    from specdeploy.hostvars.argcheck import read_json
    from specdeploy.values.errors import SpecdeployError
    if mode not in ("eager", "graph"):
        error("--mode", f"unknown mode '{mode}'", "use eager or graph")
    finite(prefill_tolerance, "--prefill-tolerance", 0)
    finite(min_gain, "--min-gain", 0)
    try:  # before any work: what each output may be (values.outputs)
        _check_outputs(tuner_csv, write_host_vars, chart)
    except SpecdeployError as exc:
        fail(exc)
    items = []
    try:
        for path in results:
            items.append((str(path), read_json(path, "RESULTS", "`nccl tune` results files")))
    except SpecdeployError as exc:
        fail(exc)
    gpus = items[0][1].get("gpus") if isinstance(items[0][1], dict) else None
    tr = None
    try:
        if inventory or host:
            if not (inventory and host):
                error("-i/--host", "-i/--inventory and --host go together", "give both, or neither")
            from specdeploy.hostvars.inventory import load
            try:
                hv = load(inventory, limit=host, vault=vault(vault_id, vault_password_file)).host(host).hv
            except SpecdeployError as exc:
                fail(exc)
            tr = traffic_for_host(hv, gpus)
        elif engine or engine_version or hardware:
            if not (engine and engine_version and hardware):
                error("--engine/--engine-version/--hardware", "--engine, --engine-version and --hardware go together",
                      "give all three, or none")
            tr = traffic(engine, engine_version, hardware, gpus or 0, custom_all_reduce)
        ch = choose(items, mode, batch_mix, prefill_tolerance, min_gain=min_gain, min_rounds=min_rounds, traffic=tr)
    except (ChooseError, TrafficError) as exc:
        error("nccl choose", str(exc))
    except (KeyError, TypeError, ValueError) as exc:
        error(', '.join(str(p) for p in results), f"malformed results ({type(exc).__name__}: {exc})",
              "give `nccl tune` results files")
    try:
        _write_outputs(ch, items, tuner_csv, write_host_vars, chart)
    except SpecdeployError as exc:
        fail(exc)
    except OSError as exc:
        error(f"nccl choose {getattr(exc, 'filename', '') or ''}".strip(), f"cannot write it ({exc.strerror or exc})",
              "give writable paths for --tuner-csv, --write-host-vars and --chart")
    if as_json:
        print(json.dumps(ch.to_dict(), indent=2))
        return
    _print_choice(ch, items, mode)


CHOOSE_CMD = "nccl choose"


def _check_outputs(tuner_csv, write_host_vars, chart):
    from specdeploy.values.outputs import check_file, check_png, text_marked
    if tuner_csv is not None:
        check_file(tuner_csv, "--tuner-csv", CHOOSE_CMD, text_marked(CHOOSE_CMD), "a new CSV file path")
    if chart is not None:
        check_png(chart, "--chart", CHOOSE_CMD)
    if write_host_vars is not None:  # the one output that edits a file of the user's: any regular file
        check_file(write_host_vars, "--write-host-vars", CHOOSE_CMD, lambda p: True, "a host_vars YAML file")


def _write_outputs(ch, items, tuner_csv, write_host_vars, chart):
    from specdeploy.hostvars.argcheck import read_text
    from specdeploy.hostvars.varsfile import set_variable
    from specdeploy.nccl.choose import evidence_lines
    from specdeploy.values.outputs import TEXT_MARK, text_marked, write_file
    from specdeploy.values.terminal import safe
    if tuner_csv:
        write_file(tuner_csv, TEXT_MARK.format(command=CHOOSE_CMD) + "\n"
                   "# colltype,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n"
                   + "\n".join(ch.tuner_rows) + "\n", "--tuner-csv", CHOOSE_CMD, text_marked(CHOOSE_CMD),
                   "a new CSV file path")
    if write_host_vars:
        where = f"--write-host-vars {safe(write_host_vars)}"
        cur = read_text(write_host_vars, "--write-host-vars", "a host_vars YAML file") \
            if write_host_vars.exists() else ""
        comments = [f"nccl choose: {safe(line)}" for line in
                    ["specdeploy_nccl_env written by `specdeploy nccl choose`", *evidence_lines(ch)]]
        new = set_variable(cur, "specdeploy_nccl_env", ch.env, comments, where)
        write_file(write_host_vars, new, "--write-host-vars", CHOOSE_CMD, lambda p: True, "a host_vars YAML file")
    if chart:
        from specdeploy.nccl.chart import choice_chart
        choice_chart(items, ch, chart)


def _print_choice(ch, items, mode):
    from rich.console import Console
    from rich.table import Table

    from specdeploy.nccl.choose import evidence_lines, explain
    t = Table(title=f"NCCL choice ({mode}, {ch.gpus} GPUs, {ch.rounds} round(s) from {len(items)} file(s))")
    for col in ("candidate", "weighted decode us", "vs default [95% CI]", "faster rounds",
                "worst prefill vs default", "verdict"):
        t.add_column(col)
    from rich.text import Text
    for row in explain(ch):  # candidate names come from the results files: shown escaped (values.terminal)
        t.add_row(*[Text(safe(cell)) for cell in row])
    c = Console(width=max(Console().width, 150))
    c.print(t)
    for line in evidence_lines(ch):
        c.print(safe(line), markup=False, highlight=False)
    if ch.per_size_weighted_us:
        w = ch.weighted_us.get(ch.chosen)
        c.print(f"per-size best would give {ch.per_size_weighted_us:.1f} us weighted"
                + (f" ({w / ch.per_size_weighted_us:.2f}x better than the chosen global env)" if w else ""))


@nccl_app.command("topo")
def topo_cmd(matrix: Path = typer.Option(None, "--matrix", help="Saved `nvidia-smi topo -m` output"),
             lspci: Optional[Path] = typer.Option(None, "--lspci", help="Saved `lspci -vvv` output"),
             cmdline: Optional[Path] = typer.Option(None, "--cmdline", help="a saved /proc/cmdline (default: this "
                                                  "machine's)")):
    """Explain when P2P can or cannot be used on this host (reads live tools when no file is given)."""
    import subprocess
    from specdeploy.nccl.pcie import explain, iommu_mode, parse_acs, parse_topo_matrix

    def read(path, cmd, option):
        if path:
            from specdeploy.hostvars.argcheck import read_text
            from specdeploy.values.errors import SpecdeployError
            try:
                return read_text(path, option, f"the saved output of `{' '.join(cmd)}`")
            except SpecdeployError as exc:
                fail(exc)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    text = read(matrix, ["nvidia-smi", "topo", "-m"], "--matrix")
    if not text.strip():
        error("--matrix", "no `nvidia-smi topo -m` output (no GPU here?)", "give --matrix FILE")
    try:
        topo = parse_topo_matrix(text)
    except ValueError as exc:
        error(f"--matrix {matrix}" if matrix else "nvidia-smi topo -m", str(exc),
              "give the saved output of `nvidia-smi topo -m`")
    acs = parse_acs(read(lspci, ["lspci", "-vvv"], "--lspci"))
    cl = read(cmdline, ["cat", "/proc/cmdline"], "--cmdline")
    for note in explain(topo, acs, iommu_mode(cl)):
        print("-", safe(note))
