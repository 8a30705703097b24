"""The engine hosts of an inventory as the front door reaches them: address, ports, unit, ssh command line."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass

from specdeploy.ops.progress import journal_lines


@dataclass
class Target:
    host: str
    address: str
    engine: str
    engine_port: int
    exporter_port: int
    unit: str
    ssh: list[str]
    group: str | None = None   # its serving group, when it shares one model instance with other hosts
    rank: int | None = None    # its rank there (0: the leader)
    leader: str | None = None  # the host that serves HTTP for the group (a rank that joins it serves none)
    weight_cache_unit: str | None = None  # its engine's weight-cache daemon's unit (whether or not it runs one)


def targets(inventory: str, limit: str | None = None, extra: dict | None = None,
            vault=None) -> tuple[list[Target], list[str]]:
    """Engine hosts with their ports and an ssh command line (from the same Ansible variables a play uses),
    and the monitoring hosts' addresses."""
    from specdeploy.hostvars.inventory import load
    return targets_of(load(inventory, limit=limit, extra=extra, vault=vault))


def targets_of(inv) -> tuple[list[Target], list[str]]:
    """:func:`targets` of an inventory already loaded (hostvars.inventory.Inventory)."""
    from specdeploy.hostvars.ssh import destination, ssh_options
    from specdeploy.plan.render.paths import unit_name
    from specdeploy.topology import inventory_ranks
    from specdeploy.values.hostpaths import unit_name as unit_name_of
    ranks = inventory_ranks(inv)
    out = []
    for h in inv.engine_hosts:
        v = h.vars
        ssh = ssh_options(v, connect_timeout=3) + [destination(h.name, dict(v, ansible_host=h.address))]
        r = ranks.get(h.name)
        grouped = r is not None and r.multi_host
        out.append(Target(h.name, h.address, h.hv.specdeploy_engine, h.hv.specdeploy_port,
                          h.hv.specdeploy_exporter_port, unit_name(h.hv.specdeploy_engine), ssh,
                          r.group if grouped else None, r.index if grouped else None,
                          r.hosts[0] if grouped else None,
                          unit_name_of("weight_cache", h.hv.specdeploy_engine)))
    mon = [str(inv.all_vars.get(m, {}).get("ansible_host", m)) for m in inv.monitoring_hosts]
    return out, mon


def forks_for(inv, limit_hosts: int | None = None) -> int:
    """How many hosts Ansible works on at once for a run over ``inv`` (hostvars.inventory.Inventory):
    ``specdeploy_forks`` where the inventory sets it, else the run's largest batch (as deploy.yml's rollout cuts
    it: specdeploy_serial, or rolling batches from specdeploy_rolling_from_hosts hosts on), at least 10 and at
    most 100. ``limit_hosts``: how many engine hosts the run touches (--limit)."""
    from specdeploy.topology import batch_sizes, inventory_ranks, rolling_batches
    hosts = inv.engine_hosts
    if not hosts:
        return 10
    hv = hosts[0].hv
    if hv.specdeploy_forks:
        return int(hv.specdeploy_forks)
    n = limit_hosts if limit_hosts is not None else len(hosts)
    if hv.specdeploy_serial not in (None, ""):
        sizes = batch_sizes(hv.specdeploy_serial, n) or [n]
    elif len(inv.group_hosts or hosts) >= hv.specdeploy_rolling_from_hosts:
        sizes = rolling_batches([h.name for h in hosts][:n], inventory_ranks(inv), hv.specdeploy_rolling_batch_percent)
    else:
        sizes = [n]
    return max(10, min(100, max(sizes or [n])))


def read_journal(t: Target, timeout: float = 8) -> list[tuple[float | None, str]] | None:
    try:
        r = subprocess.run(t.ssh + [f"journalctl -u {t.unit} -o short-unix --no-pager -n 3000"],
                           capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return journal_lines(r.stdout, t.unit) if r.returncode == 0 else None
