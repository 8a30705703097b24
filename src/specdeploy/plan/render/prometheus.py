"""The Prometheus scrape config: engines, the specdeploy exporters, node exporter and DCGM exporter of every host."""
from __future__ import annotations

from specdeploy.plan.render.systemd import jinja_env

# Default listen ports of the host exporters the scrape config targets: Debian's prometheus-node-exporter
# (--web.listen-address ":9100") and NVIDIA's dcgm-exporter (-a ":9400"); sources in docs/monitoring.md.
NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400


def render_prometheus(targets: list[dict], rules_files: list[str] | None = None, scrape_interval: str = "15s") -> str:
    """Scrape config for engines, exporters, node exporter and DCGM exporter (a target's node_port and dcgm_port
    default to those exporters' own default ports)."""
    from specdeploy.values.peerhttp import url_host
    # an IPv6 address goes in brackets, the form Prometheus's ADDRESS:PORT targets take
    targets = [{"node_port": NODE_EXPORTER_PORT, "dcgm_port": DCGM_EXPORTER_PORT, **t,
                "address": url_host(t["address"])} for t in targets]
    return jinja_env().get_template("prometheus.yml.j2").render(
        targets=targets, rules_files=rules_files or [], scrape_interval=scrape_interval)
