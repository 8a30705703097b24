"""The engine probe, controller side: run the adapter's probe script with the engine's own Python (a venv, the
image's interpreter), bounded in time and output, and turn the JSON it prints into findings.

The script (``adapter.probe_script()``, e.g. ``engines/vllm_probe.py``) builds the engine's model and
speculative configs from the target's and drafter's files, resolves the target's model class and its EAGLE-3
interface, builds the drafter on the meta device and runs the engine's weight loading over tensors made from the
checkpoint's headers. No GPU and no target weights are needed; a case takes seconds.

A probe that cannot run (no Python there, an engine that does not import) says why in a warning and blocks
nothing; what the engine rejects is an error with the engine's own message.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specdeploy.engines import UnsupportedVersion, get, get_adapter
from specdeploy.values.errors import Finding, Report

MARK = "SPECDEPLOY-PROBE "
TIMEOUT_S = 300.0
MAX_OUTPUT = 16 << 20  # bytes of stdout read back; the result line of a few hundred cases is far smaller
STDERR_TAIL = 4000


@dataclass
class ProbeRun:
    """One run of the probe script: the raw result per case (by id), or why it did not run."""

    ran: bool
    version: str | None = None
    cases: dict[str, dict] = field(default_factory=dict)
    why: str = ""
    seconds: float | None = None
    unavailable: bool = False  # the engine has no probe that runs here (not a problem of this machine)


def python_of(python: str | None, venv: str | None) -> str:
    if venv:
        return str(Path(venv) / "bin" / "python")
    return python or "python3"


def run_cases(engine: str, version: str, cases: list[dict], python: str, timeout: float = TIMEOUT_S,
              env: dict | None = None, max_output: int = MAX_OUTPUT) -> ProbeRun:
    """Run the probe script once over ``cases`` (each: id, target, drafter, and optionally method,
    num_speculative_tokens, trust_remote_code, dtype) with ``python``."""
    try:
        a = get_adapter(engine, version)
    except UnsupportedVersion as exc:
        return ProbeRun(False, why=str(exc))
    script = a.probe_script()
    if script is None:
        return ProbeRun(False, why=a.probe_unavailable(), unavailable=True)
    job = json.dumps({"cases": cases})
    run_env = {**os.environ, **a.probe_env, **(env or {})}
    with tempfile.TemporaryDirectory(prefix="specdeploy-probe-") as tmp:
        out_p, err_p = Path(tmp) / "stdout", Path(tmp) / "stderr"
        try:
            with open(out_p, "wb") as out, open(err_p, "wb") as err:
                proc = subprocess.Popen([python, "-c", script], stdin=subprocess.PIPE, stdout=out, stderr=err,
                                        cwd=tmp, env=run_env, start_new_session=True)
                try:
                    proc.communicate(job.encode(), timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return ProbeRun(False, why=f"the probe did not finish within {timeout:.0f} s (killed)")
        except OSError as exc:
            return ProbeRun(False, why=f"cannot run {python}: {exc.strerror or exc}")
        with open(out_p, "rb") as fh:
            stdout = fh.read(max_output)
        size = out_p.stat().st_size
        with open(err_p, "rb") as fh:
            fh.seek(max(0, err_p.stat().st_size - STDERR_TAIL))
            tail = fh.read().decode(errors="replace")
    return parse_output(stdout.decode(errors="replace"), tail, proc.returncode, python,
                        cut=size > max_output, max_output=max_output)


def parse_output(stdout: str, stderr_tail: str, rc, python: str, cut: bool = False,
                 max_output: int = MAX_OUTPUT) -> ProbeRun:
    """The probe script's result line (``MARK`` + JSON) out of its output, checked, as a ProbeRun; why not, when
    the output holds none (the script's output is an untrusted peer's: it may be cut, garbage, or anything)."""
    line = next((x for x in stdout.splitlines() if x.startswith(MARK)), None)
    if line is None:
        why = f"{python} printed no probe result (exit {rc})"
        if cut:
            why += f"; its output passed {max_output} bytes and was cut"
        last = [x[:300] for x in str(stderr_tail)[-STDERR_TAIL:].strip().splitlines() if x.strip()][-3:]
        return ProbeRun(False, why=why + (": " + " | ".join(last) if last else ""))
    try:
        res = json.loads(line[len(MARK):])
    except ValueError:
        return ProbeRun(False, why=f"{python} printed a probe result that is not JSON")
    if not isinstance(res, dict) or not isinstance(res.get("cases", []), list) \
            or not all(isinstance(c, dict) for c in res.get("cases", [])):
        return ProbeRun(False, why=f"{python} printed a probe result that is not the probe's (no list of cases)")
    if not res.get("ok"):
        return ProbeRun(False, why=f"the engine does not import in {python}: {str(res.get('error'))[:500]}")
    return ProbeRun(True, str(res.get("version")), {str(c.get("id")): c for c in res.get("cases", [])},
                    seconds=res.get("seconds"))


def _engine_msg(err: str) -> str:
    """The engine's own sentence out of a pydantic ValidationError (its 'Value error, ...' line)."""
    m = re.search(r"Value error, (.*?)(?: \[type=|$)", err, re.S)
    return m.group(1).strip() if m else err


def _release(v: str | None) -> str:
    return (v or "").split("+")[0]


# --- from the engine's answer to findings ------------------------------------------------------------------
def case_findings(c: dict, engine: str, version: str) -> list[Finding]:
    """Findings for one case as the engine answered it (``version``: the release the deploy pins)."""
    a = get(engine)(version)
    label, got = a.label, c.get("version")
    out: list[Finding] = []

    def add(sev, subject, msg, fix=""):
        out.append(Finding(sev, subject, msg, fix))
    if _release(got) != version:
        add("error", "engine version", f"the probe ran {label} {got}, not the pinned {version}",
            f"run the probe with the Python of the {label} {version} image or venv")
    for p in c.get("problems", []):
        stage, err = p.get("stage"), _engine_msg(p.get("error", ""))
        if stage == "target_config" and "max_model_len" in err:
            add("error", "target config", f"{label} {got} refuses the context length: {err}",
                "set specdeploy_max_model_len at or below the target's max_position_embeddings, or leave it unset")
        elif stage == "target_config":
            add("error", "target config", f"{label} {got} refuses the target's config: {err}",
                "fix the target's config.json (or its trust_remote_code need) as the engine says")
        elif stage == "speculative_config" and "only supported for" in err:
            mt = c.get("target_model_type")
            fix = (f"set specdeploy_engine_patches: auto (the patch set lifts it), or pin a {label} release "
                   "without the list") if a.patch_ids() else f"pin a {label} release whose list has {mt!r}"
            add("error", "eagle3 target whitelist", f"{label} {got} refuses model_type {mt!r} as an EAGLE-3 target: "
                f"{err}", fix)
        elif stage == "speculative_config":
            add("error", "speculative config", f"{label} {got} refuses the speculative config: {err}",
                f"fix the drafter's config.json as the engine says, or run `specdeploy drafter convert --engine "
                f"{engine}`")
        elif stage == "target_class":
            add("error", "target class", f"{label} {got} cannot resolve the target's model class: {err}",
                "use a target architecture the engine registers")
        elif stage == "drafter_build":
            add("error", "drafter model", f"{label} {got} cannot build the drafter: {err}",
                "fix the drafter's config.json as the engine says")
        elif stage == "drafter_load":
            add("error", "drafter load", f"{label} {got}'s loader fails: {err}", "re-export the drafter")
        else:
            add("warning", f"probe {stage}", f"not determined: {err}", "check this on the engine itself")
    uses_aux = c.get("uses_aux_hidden_states")
    if c.get("supports_eagle3") is False and uses_aux is not False:
        add("error", "SupportsEagle3", f"{label} {got}: {c.get('target_class')} does not implement SupportsEagle3, "
            "and the drafter asks for aux hidden states: the load fails ('Model does not support EAGLE3 interface')",
            f"apply the patch set or pin a {label} release whose {c.get('target_class')} implements it"
            if a.patch_ids() else f"pin a {label} release whose {c.get('target_class')} implements it")
    elif c.get("supports_eagle3"):
        add("info", "target", f"{c.get('target_class')} implements SupportsEagle3 in {label} {got}")
    if uses_aux is False:
        add("info", "aux layers", f"{label} {got} captures no aux hidden states for this drafter "
            "(eagle_config.use_aux_hidden_state: false)")
    elif c.get("aux_layers") is not None:
        add("info", "aux layers", f"{label} {got} captures {c['aux_layers']} (input of layer L) from "
            f"{c.get('aux_layers_source')}")
    load = c.get("load")
    if load:
        out.extend(_load_findings(load, c, label, got))
    return out


def _load_findings(load: dict, c: dict, label: str, got: str) -> list[Finding]:
    out = []
    rej = load.get("rejected", [])
    unknown = [r for r in rej if r.get("kind") == "unknown"]
    shapes = [r for r in rej if r.get("kind") == "shape"]
    other = [r for r in rej if r.get("kind") not in ("unknown", "shape")]

    def names(rs):
        return ", ".join(f"{r['name']} {r['shape']}" for r in rs[:6]) + (f" (+{len(rs) - 6} more)" if len(rs) > 6
                                                                        else "")
    if unknown:
        out.append(Finding("error", "tensor names", f"{label} {got}'s drafter has no parameter for {len(unknown)} "
                           f"checkpoint tensor(s): {names(unknown)}; its loader raises ({unknown[0]['error']})",
                           "set the drafter's switches to those it was trained with (norm_before_fc, fc_norm, ...) "
                           "or serve it with a release that builds these parameters"))
    if shapes:
        out.append(Finding("error", "tensor shapes", f"{label} {got}'s loader rejects the shape of {len(shapes)} "
                           f"tensor(s): {names(shapes)} ({shapes[0]['error']})",
                           "fix hidden_size / target_hidden_size / heads / the switches to the trained values"))
    if other:
        out.append(Finding("error", "drafter load", f"{label} {got}'s loader fails on {names(other)}: "
                           f"{other[0]['error']}", "re-export the drafter"))
    if load.get("load_error") and not rej:
        out.append(Finding("error", "drafter load", f"{label} {got}'s loader fails: {load['load_error']}",
                           "export every weight the engine builds for this config"))
    narrowed = load.get("narrowed", [])
    if narrowed:
        shown = "; ".join(f"{n['name']} {n['shape']} into {n['parameter']}"
                          + (f" shard {n['shard']}" if n.get("shard") is not None else "") + f" {n['want']}"
                          for n in narrowed[:4])
        out.append(Finding("error", "tensor shapes", f"{len(narrowed)} tensor(s) do not have the shape of the "
                           f"parameter {label} {got} builds, and its loader takes a slice of them without an error: "
                           f"{shown}", "fix hidden_size / heads / head_dim / intermediate_size to the trained "
                           "values, or re-export"))
    params = load.get("parameters", {})
    missing = [m for m in load.get("missing", []) if m != "draft_id_to_target_id"]
    if "draft_id_to_target_id" in load.get("missing", []):
        rows = (params.get("draft_id_to_target_id") or [0])[0]
        vocab = c.get("target_vocab")
        if vocab is not None and rows < vocab:
            out.append(Finding("error", "d2t", f"no d2t in the checkpoint: {label} {got} keeps the draft-to-target map "
                               f"at zero, so draft id i is proposed as target id i ({rows} < {vocab})",
                               "export the d2t tensor with the drafter"))
    if missing:
        how = "and the load fails before that matters" if load.get("load_error") else \
            "and stay uninitialised, without an error"
        out.append(Finding("error", "missing tensors", f"{len(missing)} parameter(s) {label} {got} builds get no "
                           f"tensor from the checkpoint {how}: {', '.join(missing[:6])}",
                           "export every weight the engine builds for this config, or set the switches to those the "
                           "drafter was trained with"))
    shared = load.get("shared_from_target") or []
    dv, dh, tv, th = load.get("draft_vocab"), load.get("draft_hidden"), c.get("target_vocab"), c.get("target_hidden")
    if "lm_head" in shared and ((dv is not None and tv is not None and dv != tv) or (dh and th and dh != th)):
        out.append(Finding("error", "lm_head.weight", f"not in the checkpoint, so {label} {got} gives the drafter the "
                           f"target's lm_head ({tv} x {th}), which does not fit the drafter (draft vocabulary {dv}, "
                           f"hidden {dh}): its logits do not match its d2t map",
                           "include the drafter's lm_head.weight"))
    if "embed_tokens" in shared and dh and th and dh != th:
        out.append(Finding("error", "embed_tokens", f"not in the checkpoint, so {label} {got} gives the drafter the "
                           f"target's embeddings (hidden {th}), not the drafter's hidden {dh}",
                           "include the drafter's embed_tokens.weight"))
    if load.get("dropped"):
        d = load["dropped"]
        out.append(Finding("warning", "dropped tensors", f"{label} {got}'s loader skips {len(d)} checkpoint "
                           f"tensor(s) without a word: {', '.join(d[:6])}", "if the drafter was trained with them, "
                           "set the config switch that builds them (e.g. attention_bias)"))
    if not (rej or load.get("load_error") or missing or narrowed):
        out.append(Finding("info", "drafter load", f"{label} {got} places every checkpoint tensor; "
                           f"{len(params)} parameters" + (f"; {', '.join(shared)} shared from the target"
                                                          if shared else "")))
    return out


def probe(target: Path, drafter: Path, engine: str, version: str | None = None, python: str | None = None,
          venv: str | None = None, timeout: float = TIMEOUT_S, method: str = "eagle3",
          trust_remote_code: bool = False, env: dict | None = None) -> tuple[Report, ProbeRun]:
    """Probe one target + drafter pair; the report holds the findings (a warning when the probe cannot run).
    ``env`` is added to the engine Python's environment (e.g. PYTHONPATH to a patched copy of the engine)."""
    rep = Report()
    try:
        cls = get(engine)
    except UnsupportedVersion as exc:
        rep.add("error", "--engine", str(exc), "use one of the registered engines")
        return rep, ProbeRun(False, why=str(exc))
    version = version or cls.versions[-1]
    if version not in cls.versions:
        rep.add("error", "--engine-version", f"{cls.label} {version} is not a release specdeploy knows",
                f"use one of {', '.join(cls.versions)}")
        return rep, ProbeRun(False, why="unknown release")
    for what, d in (("--target", target), ("--drafter", drafter)):
        if not (Path(d) / "config.json").is_file():
            rep.add("error", what, f"no config.json in {d}", f"give the {what[2:]}'s directory")
    if not rep.ok:
        return rep, ProbeRun(False, why="bad input")
    case = {"id": "probe", "target": str(Path(target).resolve()), "drafter": str(Path(drafter).resolve()),
            "method": method, "trust_remote_code": trust_remote_code}
    run = run_cases(engine, version, [case], python_of(python, venv), timeout, env=env)
    if not run.ran:
        rep.add("warning", "probe", f"the {cls.label} probe did not run: {run.why}",
                f"run `specdeploy probe` on a host with the {cls.label} image" if run.unavailable else
                "run it with the Python of the engine's image or venv (--python / --venv)")
        return rep, run
    c = run.cases.get("probe", {})
    rep.add("info", "probe", f"ran {cls.label} {run.version}: {run.seconds} s in all, {c.get('seconds', '?')} s "
            "for this pair after the import")
    rep.extend(case_findings(c, engine, version))
    return rep, run


def preflight_findings(hv, tdir: Path | None, ddir: Path | None, rep: Report, host: str,
                       python: str | None = None, timeout: float = TIMEOUT_S) -> None:
    """``preflight --probe``: the engine's own verdict on the host's target + drafter, beside the doctor's (a
    probe that cannot run is a warning and blocks nothing; the engine's errors are errors)."""
    if not (hv.specdeploy_spec_enabled and hv.specdeploy_spec_method == "eagle3"):
        return
    if tdir is None or ddir is None:
        rep.add("warning", "probe", "no controller-side copy of the target's or the drafter's files: not probed",
                "set specdeploy_model_config_copy and specdeploy_drafter_config_copy", host)
        return
    prep, run = probe(tdir, ddir, hv.specdeploy_engine, hv.specdeploy_engine_version, python, None, timeout,
                      trust_remote_code=bool(hv.specdeploy_trust_remote_code))
    for f in prep.findings:
        rep.add(f.severity, f.subject if f.subject == "probe" else f"probe {f.subject}", f.message, f.fix, host)


# --- on a host, before the engine restarts (the inference_engine role) --------------------------------------
def host_job(hv, probe_dir: str, host: str = "host", address: str | None = None, rank=None) -> dict:
    """What the deploy runs on a host before it restarts the engine onto a new release: the adapter's probe script
    and a job for the release's own command line, run in the release's engine image (or venv) with ``probe_dir``
    mounted (it holds the two files). ``enabled`` False, with ``why``, where there is nothing to probe or no
    probe for this engine; nothing is then blocked."""
    from specdeploy.plan import render_host
    from specdeploy.plan.render.runtime import tool_container
    off = {"enabled": False, "script": "", "job": "", "argv": []}
    if not hv.specdeploy_engine_probe:
        return {**off, "why": "specdeploy_engine_probe is false"}
    if not hv.uses_drafter:
        return {**off, "why": "this release runs no EAGLE drafter to probe"}
    a = get(hv.specdeploy_engine)(hv.specdeploy_engine_version)
    script = a.probe_script()
    if script is None:
        return {**off, "why": a.probe_unavailable()}
    plan = render_host(host, hv, address or host, rank)
    case = a.probe_case(list(plan.argv))
    if case is None:
        return {**off, "why": f"the {a.label} command line of this release names no drafter the probe reads"}
    script_path, job_path = f"{probe_dir}/probe.py", f"{probe_dir}/job.json"
    # the unit's environment (EnvironmentFile=), then what the probe itself needs
    job = {"env": {**plan.env, **a.probe_env}, "cases": [{"id": "release", **case}]}
    run = tool_container(hv, "specdeploy-engine-probe", [script_path, job_path], (probe_dir,), module=False)
    return {"enabled": True, "why": "", "script": script, "job": json.dumps(job, indent=1) + "\n",
            "script_path": script_path, "job_path": job_path, "runtime": run["runtime"], "argv": run["argv"],
            "label": f"{a.label} {hv.specdeploy_engine_version}"}


def host_result(hv, stdout: str, stderr: str, rc, doctor: str = "") -> dict:
    """The deploy's reading of a host probe run: ``errors`` (each the engine's sentence and the fix) stop the
    deploy before the restart; ``warnings`` (the probe could not run: no engine in the image, no GPU to import)
    block nothing; ``doctor`` is the drafter doctor's JSON from the same deploy, when there is one, so a
    disagreement is shown with both sides (the engine's verdict is the one that counts)."""
    from specdeploy.plan.render.runtime import engine_image
    a = get(hv.specdeploy_engine)(hv.specdeploy_engine_version)
    image = engine_image(hv)
    where = f"the image this release starts ({image})" if image else f"the engine's venv ({hv.engine_venv})"
    run = parse_output(str(stdout or "")[:MAX_OUTPUT], str(stderr or ""), rc, where)
    out = {"ran": run.ran, "errors": [], "warnings": [], "info": [], "version": run.version,
           "seconds": run.seconds}
    if not run.ran:
        out["warnings"].append(f"the {a.label} probe did not run in {where}: {run.why}; the doctor's rules stand "
                               "alone for this release")
        return out
    if "release" not in run.cases:
        out["ran"] = False
        out["warnings"].append(f"the {a.label} probe in {where} answered no case for this release; the doctor's "
                               "rules stand alone for it")
        return out
    case = {"version": run.version, **run.cases["release"]}
    for f in case_findings(case, hv.specdeploy_engine, hv.specdeploy_engine_version):
        line = f"{f.subject}: {f.message}" + (f" Fix: {f.fix}" if f.fix else "")
        {"error": out["errors"], "warning": out["warnings"]}.get(f.severity, out["info"]).append(line)
    if out["errors"]:
        verdict = _doctor_verdict(doctor)
        if verdict == "ok":
            out["errors"].append("the drafter doctor passed this drafter; the engine's own code refuses it, and "
                                 "the engine decides")
    return out


def _doctor_verdict(text: str) -> str:
    """'ok' / 'error' from ``specdeploy drafter check --json`` output; '' when there is none or it is not that."""
    try:
        d = json.loads(text) if text else None
    except ValueError:
        return ""
    if not isinstance(d, dict) or not isinstance(d.get("findings"), list):
        return ""
    return "error" if any(isinstance(f, dict) and f.get("severity") == "error" for f in d["findings"]) else "ok"
