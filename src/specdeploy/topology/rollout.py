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
    inside = set(batch)
    for h in batch:
        group = mates(h, ranks)
        missing = [m for m in group if m not in inside]
        key = tuple(group)
        if missing and key not in seen:
            seen.add(key)
            held = ", ".join(m for m in group if m in inside)
            out.append(Finding("error", "specdeploy_serial", f"this batch holds {held} of serving group "
                               f"{ranks[h].group} but not {', '.join(missing)}: a group deploys and rolls back as "
                               "one unit", f"set specdeploy_serial to a multiple of the group's "
                               f"{len(group)} hosts and list each group's hosts next to each other in the inventory "
                               "(or leave --limit out of a group)", h))
    return out


def batch_sizes(serial, total: int) -> list[int] | None:
    """The batch sizes Ansible cuts ``total`` play hosts into for a ``serial`` of a count, a percentage (of the
    play's hosts, rounded down, at least 1) or a list of them (the last one repeats); None for a malformed value
    (the schema reports it)."""
    if total <= 0:
        return []
    values = serial if isinstance(serial, (list, tuple)) else [serial]
    if not values:
        return [total]
    sizes: list[int] = []
    i = left = 0
    left = total
    while left > 0:
        v = values[min(i, len(values) - 1)]
        s = str(v).strip()
        try:
            n = int(int(s[:-1]) / 100.0 * total) if s.endswith("%") else int(s)
        except ValueError:
            return None
        n = max(1, n) if n >= 0 else total
        n = min(n, left)
        sizes.append(n)
        left -= n
        i += 1
        if len(sizes) > 100000:
            return None
    return sizes


def serial_problems(serial, order: list[str], ranks: dict[str, Rank]) -> list[Finding]:
    """Whether ``specdeploy_serial`` (hosts per batch, as Ansible's serial: a count, a percentage or a list of
    them) cuts ``order`` (the engine hosts in play order) only between serving groups."""
    if serial in (None, "", "100%"):
        return []
    sizes = batch_sizes(serial, len(order))
    if not sizes:
        return []
    out: list[Finding] = []
    cut: set[str] = set()
    start = 0
    for n in sizes:
        for f in batch_problems(order[start:start + n], ranks):
            group = ranks[f.host].group
            if group not in cut:  # one finding per group, from the first batch that cuts it
                cut.add(group)
                out.append(f)
        start += n
    return out


def rolling_batches(order: list[str], ranks: dict[str, Rank], percent: int, canary: int = 1) -> list[int]:
    """Batch sizes for a rolling deploy of ``order`` (the play's hosts, in order) that never cut a serving group:
    first ``canary`` serving groups alone (a release that fails there stops the deploy before it reaches the
    fleet), then batches of about ``percent`` of the hosts, each extended to the end of the group its last host
    belongs to. An Ansible ``serial`` list: the play uses it as it is."""
    step = max(1, int(len(order) * percent / 100))
    sizes: list[int] = []
    i, groups_done = 0, 0
    while i < len(order):
        target = 1 if groups_done < canary else step
        j = i
        while j < len(order) and (j - i < target or _same_group(order[j - 1], order[j], ranks)):
            j += 1
        sizes.append(j - i)
        groups_done += 1
        i = j
    return sizes


def _same_group(a: str, b: str, ranks: dict[str, Rank]) -> bool:
    ra, rb = ranks.get(a), ranks.get(b)
    return ra is not None and rb is not None and ra.multi_host and rb.multi_host and ra.group == rb.group
