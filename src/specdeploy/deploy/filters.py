"""Every filter the playbooks and roles call, by name: Ansible's plugin (``ansible/filter_plugins/specdeploy.py``)
hands this table over as it is."""
from __future__ import annotations

from specdeploy.deploy import converged, groups, hostfacts, monitoring, release, weights


def _collect() -> dict:
    out: dict = {}
    for mod in (groups, release, monitoring, converged, hostfacts, weights):
        for name, fn in mod.FILTERS.items():
            if name in out and out[name] is not fn:
                raise ValueError(f"filter {name} is defined twice ({out[name].__module__}, {fn.__module__})")
            out[name] = fn
    return out


FILTERS = _collect()


class FilterModule:
    """What Ansible asks a filter plugin for."""

    def filters(self):
        return dict(FILTERS)
