"""Ansible filters that call the specdeploy core, so a deploy renders exactly what ``specdeploy plan`` shows."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _plain(obj):
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, float)):
        return obj
    return str(obj)


def specdeploy_plan(variables, host, release="current"):
    """Validate a host's variables and return its plan: files (path -> content), argv, env, units."""
    from specdeploy.errors import SpecdeployError
    from specdeploy.render import render_host
    from specdeploy.schema import validate_host

    variables = _plain(dict(variables))
    try:
        hv = validate_host(host, variables)
    except SpecdeployError as exc:
        raise AnsibleFilterError("\n" + str(exc)) from None
    return render_host(host, hv, variables.get("ansible_host", host), release).to_dict()


def specdeploy_prometheus(targets, rules_files=None):
    from specdeploy.render import render_prometheus
    return render_prometheus(_plain(targets), _plain(rules_files or []))


class FilterModule:
    def filters(self):
        return {"specdeploy_plan": specdeploy_plan, "specdeploy_prometheus": specdeploy_prometheus}
