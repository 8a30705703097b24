"""Serving groups as a deploy moves them: every engine host's group in one pass (``fleet_groups``, computed once
per play on the controller and read per host), the group of a stored release a rollback restarts, the group's root
cause, the rolling-batch checks, the scrape targets and the router's workers."""
from __future__ import annotations

from specdeploy.deploy import decisions
from specdeploy.deploy.inventory import all_ranks, failing, plain
from specdeploy.values.peerhttp import url_host


def fleet_groups(hostvars, hosts) -> dict[str, dict]:
    """Each host of ``hosts`` (the engine group) -> its serving group as the deploy moves it: its mates (rank order;
    the host alone when it serves alone), its leader and the leader's URL, whether it serves HTTP, whether the
    router registers it by API, and its start wave (0: ranks that join a leader, 1: hosts that serve). Every host
    is validated once: linear in the fleet."""
    from specdeploy.topology import mates, start_order
    members, ranks = all_ranks(hostvars, list(hosts))
    by_name = {m.name: m for m in members}
    by_group: dict[str, list[str]] = {}  # a serving group's hosts, in inventory order (a pd group: every instance)
    for m in members:
        if m.name in ranks:
            by_group.setdefault(ranks[m.name].group, []).append(m.name)
    out: dict[str, dict] = {}
    for m in members:
        group = mates(m.name, ranks)
        leader = by_name[group[0]]
        waves = start_order(group, ranks)
        r = ranks.get(m.name)
        out[m.name] = {
            "name": r.group if r is not None else m.name, "mates": group, "leader": leader.name,
            "members": by_group[r.group] if r is not None else [m.name],
            "url": f"http://{url_host(m.address)}:{m.hv.specdeploy_port}",  # as a router lists the worker
            "local_url": f"http://127.0.0.1:{m.hv.specdeploy_port}",  # as the host itself reaches its engine
            "leader_url": f"http://{url_host(leader.address)}:{leader.hv.specdeploy_port}",
            "serves": r is None or r.leader, "multi_host": len(group) > 1,
            # the router in PD mode registers its prefill and decode instances itself, from its command line
            "routed_by_api": r is None or r.layout != "pd",
            "wave": next(i for i, w in enumerate(waves) if m.name in w)}
    return out


def specdeploy_groups(hostvars, hosts):
    return fleet_groups(hostvars, hosts)


def specdeploy_group(hostvars, host, hosts):
    """One host's serving group (``fleet_groups``); a play computes them all once with ``specdeploy_groups``."""
    return fleet_groups(hostvars, hosts)[host]


def specdeploy_router(hostvars, routers, port):
    """The router a deploy drains through: its inventory host ('' when there is none) and its base URL."""
    routers = list(routers or [])
    if not routers:
        return {"host": "", "url": ""}
    host = routers[0]
    addr = plain(hostvars[host].get("ansible_host", host)) if host in hostvars else host
    return {"host": host, "url": f"http://{url_host(addr)}:{int(port)}"}


def specdeploy_release_group(release_plan, hostvars):
    """A stored release's serving group as a rollback restarts it (the group of that release, which may not be
    the inventory's now): whether the host served HTTP there, and its leader's URL when it did not."""
    p = plain(release_plan) or {}
    rank = p.get("rank") or {}
    hosts = list(rank.get("hosts") or [])
    multi = len(hosts) > 1 and rank.get("layout") in ("tp", "dp_ep")
    leader = rank.get("leader") or (hosts[0] if hosts else None)
    url = ""
    if multi and leader in hostvars:
        addr = url_host(plain(hostvars[leader].get("ansible_host", leader)))
        url = f"http://{addr}:{int((p.get('ports') or {}).get('engine') or 8000)}"
    return {"serves": bool(p.get("serves", True)) or not multi, "multi_host": multi, "leader_url": url}


def specdeploy_mates_without(mates, hostvars, fact):
    """The mates whose boolean ``fact`` is not true (not set counts as not true)."""
    return decisions.mates_without(list(mates), hostvars, str(fact))


def specdeploy_group_converged(mates, hostvars):
    """Every rank of the group matches its record (decisions.group_converged)."""
    return decisions.group_converged(list(mates), hostvars)


def specdeploy_drains(group, hostvars, router, router_host):
    """Whether the host leaves the router while its group changes (decisions.drains)."""
    g = plain(group)
    return decisions.drains(str(router), str(router_host or ""), g, g["mates"], hostvars)


def specdeploy_group_restart(group, hostvars, host):
    """{restart, others}: the group restarts as one unit (decisions.group_restart)."""
    return decisions.group_restart(plain(group)["mates"], hostvars, str(host))


def specdeploy_rolls_back(previous, release, others_changed=False):
    """Whether a failed start goes back to ``previous`` (decisions.rolls_back)."""
    return decisions.rolls_back(str(previous or ""), str(release or ""), others_changed)


def specdeploy_group_root(mates, hostvars, host):
    """A failed group's root cause from its ranks' triage (``inference_engine_triage`` on each): the first rank,
    in rank order, whose journal names one, with that rank; else what ``host``'s own unit said last."""
    from specdeploy.triage import group_root
    got = group_root([(m, plain(hostvars[m].get("inference_engine_triage")) or {}) for m in mates])
    if got is not None:
        m, t = got
        where = f"rank {list(mates).index(m)} ({m}): " if len(mates) > 1 else ""
        return f"{where}{t['root_cause']} ({t.get('fix') or 'no fix known'})"
    tail = plain(hostvars[host].get("inference_engine_tail")) or []
    return "no known root cause; the unit says: " + " | ".join(str(x) for x in tail)


def specdeploy_serial_problems(hostvars, hosts, serial, order):
    """Lines for a specdeploy_serial that would cut a serving group between batches of ``order`` (the play's
    hosts in order); empty when every batch holds whole groups."""
    from specdeploy.topology import serial_problems
    _, ranks = all_ranks(hostvars, list(hosts))
    return [str(f) for f in serial_problems(plain(serial), list(order), ranks)]


def specdeploy_batch_problems(hostvars, hosts, batch):
    """Lines for a rolling batch that splits a serving group (empty when every group in it is whole)."""
    from specdeploy.topology import batch_problems
    _, ranks = all_ranks(hostvars, list(hosts))
    return [str(f) for f in batch_problems(list(batch), ranks)]


def specdeploy_rollout(hostvars, hosts, order):
    """Once per deploy on the controller (a run_once fact): how the deploy play moves ``order`` (its hosts, in
    play order) through the fleet. ``serial``: ``specdeploy_serial`` as given, else rolling batches that keep
    serving groups whole (a canary group, then ``specdeploy_rolling_batch_percent`` of the hosts per batch) from
    ``specdeploy_rolling_from_hosts`` engine hosts on, else everything at once; ``max_fail_percentage``: the
    failure budget of a rolling batch (100 when nothing rolls); ``problems``: lines for batches that would cut a
    serving group. The settings are fleet-wide; they are read from the first host of ``order``, and hosts that
    disagree are named."""
    from specdeploy.topology import rolling_batches, serial_problems
    members, ranks = all_ranks(hostvars, list(hosts))
    order = [str(h) for h in order]
    by_name = {m.name: m for m in members}
    first = next((by_name[h] for h in order if h in by_name), None)
    if first is None:
        return {"serial": "100%", "max_fail_percentage": 100, "problems": [], "batches": [], "rolling": False}
    hv = first.hv
    keys = ("specdeploy_serial", "specdeploy_rolling_from_hosts", "specdeploy_rolling_batch_percent",
            "specdeploy_max_fail_percentage")
    mine = {k: getattr(hv, k) for k in keys}
    problems = [f"{m.name}: {k} is {getattr(m.hv, k)!r}, the deploy's first host {first.name} has {mine[k]!r}: "
                f"a fleet-wide setting, the deploy uses {first.name}'s (set it in group_vars)"
                for m in members if m.name in set(order) for k in keys if getattr(m.hv, k) != mine[k]][:8]
    if hv.specdeploy_serial not in (None, ""):
        serial, rolling = hv.specdeploy_serial, str(hv.specdeploy_serial) != "100%"
        problems += [str(f) for f in serial_problems(serial, order, ranks)]
    elif len(members) >= hv.specdeploy_rolling_from_hosts:
        serial, rolling = rolling_batches(order, ranks, hv.specdeploy_rolling_batch_percent), True
    else:
        serial, rolling = "100%", False
    from specdeploy.topology.rollout import batch_sizes
    return {"serial": serial, "max_fail_percentage": hv.specdeploy_max_fail_percentage if rolling else 100,
            "problems": problems, "batches": batch_sizes(serial, len(order)) or [], "rolling": rolling}


def specdeploy_targets(hostvars, hosts):
    """Scrape targets for the engine hosts, from their validated variables, each labelled with its serving group;
    the ranks of a serving group that serve no HTTP (its headless ranks) have no engine or exporter target."""
    members, ranks = all_ranks(hostvars, list(hosts))
    out = []
    for m in members:
        r = ranks.get(m.name)
        out.append({"host": m.name, "address": m.address, "engine": m.hv.specdeploy_engine,
                    "engine_port": m.hv.specdeploy_port, "exporter_port": m.hv.specdeploy_exporter_port,
                    "serves": r is None or r.leader,
                    # a host that serves alone is its own serving group: the dashboard aggregates per group
                    "group": r.group if r is not None else m.name})
    return out


def specdeploy_router_unit(hostvars, hosts, router_port, venv):
    """The router's unit over the engine hosts that serve: each group's leader, or in PD mode its prefill and
    decode instances (topology.router_workers)."""
    from specdeploy.plan.render.systemd import render_router
    from specdeploy.topology import router_workers
    members, ranks = all_ranks(hostvars, list(hosts))
    w = failing(lambda: router_workers(members, ranks))
    return render_router(w.get("workers", []), int(router_port), venv, prefill=w.get("prefill"),
                         decode=w.get("decode"))


FILTERS = {name: fn for name, fn in dict(globals()).items() if name.startswith("specdeploy_") and callable(fn)}
