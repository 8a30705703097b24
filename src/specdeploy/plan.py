"""``specdeploy plan``: everything a deployment would install, for every engine host."""
from __future__ import annotations

from pathlib import Path

from . import inventory as inv_mod
from .render import HostPlan, prometheus_targets, render_host, render_prometheus


def plan(inventory: str, limit: str | None = None, extra: dict | None = None):
    inv = inv_mod.load(inventory, limit=limit, extra=extra)
    plans: list[tuple[str, str, HostPlan]] = []
    for h in inv.engine_hosts:
        plans.append((h.name, h.address, render_host(h.name, h.hv, h.address)))
    prom = render_prometheus(prometheus_targets(plans), rules_files=["/etc/prometheus/rules/specdeploy.rules.yml"])
    return inv, plans, prom


def write_out(out: Path, plans, prom: str) -> list[Path]:
    written = []
    for host, _, p in plans:
        for path, content in p.files.items():
            dest = out / host / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(content)
            written.append(dest)
    dest = out / "prometheus" / "prometheus.yml"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(prom)
    written.append(dest)
    return written
