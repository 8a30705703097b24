"""``specdeploy plan``: everything a deployment would install, for every engine host."""
from __future__ import annotations

from pathlib import Path

from . import inventory as inv_mod
from .errors import Finding, SpecdeployError
from .render import HostPlan, prometheus_targets, render_host, render_prometheus


def plan(inventory: str, limit: str | None = None, extra: dict | None = None):
    inv = inv_mod.load(inventory, limit=limit, extra=extra)
    plans: list[tuple[str, str, HostPlan]] = []
    for h in inv.engine_hosts:
        plans.append((h.name, h.address, render_host(h.name, h.hv, h.address)))
    prom = render_prometheus(prometheus_targets(plans), rules_files=["/etc/prometheus/rules/specdeploy.rules.yml"])
    return inv, plans, prom


def write_out(out: Path, plans, prom: str) -> list[Path]:
    files = [(out / host / path.lstrip("/"), content) for host, _, p in plans for path, content in p.files.items()]
    files.append((out / "prometheus" / "prometheus.yml", prom))
    for dest, content in files:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(content)
        except OSError as exc:
            raise SpecdeployError([Finding("error", "--out", f"cannot write {dest}: {exc.strerror or exc}",
                                           "give a writable directory")]) from None
    return [dest for dest, _ in files]
