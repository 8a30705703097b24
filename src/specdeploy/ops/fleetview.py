"""What an operator reads of a fleet on one screen, however many hosts it has: the live view of a deploy (hosts per
phase and per result, the failures grouped by their triaged root cause, the slowest hosts) and the status of the
fleet (hosts per state, per serving group and per release, the hosts that need a look). Host names are listed as
Ansible ranges (values/hostranges); every list is bounded, and the rest is a count. Pure functions over the rows
that ops/runner.py and ops/status.py fill; the CLI draws them (cli/frontdoor.py)."""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

from specdeploy.ops.phases import PHASES
from specdeploy.values.hostranges import compact

ROWS_MAX = 24        # up to this many hosts the live view shows one row per host
FAILURES_MAX = 6     # distinct root causes listed; the rest counted
SLOWEST_MAX = 5


def phase_counts(rows) -> list[tuple[str, int]]:
    """(phase, hosts) for the hosts still on their way, in the deploy's order (waiting first)."""
    c = Counter(r.phase for r in rows if not r.result)
    order = ["waiting", *PHASES]
    return [(p, c[p]) for p in order if c[p]] + [(p, n) for p, n in c.items() if p not in order]


def result_counts(rows) -> list[tuple[str, int]]:
    c = Counter(r.result for r in rows if r.result)
    return [(k, c[k]) for k in ("ok", "failed", "unreachable", "not run") if c[k]]


def failure_key(row) -> str:
    """What groups failed hosts: their triaged root cause, else the task that failed and its first message line."""
    tr = row.triage or {}
    if tr.get("root_cause"):
        return str(tr["root_cause"])
    msg = (row.message or "").strip().splitlines()
    return f"{row.failed_task or row.result}: {msg[0][:160] if msg else 'no message'}"


def failures(rows, limit: int = FAILURES_MAX) -> dict[str, Any]:
    """Failed and unreachable hosts (and those a rescue may still recover: a failed task, no result yet), grouped
    by root cause, biggest group first: [{cause, fix, hosts, names}], and how many causes were left out."""
    bad = [r for r in rows if r.result in ("failed", "unreachable") or (r.failed_task and not r.result)]
    groups: dict[str, list] = {}
    for r in bad:
        groups.setdefault(failure_key(r), []).append(r)
    out = []
    for cause, rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        tr = rs[0].triage or {}
        out.append({"cause": cause, "fix": tr.get("fix") or "", "signature": tr.get("signature") or "",
                    "hosts": len(rs), "names": compact([r.host for r in rs]),
                    "final": all(r.result for r in rs)})
    return {"groups": out[:limit], "more_causes": max(0, len(out) - limit), "hosts": len(bad)}


def slowest(rows, now: float | None = None, limit: int = SLOWEST_MAX) -> list[dict[str, Any]]:
    """The hosts longest in their current phase among those still working (a hung load shows here first)."""
    now = time.time() if now is None else now
    busy = [r for r in rows if not r.result and r.phase != "waiting"]
    busy.sort(key=lambda r: r.phase_since)
    return [{"host": r.host, "phase": r.phase, "in_phase_s": max(0.0, now - r.phase_since),
             "progress": r.progress or r.task} for r in busy[:limit]]


def deploy_summary(rows, now: float | None = None) -> dict[str, Any]:
    rows = list(rows)
    return {"hosts": len(rows), "phases": phase_counts(rows), "results": result_counts(rows),
            "failures": failures(rows), "slowest": slowest(rows, now),
            "changed": sum(r.changed for r in rows)}


def status_summary(st: dict, limit: int = 8) -> dict[str, Any]:
    """A fleet's status (ops/status.fleet_status) per state, per serving group and per release, with the hosts
    that need a look (unreachable, engine down, a bad answer, a lost rank) grouped by what is wrong."""
    rows = st["hosts"]

    def state(r) -> str:
        if not r.get("reachable"):
            return "unreachable"
        if r.get("error"):
            return r.get("group_state") or "bad answer"
        return "up" if r.get("up") else "engine down"
    states = Counter(state(r) for r in rows)
    releases: dict[tuple, list[str]] = {}
    for r in rows:
        if state(r) == "up":
            key = (r.get("engine") or "?", r.get("version") or "", r.get("release") or "-",
                   r.get("speculation") or "?", r.get("spec_tokens") or "")
            releases.setdefault(key, []).append(r["host"])
    groups: dict[str, Counter] = {}
    for r in rows:
        if r.get("group"):
            groups.setdefault(r["group"], Counter())[state(r)] += 1
    broken = {g: c for g, c in groups.items() if set(c) != {"up"}}
    trouble: dict[str, list[str]] = {}
    for r in rows:
        s = state(r)
        if s != "up":
            reason = (r.get("error") or s).split(": ", 1)[-1] if r.get("error") else s
            trouble.setdefault(f"{s}: {reason[:140]}", []).append(r["host"])
    figures = {}
    for k in ("acceptance_length", "acceptance_rate", "tokens_per_s"):
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        if vals:
            figures[k] = {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals), "hosts": len(vals)}
    if figures.get("tokens_per_s"):
        figures["tokens_per_s"]["sum"] = sum(r["tokens_per_s"] for r in rows
                                             if isinstance(r.get("tokens_per_s"), (int, float)))
    return {"hosts": len(rows), "states": dict(states.most_common()),
            "releases": [{"engine": k[0], "version": k[1], "release": k[2], "speculation": k[3],
                          "spec_tokens": k[4], "hosts": len(v), "names": compact(v)}
                         for k, v in sorted(releases.items(), key=lambda kv: -len(kv[1]))][:limit],
            "more_releases": max(0, len(releases) - limit),
            "groups": len(groups), "groups_broken": [{"group": g, "states": dict(c)} for g, c in
                                                     sorted(broken.items())][:limit],
            "more_groups_broken": max(0, len(broken) - limit),
            "trouble": [{"what": k, "hosts": len(v), "names": compact(v)} for k, v in
                        sorted(trouble.items(), key=lambda kv: -len(kv[1]))][:limit],
            "more_trouble": max(0, len(trouble) - limit), "figures": figures}
