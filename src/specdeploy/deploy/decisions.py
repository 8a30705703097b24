"""What a deploy decides for a serving group, from facts its hosts set (``hostvars``): pure functions, so each
decision has one definition and unit tests instead of a Jinja chain per playbook. A mate that has not set a fact
(it is not in this batch, or failed before) takes the fact's default, as Ansible's ``default`` filter gives it."""
from __future__ import annotations

from collections.abc import Iterable, Mapping


def truthy(value) -> bool:
    """A fact as Ansible's ``bool`` filter reads it ('yes', 'true', '1', 'on', True)."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("yes", "y", "true", "t", "1", "on")


def fact(hostvars: Mapping, host: str, name: str, default: bool) -> bool:
    v = hostvars[host].get(name) if host in hostvars else None
    return default if v is None else truthy(v)


def any_mate(mates: Iterable[str], hostvars: Mapping, name: str, default: bool, but: str | None = None) -> bool:
    """Whether any mate (but ``but``) has the fact ``name`` true."""
    return any(fact(hostvars, m, name, default) for m in mates if m != but)


def group_converged(mates: Iterable[str], hostvars: Mapping) -> bool:
    """A serving group skips the deploy only as a whole: every rank matches its record
    (``deploy_self_converged``; a rank that did not check counts as changed)."""
    return all(fact(hostvars, m, "deploy_self_converged", False) for m in mates)


def drains(router: str, router_host: str, group: Mapping, mates: Iterable[str], hostvars: Mapping) -> bool:
    """Whether this host leaves the router while it changes: it serves behind a router that registers workers by
    API, and some rank of its group gets a new release (``deploy_changes``; unknown counts as changing)."""
    return (router != "none" and bool(router_host) and truthy(group.get("serves", True))
            and truthy(group.get("routed_by_api", True)) and any_mate(mates, hostvars, "deploy_changes", True))


def group_restart(mates: Iterable[str], hostvars: Mapping, host: str) -> dict[str, bool]:
    """A serving group restarts as one unit (its ranks cannot rejoin a running leader): ``restart`` when any rank's
    own engine restarts (``inference_engine_restart_self``; unknown counts as restarting), ``others`` when a rank
    other than ``host`` does (then ``host`` restarts, and rolls back, for them)."""
    mates = list(mates)
    return {"restart": any_mate(mates, hostvars, "inference_engine_restart_self", True),
            "others": any_mate(mates, hostvars, "inference_engine_restart_self", True, but=host)}


def rolls_back(previous: str, release: str, others_changed: bool) -> bool:
    """A failed start goes back to the previous release when there is one and it is another release, or when the
    group's other ranks changed (a rank whose release did not change restarts it for them)."""
    return bool(previous) and (previous != release or truthy(others_changed))


def mates_without(mates: Iterable[str], hostvars: Mapping, name: str) -> list[str]:
    """The mates whose fact ``name`` is not true (not set counts as not true)."""
    return [m for m in mates if not fact(hostvars, m, name, False)]
