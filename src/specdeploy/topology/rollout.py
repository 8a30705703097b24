"""A serving group deploys, rolls and rolls back as one unit: which hosts move together, whether a rolling batch
keeps each group whole, and which ranks start first."""
from __future__ import annotations

from specdeploy.values.errors import Finding
from specdeploy.values.topology import Rank


def mates(host: str, ranks: dict[str, Rank]) -> list[str]:
    """The hosts that move with ``host``, in rank order (the host alone when it serves alone)."""
    r = ranks.get(host)
    return list(r.hosts) if r is not None and r.multi_host else [host]


def start_order(hosts: list[str], ranks: dict[str, Rank]) -> list[list[str]]:
    """Start waves: the ranks that join a leader first, then the hosts that serve (leaders and single hosts). Both
    engines' leaders wait for their ranks, and the ranks retry until the leader listens, so the order only saves
    the leader's wait; it is the order the engines' multi-node guides give."""
    first = [h for h in hosts if h in ranks and ranks[h].multi_host and not ranks[h].leader]
    return [w for w in (first, [h for h in hosts if h not in first]) if w]


def batch_problems(batch: list[str], ranks: dict[str, Rank]) -> list[Finding]:
    """A rolling batch that holds part of a serving group: the group cannot restart half (its leader would wait
    for ranks that still run the old release)."""
    out, seen = [], set()
    for h in batch:
        group = mates(h, ranks)
        missing = [m for m in group if m not in batch]
        key = tuple(group)
        if missing and key not in seen:
            seen.add(key)
            held = ", ".join(m for m in group if m in batch)
            out.append(Finding("error", "specdeploy_serial", f"this batch holds {held} of serving group "
                               f"{ranks[h].group} but not {', '.join(missing)}: a group deploys and rolls back as "
                               "one unit", f"set specdeploy_serial to a multiple of the group's "
                               f"{len(group)} hosts and list each group's hosts next to each other in the inventory "
                               "(or leave --limit out of a group)", h))
    return out


def serial_problems(serial, order: list[str], ranks: dict[str, Rank]) -> list[Finding]:
    """Whether ``specdeploy_serial`` (hosts per batch, as Ansible's serial: a count or a percentage) cuts
    ``order`` (the engine hosts in play order) only between serving groups."""
    if serial in (None, "", "100%"):
        return []
    s = str(serial).strip()
    try:
        n = max(1, int(len(order) * float(s[:-1]) / 100)) if s.endswith("%") else int(s)
    except ValueError:
        return []  # the schema reports a malformed value
    if n <= 0:
        return []
    out: list[Finding] = []
    cut: set[str] = set()
    for i in range(0, len(order), n):
        for f in batch_problems(order[i:i + n], ranks):
            group = ranks[f.host].group
            if group not in cut:  # one finding per group, from the first batch that cuts it
                cut.add(group)
                out.append(f)
    return out
