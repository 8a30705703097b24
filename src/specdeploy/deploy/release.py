"""A host's release as the roles install it: its plan (the same ``render_host`` as ``specdeploy plan``), its
secrets, image, probe, gate verdict and weights, and what the roles need to know of the host (paths, units, how to
run a host script)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from specdeploy.deploy.inventory import failing, ours, plain, rank_of, validated


def specdeploy_plan(variables, host, overrides=None, hostvars=None, hosts=None):
    """A host's plan: files (path -> content), argv, env, units, health paths, release id. ``overrides``
    (variables) are applied on top of the inventory, e.g. by the speculation gate. ``hostvars`` and ``hosts`` (the
    engine group) give a host of a multi-host serving group its rank."""
    from pathlib import Path

    from specdeploy.plan import render_host
    v, hv = validated(variables, host, overrides)
    base = variables.get("inventory_dir") if hasattr(variables, "get") else None  # Ansible's, for a relative copy
    return failing(lambda: render_host(host, hv, v.get("ansible_host", host),
                                       rank_of(host, v, hv, hostvars, hosts, variables),
                                       Path(str(base)) if base else None).to_dict())


def specdeploy_secret_files(variables, host, key=""):
    """Path -> content of the 0600 files that carry the API key ``key`` to this host's engine, in its adapter's
    form; empty without specdeploy_api_key_file."""
    from specdeploy.plan import secret_files
    _, hv = validated(variables, host)
    return failing(lambda: secret_files(hv, key))


def specdeploy_profile(variables, host):
    from dataclasses import asdict
    _, hv = validated(variables, host)
    return asdict(hv.profile())


def specdeploy_preflight(variables, host, inventory_dir=None):
    from pathlib import Path
    from specdeploy.checks.preflight import preflight_host
    rep = preflight_host(host, ours(variables), Path(inventory_dir) if inventory_dir else None)
    out = rep.to_dict()
    out["lines"] = [f.line() for f in rep.findings if f.severity != "info"]
    return out


def specdeploy_triage(text):
    from specdeploy.triage import triage_lines
    lines = text.splitlines() if isinstance(text, str) else list(text)
    return triage_lines(lines).to_dict()


def specdeploy_image(variables, host, source="unknown"):
    """How to build the host's engine image (tag, Dockerfile, build args; the sandbox's stand-in base)."""
    _, hv = validated(variables, host)
    from specdeploy.plan.images import build_plan
    return build_plan(hv.specdeploy_engine, hv.specdeploy_engine_version, hv.specdeploy_engine_patches,
                      hv.specdeploy_sandbox, hv.specdeploy_image, str(source))


def specdeploy_tool_container(variables, host, name, args, rw_mounts=(), module=True):
    """A command in the engine's environment (same image, GPUs, mounts, ulimits as the engine unit)."""
    _, hv = validated(variables, host)
    from specdeploy.plan.render.runtime import tool_container
    return tool_container(hv, str(name), [str(a) for a in args], tuple(str(m) for m in rw_mounts), bool(module))


def specdeploy_gate_verdict(report, variables=None, host=None):
    """The inventory overrides that apply a gate report's verdict; with the host's variables, a k per load band
    where its engine release takes one."""
    from specdeploy.engines import get_adapter
    from specdeploy.speculation.gate import verdict_overrides
    per_batch = False
    if variables is not None:
        _, hv = validated(variables, host)
        per_batch = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version).takes_k_by_batch()
    return verdict_overrides(plain(report), per_batch)


def specdeploy_gate_argv(settings, out, baseline=None, surface=None):
    """The ``specdeploy gate`` arguments of the gate role's baseline (no ``baseline``) or speculative run;
    ``surface``: the price measured on the host, fetched to the controller ('' where it has none)."""
    from specdeploy.speculation.gate import command_line
    return command_line(plain(settings), str(out), None if baseline is None else str(baseline),
                        str(surface) if surface else None)


def specdeploy_gate_vars_file(inventory_dir, host, writing=True):
    """The inventory file that holds a host's gate verdict (the variables that apply it); ``writing``: refused
    where a directory there would hide the host's host_vars file."""
    from specdeploy.hostvars.varsfile import gate_vars_file
    try:
        return gate_vars_file(str(inventory_dir), str(host), bool(writing))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def specdeploy_host_vars_file(inventory_dir, host, name):
    """A specdeploy file in a host's host_vars directory of the inventory (e.g. specdeploy_nccl.yml)."""
    from specdeploy.hostvars.varsfile import host_vars_file
    try:
        return host_vars_file(str(inventory_dir), str(host), str(name))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def specdeploy_nccl_key(parts):
    """The NCCL sweep's cache key on a host (hardware profile, driver, NCCL version) as one path component."""
    import re
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(str(p).strip() for p in plain(list(parts)))) or "unknown"


def specdeploy_probe_job(variables, host, probe_dir, overrides=None, hostvars=None, hosts=None):
    """The engine probe the deploy runs before the engine restarts onto this host's new release: the script, its
    job (the release's own command line, this rank's in a serving group) and how to run it in the release's image
    or venv (checks/probe.py)."""
    from ansible.utils.unsafe_proxy import wrap_var
    from specdeploy.checks.probe import host_job
    v, hv = validated(variables, host, overrides)
    job = host_job(hv, str(probe_dir), str(host), v.get("ansible_host", host),
                   rank_of(host, v, hv, hostvars, hosts, variables))
    # the script and the job are data for the host, never templates (Python may hold '{{' or '{%')
    return {**job, "script": wrap_var(job["script"]), "job": wrap_var(job["job"])}


def specdeploy_probe_result(variables, host, stdout, stderr="", rc=None, doctor="", overrides=None):
    """The probe run's errors (they stop the deploy), warnings (it could not run) and notes."""
    from specdeploy.checks.probe import host_result
    _, hv = validated(variables, host, overrides)
    return host_result(hv, str(stdout or ""), str(stderr or ""), rc, str(doctor or ""))


def specdeploy_weights(variables, host, content_ids=False):
    """The checkpoints a host serves, each with its source mode and paths (HostVars.weights), the host paths of its
    verification stamp and copy progress, and with ``content_ids`` the content id of a controller copy (names,
    sizes, mtimes) and where that copy lives in the host's store."""
    from pathlib import Path

    from specdeploy.hostscripts.staging import COMPLETE, store_of, tree_id
    from specdeploy.values.hostpaths import host_path
    v, hv = validated(variables, host)
    items = hv.weights()
    base = variables.get("inventory_dir")
    for it in items:  # controller paths relative to the inventory, as preflight reads them
        if it["controller"] and base and not Path(it["controller"]).is_absolute():
            it["controller"] = str(Path(str(base)) / it["controller"])
        it["stamp"] = host_path("verified_stamp", it["kind"])
        it["progress"] = host_path("staging_progress", it["kind"])
        if content_ids and it["source"] == "controller" and it["controller"]:
            it["id"] = cid = tree_id(it["controller"])
            store = store_of(it["path"])  # where staging keeps that copy: finished, in progress, marked complete
            it.update(copy=str(store / cid), partial=str(store / f"{cid}.partial"),
                      complete=str(store / cid / COMPLETE))
    return items


def specdeploy_path(name, *parts):
    """A host path of specdeploy's (values/hostpaths.py): ``'state' | specdeploy_path``; one with parts that vary,
    each checked to be one path component: ``'release' | specdeploy_path(release_id)``."""
    from specdeploy.values.hostpaths import host_path
    try:
        return host_path(str(name), *(plain(p) for p in parts))
    except (KeyError, ValueError) as exc:
        raise AnsibleFilterError(str(exc).strip("'\"")) from None


def specdeploy_venv(venv, rel):
    """A file of ours inside a Python environment: ``specdeploy_venv_path | specdeploy_venv('bin/specdeploy')``."""
    from specdeploy.values.hostpaths import in_venv
    try:
        return in_venv(str(venv), str(rel))
    except KeyError as exc:
        raise AnsibleFilterError(str(exc).strip("'\"")) from None


def specdeploy_unit(component, engine=None):
    """A unit of specdeploy's (values/hostpaths.py): ``'exporter' | specdeploy_unit``, ``'engine' |
    specdeploy_unit(specdeploy_engine)``; ``'engines' | specdeploy_unit`` lists every engine's unit."""
    from specdeploy.engines import names
    from specdeploy.values.hostpaths import unit_name
    try:
        if component == "engines":
            return [unit_name("engine", e) for e in names()]
        return unit_name(str(component), None if engine is None else str(engine))
    except (KeyError, ValueError) as exc:
        raise AnsibleFilterError(str(exc).strip("'\"")) from None


def specdeploy_host(variables, host):
    """What the roles need to know of a host, decided by the core (deploy/hostfacts.py): its engine and release,
    whether it serves a drafter, and the paths and units of both."""
    from specdeploy.deploy.hostfacts import host_facts
    return host_facts(validated(variables, host)[1])


def specdeploy_host_script(name, args=()):
    """How every role runs a stdlib-only host script (staging, converged) with the host's own python3, before or
    after anything is installed: ``argv`` after the interpreter, and the script to feed on stdin."""
    from specdeploy.deploy.hostfacts import host_script
    try:
        return host_script(str(name), [str(a) for a in plain(list(args))])
    except KeyError as exc:
        raise AnsibleFilterError(str(exc).strip("'\"")) from None


def specdeploy_ssh(variables):
    """The ssh command (no destination) to a host from its connection variables, as one string for rsync -e."""
    import shlex

    from specdeploy.hostvars.ssh import ssh_options
    keys = ("ansible_port", "ansible_ssh_private_key_file", "ansible_ssh_common_args", "ansible_ssh_extra_args")
    return shlex.join(ssh_options({k: plain(variables[k]) for k in keys if k in variables}))


def specdeploy_tree_id(path):
    """Content id of a controller directory from names, sizes and mtimes (no weights are read)."""
    from specdeploy.hostscripts.staging import tree_id
    return tree_id(path)


def specdeploy_stage_log(host, kind):
    """Controller-side log of a `controller` copy's rsync progress (read by `specdeploy deploy`)."""
    from specdeploy.ops.copy import controller_log
    return str(controller_log(host, kind))


FILTERS = {name: fn for name, fn in dict(globals()).items() if name.startswith("specdeploy_") and callable(fn)}
