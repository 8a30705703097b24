"""Monitoring and the GPU host as the roles configure them: the scrape config, rules, dashboard and Grafana
provisioning, the host checks' gather script and decisions, Docker's daemon.json and the ACS files."""
from __future__ import annotations

from specdeploy.deploy.inventory import plain, validated


def specdeploy_prometheus(targets, rules_files=None, scrape_interval="15s"):
    from specdeploy.plan.render.prometheus import render_prometheus
    return render_prometheus(plain(targets), plain(rules_files or []), scrape_interval)


def specdeploy_rules(_=None, **overrides):
    from specdeploy.speculation.monitoring import render_rules
    return render_rules(**overrides)


def specdeploy_dashboard(_=None):
    from specdeploy.speculation.monitoring import dashboard_json
    return dashboard_json()


def specdeploy_grafana(prometheus_url, kind, path=""):
    from specdeploy.speculation.monitoring import grafana_dashboard_provider, grafana_datasource
    return grafana_datasource(prometheus_url) if kind == "datasource" else grafana_dashboard_provider(path)


def specdeploy_gpg_key_check(colons, fingerprint):
    """'' when `gpg --show-keys --with-colons` output holds the pinned key, usable; else what is wrong."""
    from specdeploy.speculation.monitoring import gpg_key_problem
    return gpg_key_problem(str(colons), str(fingerprint))


def specdeploy_gather_script(_=None):
    """The read-only script that shows a GPU host as the host checks read it."""
    from specdeploy.gpuhost.report import gather_script
    return gather_script()


def specdeploy_host_check(variables, host, output, acs_disable=False):
    """What the gather script's output says about the host: facts, findings (lines), the install plan, and the
    decisions the gpu_host role applies (ACS, NCCL P2P, reboot)."""
    from specdeploy.gpuhost.report import host_decisions
    v, hv = validated(variables, host)
    return plain(host_decisions(host, hv, str(output), bool(acs_disable)))


def specdeploy_daemon_json(current):
    """/etc/docker/daemon.json with the NVIDIA runtime and the engine's ulimits merged in (differs: False when
    the file already says so)."""
    from specdeploy.gpuhost.install import docker_daemon_config
    return docker_daemon_config(current if isinstance(current, str) else None)


def specdeploy_acs_files(_=None):
    from specdeploy.gpuhost.install import ACS_SCRIPT, ACS_UNIT
    from specdeploy.values.hostpaths import host_path, unit_name
    return {"script": ACS_SCRIPT, "unit": ACS_UNIT, "script_path": host_path("acs_script"),
            "unit_path": host_path("acs_unit"), "unit_name": unit_name("acs")}


FILTERS = {name: fn for name, fn in dict(globals()).items() if name.startswith("specdeploy_") and callable(fn)}
