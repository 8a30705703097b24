"""``specdeploy preflight``: everything that can be known before the 30-minute load, in seconds, per host.
It reads the inventory and controller-side copies of the model/drafter configs; it changes nothing anywhere."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from specdeploy import drafter as drafter_mod
from specdeploy.engines import get_adapter
from specdeploy.values.errors import Finding, Report, SpecdeployError
from specdeploy.checkpoint.modelcfg import TargetModel
from specdeploy.hostvars.schema import HostVars, validate_host

GIB = 1 << 30
LOAD_BYTES_PER_S = 300e6  # a cold load from local NVMe through the engine's loader, order of magnitude


def _resolve(path: str, base: Path | None) -> Path:
    p = Path(path)
    return base / p if not p.is_absolute() and base is not None else p


def _local(copy: str | None, source: str | None, path_host: str, base: Path | None) -> Path | None:
    """The controller-side directory whose config preflight reads: the config copy, the controller source, or the
    host path when this machine has it too."""
    for cand in (copy, source, path_host):
        if cand and (_resolve(cand, base) / "config.json").is_file():
            return _resolve(cand, base)
    return None


def source_findings(hv: HostVars, kind: str, rep: Report, host: str, base: Path | None):
    """Missing, incomplete or mismatched sources are errors before any host changes."""
    from specdeploy.hostscripts import staging
    copy = getattr(hv, f"specdeploy_{kind}_config_copy")
    if copy and not (_resolve(copy, base) / "config.json").is_file():
        rep.add("error", f"specdeploy_{kind}_config_copy", f"no config.json at {_resolve(copy, base)} on this "
                "machine", f"point specdeploy_{kind}_config_copy at a copy of the {kind}'s config files, or unset it",
                host)
    mode = hv.specdeploy_model_source if kind == "model" else hv.drafter_source
    var = f"specdeploy_{kind}_controller_path"
    src = getattr(hv, var)
    if mode == "controller" and src:
        res = staging.verify(_resolve(src, base), var)
        for p in res.problems:
            rep.add("error", p.subject, p.message, p.fix, host)
        if res.ok:
            rep.add("info", var, f"complete: {res.files} weight files, {res.bytes / 1e9:.1f} GB", host=host)
    elif mode in ("host", "shared"):
        where = hv.specdeploy_model_path if kind == "model" else hv.specdeploy_drafter_path
        if mode == "shared":
            where = getattr(hv, f"specdeploy_{kind}_shared_path")
        rep.add("info", f"specdeploy_{kind}_source", f"{mode}: {where} is verified on the host (config, shards, "
                "header sizes) before anything there changes", host=host)


def parse_seconds(value: str) -> float | None:
    """systemd time span -> seconds; None for infinity."""
    v = value.strip().lower()
    if v in ("infinity", "0"):
        return None
    total = 0.0
    units = {"h": 3600, "hr": 3600, "hour": 3600, "hours": 3600, "min": 60, "m": 60, "minutes": 60, "s": 1,
             "sec": 1, "seconds": 1, "": 1, "ms": 0.001, "d": 86400, "days": 86400}
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", v):
        total += float(num) * units.get(unit, 1)
    return total


def engine_findings(hv: HostVars, target: TargetModel | None, drafter_fmt: str | None, rep: Report, host: str):
    """What the pinned engine release does with this model and drafter (the adapter's preflight checks), and
    whether the target carries what a method that drafts with the target's own layers (MTP) needs."""
    adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    rep.extend(adapter.target_method_problems(hv, target, host))
    adapter.preflight(hv, target, drafter_fmt, rep, host)
    weight_cache_findings(hv, target, rep, host)


def weight_cache_findings(hv: HostVars, target: TargetModel | None, rep: Report, host: str):
    """Whether the engine's restarts attach to a weight-cache daemon (the same answer the plan renders from), and
    if so whether the daemon's weights and the engine's own budget fit on each GPU; where not, why, and what keeps
    restarts as cheap as the host allows."""
    from specdeploy.engines.weightcache import DAEMON_OVERHEAD_GIB, ENGINE_CONTEXT_GIB, quant_kind
    adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    quant = quant_kind(target.config) if target is not None else None
    s = adapter.weight_cache_support(hv, quant)
    mode = hv.specdeploy_weight_cache
    warm = ("the deploy reads the checkpoint into the host's page cache before each restart where the host's "
            "memory holds it (specdeploy_page_cache_warm)") if hv.specdeploy_page_cache_warm else \
        "specdeploy_page_cache_warm is off"
    if mode == "off":
        rep.add("info", "specdeploy_weight_cache", f"off: every engine restart loads the checkpoint ({warm})",
                host=host)
        return
    if s.ok is not True and not (mode == "on" and s.ok is None):
        if s.ok is None:
            later = ("set specdeploy_model_config_copy to a copy of the model's config files (its quantization "
                     "decides), or specdeploy_weight_cache: on")
        elif s.first_rendered and not adapter._wc_rendered():
            later = f"pin {adapter.label} >= {s.first_rendered}"
        else:
            later = "none needed; restarts load from disk"
        if mode == "on":
            rep.add("error", "specdeploy_weight_cache", f"is on, but {s.why}",
                    "set specdeploy_weight_cache: auto (off where it cannot be used)", host)
            return
        rep.add("warning", "weight cache", f"none: {s.why}. Every engine restart (the gate's two runs, a regate, a "
                f"canary, a flag change, a crash) is a full load; {warm}", later, host)
        return
    if s.ok is None:  # on, with the checkpoint unread: the plan renders it, the engine is the judge
        rep.add("warning", "weight cache", f"on, but {s.why}: whether the daemon can hold it is not checked here",
                "set specdeploy_model_config_copy to a copy of the model's config files", host)
    prof = hv.profile()
    total = prof.gpu_memory_gib
    f = adapter.memory_fraction(hv, True)
    low = f"; rendered {f:g} instead of {hv.specdeploy_gpu_memory_utilization:g} to leave the daemon's overhead " \
        "room" if f < hv.specdeploy_gpu_memory_utilization else ""
    if target is None:
        rep.add("info", "weight cache", f"the engine attaches to its weight-cache daemon (memory not accounted: no "
                f"config.json read){low}", host=host)
        return
    weights, how = target.weight_bytes()
    w = weights / hv.tp / GIB
    own = f * total - w
    text = (f"the weight-cache daemon holds {w:.1f} GiB per GPU ({how}, TP {hv.tp}); the engine's budget "
            f"{f:g} x {total:g} GiB = {f * total:.1f} GiB counts them, leaving {own:.1f} GiB for its KV cache, "
            f"activations and CUDA graphs; outside it: the daemon's overhead (~{DAEMON_OVERHEAD_GIB:g} GiB, an "
            f"estimate) and the engine's context (~{ENGINE_CONTEXT_GIB:g} GiB){low}")
    if own <= 0:  # the weights alone fill the budget: "GPU memory" says so, unless the lowered fraction did it
        if low:
            rep.add("error", "weight cache memory", f"does not fit: {text}",
                    "raise specdeploy_tensor_parallel_size, or set specdeploy_weight_cache: off", host)
        return
    drafter = " The drafter loads from disk with the engine." if hv.uses_drafter else ""
    rep.add("info", "weight cache", f"{s.why}: an engine restart maps the weights; a change of weights, "
            f"quantization, layout or release restarts the daemon (a full load). {text[0].upper()}{text[1:]}."
            f"{drafter}", host=host)


def model_findings(hv: HostVars, target: TargetModel, rep: Report, host: str):
    prof = hv.profile()
    tp = hv.tp
    if target.heads % tp:
        rep.add("error", "specdeploy_tensor_parallel_size", f"TP {tp} does not divide the model's "
                f"{target.heads} attention heads", "pick a TP that divides the head count", host)
    if target.needs_remote_code and not hv.specdeploy_trust_remote_code:
        rep.add("error", "specdeploy_trust_remote_code", f"{target.model_type} ships its own code (auto_map) and "
                "the tokenizer fails without it", "set specdeploy_trust_remote_code: true", host)
    weights, how = target.weight_bytes()
    per_gpu = weights / tp
    budget = prof.gpu_memory_gib * GIB * hv.specdeploy_gpu_memory_utilization
    msg = (f"weights {weights / GIB:.0f} GiB ({how}) = {per_gpu / GIB:.1f} GiB per GPU at TP {tp}; budget "
           f"{budget / GIB:.1f} GiB per GPU ({prof.gpu_memory_gib:g} GiB x {hv.specdeploy_gpu_memory_utilization})")
    if per_gpu > budget:
        rep.add("error", "GPU memory", f"does not fit: {msg}",
                "raise TP, use a smaller quantization, or raise specdeploy_gpu_memory_utilization", host)
    elif per_gpu > 0.9 * budget:
        rep.add("warning", "GPU memory", f"under 10% left for the KV cache: {msg}",
                "raise specdeploy_gpu_memory_utilization or lower max_model_len", host)
    else:
        rep.add("info", "GPU memory", msg, host=host)
    timeout = parse_seconds(hv.specdeploy_start_timeout)
    load_s = max(weights / LOAD_BYTES_PER_S, 60)
    if timeout is not None and timeout < load_s:
        rep.add("error", "specdeploy_start_timeout", f"{hv.specdeploy_start_timeout} is shorter than a realistic "
                f"load of {weights / GIB:.0f} GiB (about {load_s / 60:.0f} min): systemd would kill the engine "
                "mid-load", "use infinity (readiness is checked separately) or several hours", host)
    nccl = hv.specdeploy_nccl_env if hv.specdeploy_nccl_env is not None else prof.nccl_env_values()
    if prof.interconnect == "pcie" and nccl.get("NCCL_P2P_DISABLE") != "1":
        rep.add("warning", "PCIe P2P", "NCCL P2P over PCIe is on, and ACS/IOMMU state is unknown here: ACS "
                "redirect or a translating IOMMU make P2P hang on RTX PRO 6000",
                "on the host: `specdeploy nccl topo` (reads nvidia-smi topo -m, lspci -vvv ACSCtl, /proc/cmdline); "
                "`specdeploy preflight --hosts` and the gpu_host role check it too", host)


def drafter_tp_findings(hv: HostVars, d, rep: Report, host: str):
    """The drafter runs at the target's tensor-parallel size unless the speculative config gives it one of its own
    (draft_tensor_parallel_size): its attention heads must divide by it. The engine checks it at startup, while it
    builds the speculative config (vLLM 0.16.0: "Total number of attention heads (H) must be divisible by tensor
    parallel size (T)")."""
    own = hv.specdeploy_spec_config_extra.get("draft_tensor_parallel_size")
    tp = own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else hv.tp
    if d.heads and d.heads % tp:
        rep.add("error", "drafter num_attention_heads", f"the drafter's {d.heads} attention heads do not divide by "
                f"its tensor-parallel size {tp}: the engine refuses the speculative config at startup",
                "use a drafter whose head count the TP divides, or give the drafter a TP that does "
                "(draft_tensor_parallel_size in specdeploy_spec_config_extra, where the engine has it)", host)


def preflight_host(host: str, variables: dict, inv_dir: Path | None, probe_python: str | None = None) -> Report:
    rep = Report()
    try:
        hv = validate_host(host, variables)
    except SpecdeployError as exc:
        rep.extend(exc.problems)
        return rep
    prof = hv.profile()
    rep.add("info", "hardware", f"{prof.name}: {prof.description}", host=host)
    rep.add("info", "engine release", hv.release_choice(), host=host)
    if hv.specdeploy_spec_enabled and hv.specdeploy_drafter_path and not hv.uses_drafter:
        rep.add("warning", "specdeploy_drafter_path", f"is not used: method {hv.specdeploy_spec_method} drafts "
                "without a drafter checkpoint of its own, so it is neither staged nor converted",
                "unset specdeploy_drafter_path, or use a method with a drafter (eagle3)", host)
    key = hv.specdeploy_api_key_file
    if key and not Path(key).is_file():
        rep.add("warning", "specdeploy_api_key_file", f"{key} does not exist on this machine; the deploy stops "
                "when it installs the key", "write the API key to that file (one line), or unset the variable",
                host)
    elif key:
        from specdeploy.plan import secret_files
        try:  # read as the deploy reads it (Ansible's file lookup drops trailing white space)
            secret_files(hv, Path(key).read_text(errors="replace").rstrip())
        except SpecdeployError as exc:
            rep.extend([replace(f, host=host) for f in exc.problems])
        except OSError as exc:
            rep.add("error", "specdeploy_api_key_file", f"{key}: cannot read it ({exc.strerror})",
                    "make the file readable by the user who runs the deploy", host)
    if hv.specdeploy_spec_gate and hv.specdeploy_spec_enabled and inv_dir is not None:
        from specdeploy.hostvars.varsfile import gate_vars_file
        try:  # where the gate will record its verdict, before it measures anything
            gate_vars_file(str(inv_dir), host)
        except ValueError as exc:
            rep.add("error", "specdeploy_spec_gate", f"the gate could not record its verdict: {exc}",
                    f"move the file into host_vars/{host}/, or set specdeploy_spec_gate: false", host)
    target = None
    source_findings(hv, "model", rep, host, inv_dir)
    tdir = _local(hv.specdeploy_model_config_copy, hv.specdeploy_model_controller_path, hv.specdeploy_model_path,
                  inv_dir)
    if tdir is None:
        rep.add("warning", "target config", f"no config.json at {hv.specdeploy_model_path} on this machine: model "
                "checks skipped", "set specdeploy_model_config_copy to a copy of the model's config files", host)
    else:
        try:
            target = TargetModel.load(tdir)
            model_findings(hv, target, rep, host)
        except SpecdeployError as exc:
            rep.extend(exc.problems)
    drafter_fmt = None
    if hv.uses_drafter:
        source_findings(hv, "drafter", rep, host, inv_dir)
        ddir = _local(hv.specdeploy_drafter_config_copy, hv.specdeploy_drafter_controller_path,
                      hv.specdeploy_drafter_path, inv_dir)
        if ddir is None:
            rep.add("warning", "drafter", f"no config.json at {hv.specdeploy_drafter_path} on this machine: drafter "
                    "not checked", "set specdeploy_drafter_config_copy", host)
        elif target is not None:
            try:
                d = drafter_mod.Drafter.load(ddir)
                drafter_fmt = d.fmt
                drafter_tp_findings(hv, d, rep, host)
                drep = drafter_mod.check(ddir, tdir, hv.specdeploy_engine, hv.specdeploy_engine_version)
                # the drafter role converts what `drafter convert` fixes before the engine starts: report as info
                for f in drep.findings:
                    if f.subject == "target":
                        continue  # the adapter's preflight decides, knowing the image's patch set
                    sev, msg = f.severity, f.message
                    if sev == "error" and drafter_mod.is_convertible(f):
                        sev, msg = "info", f"{msg} (the drafter role converts this)"
                    rep.add(sev, f"drafter {f.subject}", msg, f.fix, host)
            except SpecdeployError as exc:
                rep.extend(exc.problems)
    engine_findings(hv, target, drafter_fmt, rep, host)
    if probe_python is not None:  # the engine's own verdict (checks/probe.py), with that Python
        from specdeploy.checks.probe import preflight_findings
        ddir = _local(hv.specdeploy_drafter_config_copy, hv.specdeploy_drafter_controller_path,
                      hv.specdeploy_drafter_path or "", inv_dir) if hv.uses_drafter else None
        preflight_findings(hv, tdir, ddir, rep, host, probe_python)
    return rep


def preflight(inventory: str, limit: str | None = None, extra: dict | None = None,
              vault=None, probe_python: str | None = None) -> dict[str, Report]:
    """One report per engine host. Inventory-level errors come back per host, not as an exception (vault: the
    vault secrets given on the command line)."""
    from specdeploy.hostvars.inventory import _check_path, engine_host_names, host_variables

    path = Path(inventory)
    _check_path(path)
    inv, all_vars = host_variables(path, extra, vault)
    names = engine_host_names(inv, path, limit)
    if not names:
        raise SpecdeployError([Finding("error", "--limit", f"no engine hosts in {path} match '{limit}'",
                                       "give an engine host or group")])
    out = {}
    same: dict[str, tuple[str, Report]] = {}  # hosts with the same specdeploy_* values get the same checks
    for name in names:
        variables = all_vars[name]
        if isinstance(variables, SpecdeployError):
            rep = Report()
            rep.extend(variables.problems)
            out[name] = rep
            continue
        key = shared_key(name, variables)
        if key is not None and key in same:
            first, rep = same[key]
            out[name] = Report([replace(f, host=name if f.host == first else f.host) for f in rep.findings])
            continue
        out[name] = rep = preflight_host(name, variables, path, probe_python)
        if key is not None and not any(name in f"{f.subject} {f.message} {f.fix}" for f in rep.findings):
            same[key] = (name, Report([replace(f) for f in rep.findings]))
    # what plan and deploy refuse for the inventory as a whole, from the same code: the serving groups' checks,
    # the router's; and what reading the inventory found worth a warning
    for f in group_findings(inv, path, all_vars, names) + list(getattr(inv, "specdeploy_warnings", [])):
        target = f.host if f.host in out else names[0]
        out[target].findings.append(replace(f, host=target))
    return out


def grouped(reports: dict[str, Report]) -> list[tuple[list[str], bool, int, list[str]]]:
    """Hosts whose findings read the same, listed once: (hosts, ok, errors, finding lines without the host), in
    the order of each group's first host. A fleet's preflight is one block per distinct set of findings."""
    same: dict[tuple, list[str]] = {}
    for host, r in reports.items():
        lines = tuple(replace(f, host=None).line() for f in r.findings)
        same.setdefault((r.ok, len(r.errors), lines), []).append(host)
    return [(names, ok, errors, list(lines)) for (ok, errors, lines), names in same.items()]


def shared_key(host: str, variables: dict) -> str | None:
    """What a host's preflight depends on beyond its name: its ``specdeploy_*`` values (the controller files they
    name are read the same for every host). None when its address is one validate_host refuses (checked per
    host) or the values do not serialise."""
    from specdeploy.hostvars.schema import PREFIX, content_key, address_problems
    if address_problems(host, variables):
        return None
    return content_key({k: v for k, v in variables.items() if k.startswith(PREFIX)})


def group_findings(inv, path: Path, all_vars: dict, names: list[str]) -> list[Finding]:
    """topology.check_members over every engine host of the inventory that validates (a host that does not is
    reported on its own)."""
    from specdeploy.hostvars.inventory import engine_host_names
    from specdeploy.topology import Member, check_members
    members = []
    for name in engine_host_names(inv, path, None):
        variables = all_vars[name]
        if isinstance(variables, SpecdeployError):
            continue
        try:
            members.append(Member(name, str(variables.get("ansible_host", name)), validate_host(name, variables)))
        except SpecdeployError:
            continue
    try:
        return check_members(members, set(names))[1]
    except SpecdeployError as exc:
        return exc.problems
