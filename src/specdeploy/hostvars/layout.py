"""The host-local checks of the serving layout (``specdeploy_topology`` and the variables that go with it). What
needs the whole group (its size, that its hosts agree) is checked in ``topology/``."""
from __future__ import annotations

import re

from specdeploy.values.errors import Finding

_ADDRESS = re.compile(r"[A-Za-z0-9._:%\[\]-]+")


def layout_problems(host: str, hv) -> list[Finding]:
    out: list[Finding] = []
    layout = hv.specdeploy_topology
    gpus = hv.profile().gpu_count
    if layout != "single" and not hv.specdeploy_group:
        out.append(Finding("error", "specdeploy_group", f"specdeploy_topology is {layout} but the host names no "
                           "serving group", "set specdeploy_group in the group_vars of the Ansible group that lists "
                           "the instance's hosts", host))
    if layout == "pd" and not hv.specdeploy_pd_role:
        out.append(Finding("error", "specdeploy_pd_role", "specdeploy_topology is pd but the host is neither "
                           "prefill nor decode", "set specdeploy_pd_role: prefill or decode", host))
    if layout != "pd" and hv.specdeploy_pd_role:
        out.append(Finding("error", "specdeploy_pd_role", f"is set but specdeploy_topology is {layout}",
                           "remove specdeploy_pd_role, or set specdeploy_topology: pd", host))
    tp = hv.specdeploy_tensor_parallel_size
    if layout == "tp" and tp is not None and tp != gpus:
        out.append(Finding("error", "specdeploy_tensor_parallel_size", f"is {tp}, but with specdeploy_topology tp "
                           f"every host gives all its {gpus} GPUs to one tensor-parallel world (GPUs per host x "
                           "hosts of the group)", "remove specdeploy_tensor_parallel_size", host))
    if layout == "dp_ep" and tp is not None and gpus % tp:
        out.append(Finding("error", "specdeploy_tensor_parallel_size", f"is {tp}: with specdeploy_topology dp_ep it "
                           f"is the TP size of one data-parallel rank, and it does not divide the host's {gpus} "
                           "GPUs", f"use a divisor of {gpus} (1 for pure data-parallel attention)", host))
    addr = hv.specdeploy_dist_address
    if addr is not None and not _ADDRESS.fullmatch(addr):
        out.append(Finding("error", "specdeploy_dist_address", f"{addr!r} is not a host name or an IP address",
                           "give the address the group's other hosts reach this one at", host))
    if hv.specdeploy_dist_port in (hv.specdeploy_port, hv.specdeploy_exporter_port) and layout in ("tp", "dp_ep"):
        out.append(Finding("error", "specdeploy_dist_port", f"port {hv.specdeploy_dist_port} is also the engine's "
                           "or the exporter's", "give the rendezvous a port of its own", host))
    if layout == "pd" and hv.specdeploy_pd_port in (hv.specdeploy_port, hv.specdeploy_exporter_port):
        out.append(Finding("error", "specdeploy_pd_port", f"port {hv.specdeploy_pd_port} is also the engine's or "
                           "the exporter's", "give the KV-transfer side channel a port of its own", host))
    return out
