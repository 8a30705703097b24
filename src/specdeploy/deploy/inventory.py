"""Ansible's variables as the core reads them: plain Python values, the ``specdeploy_*`` variables validated into
``HostVars`` (an ``AnsibleFilterError`` naming the problems otherwise), and a host's rank in its serving group."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from specdeploy.values.errors import SpecdeployError


def plain(obj):
    """An Ansible value (lazy mappings, unsafe strings) as plain dicts, lists, strings and scalars."""
    if isinstance(obj, dict) or hasattr(obj, "keys"):
        return {str(k): plain(obj[k]) for k in obj.keys()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, float)):
        return obj
    return str(obj)


def ours(variables) -> dict:
    """The variables specdeploy reads of a host: its ``specdeploy_*`` ones and ``ansible_host``."""
    keys = [k for k in variables.keys() if k.startswith("specdeploy_") or k == "ansible_host"]
    return {k: plain(variables[k]) for k in keys}


def failing(fn):
    """Run ``fn()``; a SpecdeployError becomes the AnsibleFilterError Ansible shows (its findings, one a line)."""
    try:
        return fn()
    except SpecdeployError as exc:
        raise AnsibleFilterError("\n" + str(exc)) from None


def validated(variables, host, overrides=None):
    """(the host's variables, its HostVars); ``overrides`` (variables) apply on top of the inventory."""
    from specdeploy.hostvars.schema import validate_host
    v = ours(variables)
    v.update(plain(overrides or {}))
    return v, failing(lambda: validate_host(host, v))


def address(v: dict, host: str) -> str:
    return str(v.get("ansible_host", host))


def rank_of(host, v, hv, hostvars, hosts, variables=None):
    """The host's rank in its serving group, resolved from the group's hosts (``hosts``: the engine group, in
    inventory order) as ``specdeploy plan`` resolves it. ``variables`` (the host's Ansible variables): where they
    hold the deploy's serving groups (``deploy_groups``, computed once per run), only the hosts of the host's
    serving group are read (all of them: a pd group's instances move alone but are checked together); otherwise
    every engine host's group is (quadratic over a fleet when each host asks)."""
    from specdeploy.topology import Member, resolve
    members = []
    for h in _candidates(host, hv, hostvars, hosts, variables):
        if h == host:
            members.append(Member(host, address(v, host), hv))
        elif hv.specdeploy_group and plain(hostvars[h].get("specdeploy_group")) == hv.specdeploy_group:
            pv, phv = validated(hostvars[h], h)
            members.append(Member(h, address(pv, h), phv))
    return failing(lambda: resolve(members))[host]


def _candidates(host, hv, hostvars, hosts, variables) -> list:
    if hostvars is None or hosts is None or not hv.specdeploy_group:
        return [host]
    hosts = list(hosts)
    try:
        known = variables.get("deploy_groups") if variables is not None else None
        members = [str(m) for m in known[host]["members"]] if known is not None and host in known else None
    except (KeyError, TypeError, AttributeError):
        members = None
    if not members or host not in members:
        return hosts
    where = {h: i for i, h in enumerate(hosts)}
    return sorted((m for m in members if m in where), key=where.__getitem__)


def all_ranks(hostvars, hosts):
    """Every host of ``hosts`` validated, and the ranks of the serving groups among them."""
    from specdeploy.topology import Member, resolve
    members = []
    for h in hosts:
        v, hv = validated(hostvars[h], h)
        members.append(Member(h, address(v, h), hv))
    return members, failing(lambda: resolve(members))
