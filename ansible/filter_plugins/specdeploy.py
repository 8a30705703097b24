"""Ansible filters that call the specdeploy core, so a deploy renders exactly what ``specdeploy plan`` shows and
checks exactly what ``specdeploy preflight`` checks. No deployment logic lives in YAML/Jinja."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _plain(obj):
    if isinstance(obj, dict) or hasattr(obj, "keys"):
        return {str(k): _plain(obj[k]) for k in obj.keys()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, float)):
        return obj
    return str(obj)


def _ours(variables) -> dict:
    keys = [k for k in variables.keys() if k.startswith("specdeploy_") or k == "ansible_host"]
    return {k: _plain(variables[k]) for k in keys}


def _validated(variables, host, overrides=None):
    from specdeploy.values.errors import SpecdeployError
    from specdeploy.hostvars.schema import validate_host
    v = _ours(variables)
    v.update(_plain(overrides or {}))
    try:
        return v, validate_host(host, v)
    except SpecdeployError as exc:
        raise AnsibleFilterError("\n" + str(exc)) from None


def _rank(host, v, hv, hostvars, hosts):
    """The host's rank in its serving group, resolved from the group's hosts (``hosts``: the engine group, in
    inventory order) as ``specdeploy plan`` resolves it."""
    from specdeploy.values.errors import SpecdeployError
    from specdeploy.topology import Member, resolve
    members = []
    for h in hosts if hostvars is not None and hosts is not None else [host]:
        if h == host:
            members.append(Member(host, str(v.get("ansible_host", host)), hv))
        elif hv.specdeploy_group and _plain(hostvars[h].get("specdeploy_group")) == hv.specdeploy_group:
            pv, phv = _validated(hostvars[h], h)
            members.append(Member(h, str(pv.get("ansible_host", h)), phv))
    try:
        return resolve(members)[host]
    except SpecdeployError as exc:
        raise AnsibleFilterError("\n" + str(exc)) from None


def _all_ranks(hostvars, hosts):
    from specdeploy.values.errors import SpecdeployError
    from specdeploy.topology import Member, resolve
    members = []
    for h in hosts:
        v, hv = _validated(hostvars[h], h)
        members.append(Member(h, str(v.get("ansible_host", h)), hv))
    try:
        return members, resolve(members)
    except SpecdeployError as exc:
        raise AnsibleFilterError("\n" + str(exc)) from None


def specdeploy_group(hostvars, host, hosts):
    """The host's serving group as the deploy moves it: its mates (rank order; the host alone when it serves
    alone), its leader and the leader's address, whether it serves HTTP, and its start wave (0: ranks that join a
    leader, 1: hosts that serve)."""
    from specdeploy.topology import mates, start_order
    _, ranks = _all_ranks(hostvars, list(hosts))
    group = mates(host, ranks)
    leader = group[0]
    waves = start_order(group, ranks)
    r = ranks.get(host)
    lv, lhv = _validated(hostvars[leader], leader)
    lhost = str(lv.get("ansible_host", leader))
    lhost = f"[{lhost}]" if ":" in lhost and not lhost.startswith("[") else lhost
    return {"name": r.group if r is not None else host, "mates": group, "leader": leader,
            "leader_url": f"http://{lhost}:{lhv.specdeploy_port}",
            "serves": r is None or r.leader, "multi_host": len(group) > 1,
            # the router in PD mode registers its prefill and decode instances itself, from its command line
            "routed_by_api": r is None or r.layout != "pd",
            "wave": next(i for i, w in enumerate(waves) if host in w)}


def specdeploy_release_group(release_plan, hostvars):
    """A stored release's serving group as a rollback restarts it (the group of that release, which may not be
    the inventory's now): whether the host served HTTP there, and its leader's URL when it did not."""
    p = _plain(release_plan) or {}
    rank = p.get("rank") or {}
    hosts = list(rank.get("hosts") or [])
    multi = len(hosts) > 1 and rank.get("layout") in ("tp", "dp_ep")
    leader = rank.get("leader") or (hosts[0] if hosts else None)
    url = ""
    if multi and leader in hostvars:
        addr = str(_plain(hostvars[leader].get("ansible_host", leader)))
        addr = f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
        url = f"http://{addr}:{int((p.get('ports') or {}).get('engine') or 8000)}"
    return {"serves": bool(p.get("serves", True)) or not multi, "multi_host": multi, "leader_url": url}


def specdeploy_mates_without(mates, hostvars, fact):
    """The mates whose boolean ``fact`` is not true (not set counts as not true)."""
    return [m for m in mates if str(_plain(hostvars[m].get(fact, False))).lower() not in ("true", "1", "yes")]


def specdeploy_group_root(mates, hostvars, host):
    """A failed group's root cause from its ranks' triage (``inference_engine_triage`` on each): the first rank,
    in rank order, whose journal names one, with that rank; else what ``host``'s own unit said last."""
    from specdeploy.triage import group_root
    got = group_root([(m, _plain(hostvars[m].get("inference_engine_triage")) or {}) for m in mates])
    if got is not None:
        m, t = got
        where = f"rank {list(mates).index(m)} ({m}): " if len(mates) > 1 else ""
        return f"{where}{t['root_cause']} ({t.get('fix') or 'no fix known'})"
    tail = _plain(hostvars[host].get("inference_engine_tail")) or []
    return "no known root cause; the unit says: " + " | ".join(str(x) for x in tail)


def specdeploy_serial_problems(hostvars, hosts, serial, order):
    """Lines for a specdeploy_serial that would cut a serving group between batches of ``order`` (the play's
    hosts in order); empty when every batch holds whole groups."""
    from specdeploy.topology import serial_problems
    _, ranks = _all_ranks(hostvars, list(hosts))
    return [str(f) for f in serial_problems(_plain(serial), list(order), ranks)]


def specdeploy_batch_problems(hostvars, hosts, batch):
    """Lines for a rolling batch that splits a serving group (empty when every group in it is whole)."""
    from specdeploy.topology import batch_problems
    _, ranks = _all_ranks(hostvars, list(hosts))
    return [str(f) for f in batch_problems(list(batch), ranks)]


def specdeploy_plan(variables, host, overrides=None, hostvars=None, hosts=None):
    """A host's plan: files (path -> content), argv, env, units, health paths, release id. ``overrides``
    (variables) are applied on top of the inventory, e.g. by the speculation gate. ``hostvars`` and ``hosts`` (the
    engine group) give a host of a multi-host serving group its rank."""
    from specdeploy.plan import render_host
    v, hv = _validated(variables, host, overrides)
    return render_host(host, hv, v.get("ansible_host", host), _rank(host, v, hv, hostvars, hosts)).to_dict()


def specdeploy_secret_files(variables, host, key=""):
    """Path -> content of the 0600 files that carry the API key ``key`` to this host's engine, in its adapter's
    form; empty without specdeploy_api_key_file."""
    from specdeploy.values.errors import SpecdeployError
    from specdeploy.plan import secret_files
    _, hv = _validated(variables, host)
    try:
        return secret_files(hv, key)
    except SpecdeployError as exc:
        raise AnsibleFilterError("\n" + str(exc)) from None


def specdeploy_profile(variables, host):
    from dataclasses import asdict
    _, hv = _validated(variables, host)
    return asdict(hv.profile())


def specdeploy_preflight(variables, host, inventory_dir=None):
    from pathlib import Path
    from specdeploy.checks.preflight import preflight_host
    rep = preflight_host(host, _ours(variables), Path(inventory_dir) if inventory_dir else None)
    out = rep.to_dict()
    out["lines"] = [f.line() for f in rep.findings if f.severity != "info"]
    return out


def specdeploy_triage(text):
    from specdeploy.triage import triage_lines
    lines = text.splitlines() if isinstance(text, str) else list(text)
    return triage_lines(lines).to_dict()


def specdeploy_targets(hostvars, hosts):
    """Scrape targets for the engine hosts, from their validated variables; the ranks of a serving group that
    serve no HTTP (its headless ranks) have no engine or exporter target."""
    members, ranks = _all_ranks(hostvars, list(hosts))
    out = []
    for m in members:
        r = ranks.get(m.name)
        out.append({"host": m.name, "address": m.address, "engine": m.hv.specdeploy_engine,
                    "engine_port": m.hv.specdeploy_port, "exporter_port": m.hv.specdeploy_exporter_port,
                    "serves": r is None or r.leader, "group": r.group if r is not None else ""})
    return out


def specdeploy_prometheus(targets, rules_files=None, scrape_interval="15s"):
    from specdeploy.plan.render.prometheus import render_prometheus
    return render_prometheus(_plain(targets), _plain(rules_files or []), scrape_interval)


def specdeploy_rules(_=None, **overrides):
    from specdeploy.speculation.monitoring import render_rules
    return render_rules(**overrides)


def specdeploy_dashboard(_=None):
    from specdeploy.speculation.monitoring import dashboard_json
    return dashboard_json()


def specdeploy_grafana(prometheus_url, kind, path=""):
    from specdeploy.speculation.monitoring import grafana_dashboard_provider, grafana_datasource
    return grafana_datasource(prometheus_url) if kind == "datasource" else grafana_dashboard_provider(path)


def specdeploy_image(variables, host, source="unknown"):
    """How to build the host's engine image (tag, Dockerfile, build args; the sandbox's stand-in base)."""
    _, hv = _validated(variables, host)
    from specdeploy.plan.images import build_plan
    return build_plan(hv.specdeploy_engine, hv.specdeploy_engine_version, hv.specdeploy_engine_patches,
                      hv.specdeploy_sandbox, hv.specdeploy_image, str(source))


def specdeploy_tool_container(variables, host, name, args, rw_mounts=(), module=True):
    """A command in the engine's environment (same image, GPUs, mounts, ulimits as the engine unit)."""
    _, hv = _validated(variables, host)
    from specdeploy.plan.render.runtime import tool_container
    return tool_container(hv, str(name), [str(a) for a in args], tuple(str(m) for m in rw_mounts), bool(module))


def specdeploy_router_unit(hostvars, hosts, router_port, venv):
    """The router's unit over the engine hosts that serve: each group's leader, or in PD mode its prefill and
    decode instances (topology.router_workers)."""
    from specdeploy.values.errors import SpecdeployError
    from specdeploy.plan.render.systemd import render_router
    from specdeploy.topology import Member, resolve, router_workers
    members = []
    for h in hosts:
        v, hv = _validated(hostvars[h], h)
        members.append(Member(h, str(v.get("ansible_host", h)), hv))
    try:
        w = router_workers(members, resolve(members))
    except SpecdeployError as exc:
        raise AnsibleFilterError("\n" + str(exc)) from None
    return render_router(w.get("workers", []), int(router_port), venv, prefill=w.get("prefill"),
                         decode=w.get("decode"))


def specdeploy_gate_verdict(report, variables=None, host=None):
    """The inventory overrides that apply a gate report's verdict; with the host's variables, a k per load band
    where its engine release takes one."""
    from specdeploy.engines import get_adapter
    from specdeploy.speculation.gate import verdict_overrides
    per_batch = False
    if variables is not None:
        _, hv = _validated(variables, host)
        per_batch = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version).takes_k_by_batch()
    return verdict_overrides(_plain(report), per_batch)


def specdeploy_gather_script(_=None):
    """The read-only script that shows a GPU host as the host checks read it."""
    from specdeploy.gpuhost.report import gather_script
    return gather_script()


def specdeploy_host_check(variables, host, output, acs_disable=False):
    """What the gather script's output says about the host: facts, findings (lines), the install plan, and the
    decisions the gpu_host role applies (ACS, NCCL P2P, reboot)."""
    from specdeploy.gpuhost.report import host_decisions
    v, hv = _validated(variables, host)
    return _plain(host_decisions(host, hv, str(output), bool(acs_disable)))


def specdeploy_daemon_json(current):
    """/etc/docker/daemon.json with the NVIDIA runtime and the engine's ulimits merged in (differs: False when
    the file already says so)."""
    from specdeploy.gpuhost.install import docker_daemon_config
    return docker_daemon_config(current if isinstance(current, str) else None)


def specdeploy_acs_files(_=None):
    from specdeploy.gpuhost.install import ACS_SCRIPT, ACS_UNIT
    return {"script": ACS_SCRIPT, "unit": ACS_UNIT}


def specdeploy_path(name):
    """A host path of specdeploy's (values/hostpaths.py): 'state', 'config', 'opt', 'venv', 'wheelhouse', ..."""
    from specdeploy.values.hostpaths import host_path
    try:
        return host_path(str(name))
    except KeyError as exc:
        raise AnsibleFilterError(str(exc)) from None


def specdeploy_ssh(variables):
    """The ssh command (no destination) to a host from its connection variables, as one string for rsync -e."""
    import shlex

    from specdeploy.hostvars.ssh import ssh_options
    keys = ("ansible_port", "ansible_ssh_private_key_file", "ansible_ssh_common_args", "ansible_ssh_extra_args")
    return shlex.join(ssh_options({k: _plain(variables[k]) for k in keys if k in variables}))


def specdeploy_gate_argv(settings, out, baseline=None):
    """The ``specdeploy gate`` arguments of the gate role's baseline (no ``baseline``) or speculative run."""
    from specdeploy.speculation.gate import command_line
    return command_line(_plain(settings), str(out), None if baseline is None else str(baseline))


def specdeploy_gate_vars_file(inventory_dir, host):
    """The inventory file that holds a host's gate verdict (the variables that apply it)."""
    from specdeploy.plan.render.paths import gate_vars_file
    return gate_vars_file(str(inventory_dir), str(host))


def specdeploy_probe_job(variables, host, probe_dir, overrides=None, hostvars=None, hosts=None):
    """The engine probe the deploy runs before the engine restarts onto this host's new release: the script, its
    job (the release's own command line, this rank's in a serving group) and how to run it in the release's image
    or venv (checks/probe.py)."""
    from ansible.utils.unsafe_proxy import wrap_var
    from specdeploy.checks.probe import host_job
    v, hv = _validated(variables, host, overrides)
    job = host_job(hv, str(probe_dir), str(host), v.get("ansible_host", host),
                   _rank(host, v, hv, hostvars, hosts))
    # the script and the job are data for the host, never templates (Python may hold '{{' or '{%')
    return {**job, "script": wrap_var(job["script"]), "job": wrap_var(job["job"])}


def specdeploy_probe_result(variables, host, stdout, stderr="", rc=None, doctor="", overrides=None):
    """The probe run's errors (they stop the deploy), warnings (it could not run) and notes."""
    from specdeploy.checks.probe import host_result
    _, hv = _validated(variables, host, overrides)
    return host_result(hv, str(stdout or ""), str(stderr or ""), rc, str(doctor or ""))


class FilterModule:
    def filters(self):
        return {name: fn for name, fn in globals().items() if name.startswith("specdeploy_") and callable(fn)}


def specdeploy_staging_script(_=None):
    """Path of the stdlib-only staging script, run on hosts with their own python3 before anything is installed."""
    from specdeploy.hostscripts import staging
    return staging.__file__


def specdeploy_tree_id(path):
    """Content id of a controller directory from names, sizes and mtimes (no weights are read)."""
    from specdeploy.hostscripts.staging import tree_id
    return tree_id(path)


def specdeploy_stage_log(host, kind):
    """Controller-side log of a `controller` copy's rsync progress (read by `specdeploy deploy`)."""
    from specdeploy.ops.copy import controller_log
    return str(controller_log(host, kind))


def specdeploy_weights(variables, host):
    """The checkpoints a host serves, each with its source mode and paths (HostVars.weights)."""
    from pathlib import Path
    v, hv = _validated(variables, host)
    items = hv.weights()
    base = variables.get("inventory_dir")
    for it in items:  # controller paths relative to the inventory, as preflight reads them
        if it["controller"] and base and not Path(it["controller"]).is_absolute():
            it["controller"] = str(Path(str(base)) / it["controller"])
    return items


def specdeploy_gpg_key_check(colons, fingerprint):
    """'' when `gpg --show-keys --with-colons` output holds the pinned key, usable; else what is wrong."""
    from specdeploy.speculation.monitoring import gpg_key_problem
    return gpg_key_problem(str(colons), str(fingerprint))


def specdeploy_converged_script(_=None):
    """Path of the stdlib-only converged-state script, run on hosts with their own python3."""
    from specdeploy.hostscripts import converged
    return converged.__file__


def specdeploy_inputs_digest(hostvars, hosts, playbook_dir, inventory_sources=()):
    """One digest of everything a deploy of ``hosts`` renders from (code, inventory, -e, files the variables
    name, controller copies of the weights); computed once per run on the controller."""
    import os
    from pathlib import Path

    from ansible import context
    import specdeploy
    from specdeploy.hostscripts.converged import inputs_digest
    from specdeploy.hostscripts.staging import tree_id
    files, weights = [], []
    for h in sorted(hostvars.keys()):
        v = hostvars[h]
        for k in sorted(v.keys()):
            if k.endswith("_file") and k != "inventory_file":
                val = v[k]
                if isinstance(val, str) and val:
                    files.append(os.path.expanduser(val))
        if h in hosts:
            try:
                items = specdeploy_weights(v, h)
            except Exception as exc:  # noqa: BLE001 - preflight reports it; here it only means: no match
                weights.append(f"{h} invalid {exc}")
                continue
            for it in items:
                if it["source"] == "controller" and it["controller"]:
                    weights.append(f"{h} {it['kind']} {it['path']} {it['controller']} {tree_id(it['controller'])}")
                else:
                    weights.append(f"{h} {it['kind']} {it['source']} {it['path']} {it.get('shared') or ''}")
    extra = [str(e) for e in (context.CLIARGS.get("extra_vars") or ())]
    return inputs_digest(str(Path(playbook_dir).resolve().parent), os.path.dirname(specdeploy.__file__),
                         [str(s) for s in inventory_sources], extra, files, weights)


def specdeploy_converged_args(variables, host, group_names, playbook_dir, hostvars=None, hosts=None):
    """Arguments of the host-side converged check and record (managed roots, weight links, health URLs);
    ``hostvars`` and ``hosts`` (the engine group) tell a rank that serves no HTTP."""
    from pathlib import Path

    from specdeploy.hostscripts.converged import check_args, role_defaults
    engine = None
    if "specdeploy_engines" in group_names:
        try:
            _, hv = _validated(variables, host)
        except AnsibleFilterError as exc:  # preflight reports it; the host takes the full path
            return ["--reason", f"variables do not validate: {str(exc).strip().splitlines()[0]}"]
        links = [p for p in (hv.specdeploy_model_path, hv.specdeploy_drafter_path) if p]
        from specdeploy.plan.render.paths import unit_name
        try:
            rank = _rank(host, _ours(variables), hv, hostvars, hosts)
        except AnsibleFilterError as exc:
            return ["--reason", f"serving group does not resolve: {str(exc).strip().splitlines()[0]}"]
        engine = {"venv": hv.specdeploy_venv_path, "links": links, "exporter_port": hv.specdeploy_exporter_port,
                  "router_port": hv.specdeploy_router_port, "serves": rank.leader,
                  "unit": unit_name(hv.specdeploy_engine)}
    from specdeploy.values.hostpaths import expand
    defaults = role_defaults(str(Path(playbook_dir) / "roles"), resolve=expand)
    own = {k: _plain(variables[k]) for k in ("router_venv", "monitoring_prometheus_url", "inference_engine_state",
                                             "monitoring_prometheus_dir", "monitoring_grafana_provisioning_dir",
                                             "monitoring_grafana_dashboards_dir") if k in variables}
    return check_args(own, list(group_names), defaults, engine, host=host)
