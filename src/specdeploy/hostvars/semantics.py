"""The checks of one host's variables that need more than one field, the hardware profile or the engine's
release: the drafter a method needs, the load bands, the weights' sources, the ports, the address, the release
that exists for the engine. Cheap and host-local; ``schema.validate_host`` runs them after the fields validate."""
from __future__ import annotations

import re
from typing import Any

from specdeploy.values.errors import Finding


def semantic_problems(host: str, hv) -> list[Finding]:
    """Checks that need more than one field or the hardware profile; cheap and host-local."""
    out: list[Finding] = []
    prof = hv.profile()
    if hv.tp > prof.gpu_count:
        out.append(Finding("error", "specdeploy_tensor_parallel_size",
                           f"TP {hv.tp} is larger than the {prof.gpu_count} GPUs of profile {prof.name}",
                           f"set specdeploy_tensor_parallel_size to at most {prof.gpu_count}", host))
    from specdeploy.engines import get
    if (hv.specdeploy_spec_enabled and get(hv.specdeploy_engine).draft_source(hv.specdeploy_spec_method) == "drafter"
            and not hv.specdeploy_drafter_path):
        out.append(Finding("error", "specdeploy_drafter_path",
                           f"speculation is enabled with method {hv.specdeploy_spec_method} but no drafter is set",
                           "set specdeploy_drafter_path, or specdeploy_spec_enabled: false", host))
    out.extend(k_by_batch_problems(host, hv))
    out.extend(source_problems(host, hv))
    out.extend(port_problems(host, hv))
    from specdeploy.hostvars.layout import layout_problems
    out.extend(layout_problems(host, hv))
    from specdeploy.engines import UnsupportedVersion, get_adapter
    try:
        adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    except UnsupportedVersion as exc:
        out.append(release_problem(host, hv, exc))
        return out
    out.extend(adapter.validate_extras(hv, host))
    return out


def release_problem(host: str, hv, exc: Exception) -> Finding:
    """A release the engine does not have, named by the variable it came from; an override that is another
    engine's release (left over from an engine switch) says so."""
    from specdeploy.engines import adapters
    where = hv._version_from
    other = [a.label for a in adapters()
             if a.name != hv.specdeploy_engine and hv.specdeploy_engine_version in a.versions]
    if where == "specdeploy_engine_version" and other:
        return Finding("error", where, f"{hv.specdeploy_engine_version} is a {other[0]} release, but "
                       f"specdeploy_engine is {hv.specdeploy_engine}: the override applies to whichever engine is "
                       "chosen", f"remove specdeploy_engine_version and keep each engine's release in "
                       f"specdeploy_engine_versions (e.g. {hv.specdeploy_engine}: "
                       f"{_pinned_text(hv)}), or pin a {hv.specdeploy_engine} release", host)
    return Finding("error", where, str(exc), "pin one of the supported versions", host)


def _pinned_text(hv) -> str:
    from specdeploy.engines import get
    try:
        return repr(get(hv.specdeploy_engine).pinned(hv.profile()).version)
    except Exception:  # noqa: BLE001 - only a hint
        return "'<release>'"


def k_by_batch_problems(host: str, hv) -> list[Finding]:
    """specdeploy_spec_k_by_batch: bands from 1 up, ascending, each k within specdeploy_spec_num_tokens."""
    bands, name = hv.specdeploy_spec_k_by_batch, "specdeploy_spec_k_by_batch"
    if not bands:
        return []
    out: list[Finding] = []
    starts = [b.from_batch for b in bands]
    if starts[0] != 1:
        out.append(Finding("error", f"{name}[0].from_batch", f"the first band starts at {starts[0]}: loads below "
                           "it would have no speculation length", "start the first band at from_batch: 1", host))
    if any(b <= a for a, b in zip(starts, starts[1:])):
        out.append(Finding("error", name, f"from_batch does not ascend strictly ({starts})",
                           "list the bands in ascending from_batch, each once", host))
    for i, b in enumerate(bands):
        if b.k > hv.specdeploy_spec_num_tokens:
            out.append(Finding("error", f"{name}[{i}].k", f"k {b.k} is above specdeploy_spec_num_tokens "
                               f"{hv.specdeploy_spec_num_tokens}, which sets the most draft tokens the engine "
                               "allocates for", f"lower it, or raise specdeploy_spec_num_tokens to {b.k}", host))
    if not any(b.k for b in bands):
        out.append(Finding("error", name, "every band's k is 0: no load would speculate",
                           "set specdeploy_spec_enabled: false instead", host))
    if "num_speculative_tokens_per_batch_size" in hv.specdeploy_spec_config_extra:
        out.append(Finding("error", "specdeploy_spec_config_extra.num_speculative_tokens_per_batch_size",
                           f"says what {name} says", f"keep only {name}", host))
    return out


def source_problems(host: str, hv) -> list[Finding]:
    """Each source mode needs its path."""
    out: list[Finding] = []
    kinds = [("model", hv.specdeploy_model_source)]
    if hv.specdeploy_spec_enabled and hv.specdeploy_drafter_path:
        kinds.append(("drafter", hv.drafter_source))
    for kind, mode in kinds:
        var = f"specdeploy_{kind}_source" if kind == "model" or hv.specdeploy_drafter_source else \
            "specdeploy_model_source"
        need = {"controller": f"specdeploy_{kind}_controller_path",
                "shared": f"specdeploy_{kind}_shared_path"}.get(mode)
        if need and not getattr(hv, need):
            out.append(Finding("error", need, f"{var} is {mode} but {need} is not set",
                               f"set {need} to the full {kind} checkpoint, or {var}: host when the weights are "
                               "already on the host", host))
    return out


def port_problems(host: str, hv) -> list[Finding]:
    """The ports this host listens on (the engine's, the exporter's) are distinct."""
    ports = {"specdeploy_port": hv.specdeploy_port, "specdeploy_exporter_port": hv.specdeploy_exporter_port}
    seen: dict[int, str] = {}
    out = []
    for var, port in ports.items():
        if port in seen:
            out.append(Finding("error", var, f"port {port} is also {seen[port]}: the second listener would fail "
                               "to bind", f"give {var} a port of its own", host))
        seen.setdefault(port, var)
    return out


# A host name or an IP address (IPv6 with its zone); what the scrape config and the router's worker URLs take.
_ADDRESS = re.compile(r"[A-Za-z0-9._:%\[\]-]+")


def address_problems(host: str, variables: dict[str, Any]) -> list[Finding]:
    addr = variables.get("ansible_host")
    if addr is None or (isinstance(addr, str) and _ADDRESS.fullmatch(addr)):
        return []
    return [Finding("error", "ansible_host", f"{addr!r} is not a host name or an IP address",
                    "give the host's DNS name or IP address (letters, digits, '.', '-', ':')", host)]
