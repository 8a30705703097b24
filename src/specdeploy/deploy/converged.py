"""The converged check of a no-op redeploy: one digest of the deploy's inputs (computed once per run on the
controller) and the arguments of the host-side check and record."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from specdeploy.deploy.inventory import ours, plain, rank_of, validated
from specdeploy.deploy.release import specdeploy_weights


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
            _, hv = validated(variables, host)
        except AnsibleFilterError as exc:  # preflight reports it; the host takes the full path
            return ["--reason", f"variables do not validate: {str(exc).strip().splitlines()[0]}"]
        links = [hv.specdeploy_model_path] + ([hv.specdeploy_drafter_path] if hv.uses_drafter else [])
        from specdeploy.plan.render.paths import unit_name
        try:
            rank = rank_of(host, ours(variables), hv, hostvars, hosts, variables)
        except AnsibleFilterError as exc:
            return ["--reason", f"serving group does not resolve: {str(exc).strip().splitlines()[0]}"]
        engine = {"venv": hv.specdeploy_venv_path, "links": links, "exporter_port": hv.specdeploy_exporter_port,
                  "router_port": hv.specdeploy_router_port, "serves": rank.leader,
                  "unit": unit_name(hv.specdeploy_engine)}
    from specdeploy.values.hostpaths import expand
    defaults = role_defaults(str(Path(playbook_dir) / "roles"), resolve=expand)
    own = {k: plain(variables[k]) for k in ("router_venv", "monitoring_prometheus_url", "inference_engine_state",
                                             "monitoring_prometheus_dir", "monitoring_grafana_provisioning_dir",
                                             "monitoring_grafana_dashboards_dir") if k in variables}
    return check_args(own, list(group_names), defaults, engine, host=host)


FILTERS = {"specdeploy_converged_script": specdeploy_converged_script,
           "specdeploy_inputs_digest": specdeploy_inputs_digest,
           "specdeploy_converged_args": specdeploy_converged_args}
