"""Serving groups from an inventory: which hosts serve one model instance together, each host's rank, and the
group-level checks (its hosts agree, it has the size and the fabric its layout needs).

A group is the engine hosts with the same ``specdeploy_group``; its ranks follow the hosts' order in the
inventory (the order ``groups['specdeploy_engines']`` gives in Ansible), rank 0 being the leader. A host with
``specdeploy_topology: single`` and no group is a group of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.values.topology import LAYOUT_TEXT, Rank

# What every host of a group must give alike: one engine, one release, one model, one rendezvous.
AGREE = ("specdeploy_topology", "specdeploy_engine", "specdeploy_engine_version", "specdeploy_engine_patches",
         "specdeploy_runtime", "specdeploy_image", "specdeploy_hardware", "specdeploy_model_path",
         "specdeploy_served_model_name", "specdeploy_tensor_parallel_size", "specdeploy_dist_port",
         "specdeploy_kv_transfer", "specdeploy_port", "specdeploy_max_model_len", "specdeploy_trust_remote_code",
         "specdeploy_load_format", "specdeploy_engine_extra_args")
# Within one engine (tp, dp_ep), speculation is one engine setting too; in pd each instance could differ, but the
# decode side is the one that drafts, so the group agrees there as well.
AGREE_SPEC = ("specdeploy_spec_enabled", "specdeploy_spec_method", "specdeploy_spec_num_tokens",
              "specdeploy_drafter_path", "specdeploy_spec_config_extra")


@dataclass(frozen=True)
class Member:
    name: str
    address: str    # ansible_host
    hv: Any         # HostVars


def group_name(m: Member) -> str:
    return m.hv.specdeploy_group or m.name


def groups(members: list[Member]) -> dict[str, list[Member]]:
    """Group name -> its members in inventory order."""
    out: dict[str, list[Member]] = {}
    for m in members:
        out.setdefault(group_name(m), []).append(m)
    return out


def _dist_address(m: Member) -> str:
    return m.hv.specdeploy_dist_address or m.address


def _value(hv, key):
    v = getattr(hv, key)
    return v.model_dump() if hasattr(v, "model_dump") else v


def group_problems(name: str, members: list[Member]) -> list[Finding]:
    out: list[Finding] = []
    first = members[0]
    layout = first.hv.specdeploy_topology
    field_of = f"specdeploy_group {name}"
    hosts = ", ".join(m.name for m in members)
    for key in AGREE + AGREE_SPEC:
        values = {m.name: _value(m.hv, key) for m in members}
        if len({repr(v) for v in values.values()}) > 1:
            shown = "; ".join(f"{h}: {v!r}" for h, v in values.items())
            out.append(Finding("error", key, f"the hosts of serving group {name} disagree ({shown}): they serve "
                               "one model instance together", f"give {key} one value for the group, in its "
                               "group_vars", first.name))
    if out:
        return out
    if layout == "single":
        if len(members) > 1:
            out.append(Finding("error", field_of, f"hosts {hosts} share a group but specdeploy_topology is single "
                               "(one whole model copy per host)", "give each host its own group name, or pick a "
                               "multi-host layout: " + ", ".join(f"{k} ({v})" for k, v in LAYOUT_TEXT.items()
                                                                  if k != "single"), first.name))
        return out
    if layout in ("tp", "dp_ep") and len(members) < 2:
        out.append(Finding("error", field_of, f"has one host ({hosts}); specdeploy_topology {layout} spans the "
                           "group's hosts", "add the instance's other hosts to the group, or set "
                           "specdeploy_topology: single", first.name))
    if layout == "pd":
        roles = {r: [m.name for m in members if m.hv.specdeploy_pd_role == r] for r in ("prefill", "decode")}
        for role, names in roles.items():
            if not names:
                out.append(Finding("error", field_of, f"has no {role} host ({hosts}): the router sends each "
                                   "request through a prefill and then a decode instance",
                                   f"give at least one host of the group specdeploy_pd_role: {role}", first.name))
        if first.hv.specdeploy_router == "none":
            out.append(Finding("error", "specdeploy_router", f"serving group {name} is pd, which only a router in "
                               "PD mode can serve (it pairs a prefill and a decode instance per request)",
                               "set specdeploy_router: sglang-router for the group", first.name))
    cross_fabric = layout == "tp" and len(members) > 1 or layout == "pd"
    no_rdma = [m.name for m in members if not m.hv.rdma]
    if cross_fabric and no_rdma:
        what = ("every layer's all-reduce crosses the hosts, and without RDMA NCCL carries it over TCP sockets"
                if layout == "tp" else
                "each request's KV cache moves from the prefill to the decode host; NIXL and Mooncake move it over "
                "RDMA")
        out.append(Finding("error", "specdeploy_topology", f"serving group {name} is {layout} across hosts without "
                           f"RDMA ({', '.join(no_rdma)}, hardware profile {first.hv.specdeploy_hardware}): {what}",
                           "use specdeploy_topology: dp_ep or single on these hosts, or set specdeploy_rdma: true "
                           "where they carry InfiniBand or RoCE NICs (preflight --hosts checks the devices)",
                           no_rdma[0]))
    return out


def resolve(members: list[Member]) -> dict[str, Rank]:
    """Host -> its rank, for every member; raises SpecdeployError with every group's problems."""
    problems: list[Finding] = []
    out: dict[str, Rank] = {}
    for name, ms in groups(members).items():
        found = group_problems(name, ms)
        problems += found
        if found:
            continue
        hosts = tuple(m.name for m in ms)
        lead = ms[0]
        for i, m in enumerate(ms):
            hv = m.hv
            out[m.name] = Rank(
                layout=hv.specdeploy_topology, group=name, index=0 if hv.specdeploy_topology == "pd" else i,
                hosts=hosts if hv.specdeploy_topology != "pd" else (m.name,),
                leader_address=_dist_address(lead if hv.specdeploy_topology != "pd" else m),
                address=_dist_address(m), port=hv.specdeploy_dist_port, gpus=hv.profile().gpu_count,
                tp_per_dp=hv.specdeploy_tensor_parallel_size or 1, role=hv.specdeploy_pd_role,
                interface=hv.specdeploy_dist_interface, pd_port=hv.specdeploy_pd_port,
                transfer=hv.specdeploy_kv_transfer,
                addresses=tuple(_dist_address(x) for x in ms) if hv.specdeploy_topology != "pd" else ())
    if problems:
        raise SpecdeployError(problems)
    return out


def check_members(members: list[Member], names: list[str] | set[str]) -> tuple[dict[str, Rank], list[Finding]]:
    """(host -> rank, the group-level findings) over the serving groups of the hosts ``names`` (their group-mates
    among ``members`` included), and, where a router fronts the inventory, what it could not front: the checks
    plan and deploy make, as findings, for preflight to report per host. ``members``: every engine host of the
    inventory that validates."""
    wanted = {group_name(m) for m in members if m.name in names}
    selected = [m for m in members if group_name(m) in wanted]
    findings: list[Finding] = []
    ok: list[Member] = []
    for gname, ms in groups(selected).items():
        found = group_problems(gname, ms)
        findings += found
        if not found:
            ok += ms
    ranks = resolve(ok)
    if any(m.hv.specdeploy_router != "none" for m in members):
        whole = [m for name, ms in groups(members).items() if not group_problems(name, ms) for m in ms]
        try:
            router_workers(whole, resolve(whole))
        except SpecdeployError as exc:
            findings += [f for f in exc.problems if f.host in names or not f.host]
    return ranks, findings


def pd_instances(members: list[Member], ranks: dict[str, Rank]) -> dict[str, dict[str, list[Member]]]:
    """pd group -> {"prefill": [...], "decode": [...]} (the router's two lists)."""
    out: dict[str, dict[str, list[Member]]] = {}
    for m in members:
        r = ranks.get(m.name)
        if r is not None and r.layout == "pd":
            out.setdefault(r.group, {"prefill": [], "decode": []})[r.role].append(m)
    return out


def inventory_ranks(inv) -> dict[str, Rank]:
    """Host -> rank for every engine host of a loaded inventory (hostvars.inventory.Inventory) and its group-mates."""
    return resolve([Member(h.name, h.address, h.hv) for h in inv.group_hosts or inv.engine_hosts])


def router_workers(members: list[Member], ranks: dict[str, Rank]) -> dict:
    """What the router fronts: ``{"workers": [url, ...]}`` (every serving leader), or in PD mode
    ``{"prefill": [(url, bootstrap_port), ...], "decode": [url, ...]}``. One router runs one mode, so an inventory
    that mixes pd groups with others is refused."""
    def url(m: Member) -> str:
        host = m.address if ":" not in m.address or m.address.startswith("[") else f"[{m.address}]"
        return f"http://{host}:{m.hv.specdeploy_port}"
    pd = [m for m in members if ranks[m.name].layout == "pd"]
    other = [m for m in members if ranks[m.name].layout != "pd" and ranks[m.name].leader]
    if pd and other:
        pd_groups = ", ".join(sorted({ranks[m.name].group for m in pd}))
        raise SpecdeployError([Finding(
            "error", "specdeploy_topology", f"the router would front pd groups ({pd_groups}) "
            f"and whole instances ({', '.join(m.name for m in other)}); sglang-router runs in PD mode or not",
            "serve one kind of group behind a router (a second router for the other is not built yet)",
            pd[0].name)])
    if pd:
        return {"prefill": [(url(m), m.hv.specdeploy_pd_port) for m in pd if m.hv.specdeploy_pd_role == "prefill"],
                "decode": [url(m) for m in pd if m.hv.specdeploy_pd_role == "decode"]}
    return {"workers": [url(m) for m in other]}
