"""Where specdeploy keeps things on a host, and the names of its units: the one place they are spelled.
Renderers take them from here; the Ansible roles through the ``specdeploy_path`` and ``specdeploy_unit`` filters
(``{{ 'state' | specdeploy_path }}``, ``{{ 'release' | specdeploy_path(id) }}``, ``{{ 'exporter' |
specdeploy_unit }}``), never joining a path themselves; the stdlib-only host scripts, which import nothing of
ours, repeat the few they need and a test holds them equal."""
from __future__ import annotations

STATE_DIR = "/var/lib/specdeploy"       # releases, gate reports, drafters, NCCL results
CONFIG_DIR = "/etc/specdeploy"          # env files, argv records, secrets
OPT_DIR = "/opt/specdeploy"             # what specdeploy installs: venvs, wheelhouse, build contexts
SYSTEMD_DIR = "/etc/systemd/system"
SERVICE_USER = "specdeploy"
SANDBOX_BASE_ARCHIVE = "/opt/specdeploy-sandbox/base-image.tar"  # a sandbox host's baked base image
CONVERSION_RECORD = "specdeploy-conversion.json"  # in a converted drafter: what `drafter convert` did

HOST_PATHS: dict[str, str] = {
    "systemd": SYSTEMD_DIR,
    "state": STATE_DIR,
    "config": CONFIG_DIR,
    "secrets": f"{CONFIG_DIR}/secrets",
    "opt": OPT_DIR,
    "venv": f"{OPT_DIR}/venv",
    "wheelhouse": f"{OPT_DIR}/wheelhouse",
    "build": f"{OPT_DIR}/build",
    "engine_build": f"{OPT_DIR}/build/engine",
    "engine_build_wheelhouse": f"{OPT_DIR}/build/engine/wheelhouse",
    "router": f"{OPT_DIR}/router",
    "router_wheels": f"{OPT_DIR}/router-wheels",
    "drafter": f"{STATE_DIR}/drafter",
    "drafter_store": f"{STATE_DIR}/drafter/store",
    "gate": f"{STATE_DIR}/gate",
    "gate_report": f"{STATE_DIR}/gate/report.json",
    "gate_chart": f"{STATE_DIR}/gate/report.png",
    "surface": f"{STATE_DIR}/surface",              # breakeven --measure --out: the price measured on the host
    "surface_file": f"{STATE_DIR}/surface/surface.json",
    "nccl": f"{STATE_DIR}/nccl",
    "probe": f"{STATE_DIR}/probe",
    "verified": f"{STATE_DIR}/verified",
    "releases": f"{STATE_DIR}/releases",
    # the release bookkeeping (common/tasks/release.yml): the release serving, the one before it, the gate's baseline
    "current": f"{STATE_DIR}/current",
    "previous": f"{STATE_DIR}/previous",
    "gate_baseline": f"{STATE_DIR}/gate-baseline",
    "router_unit": f"{SYSTEMD_DIR}/specdeploy-router.service",
    "acs_unit": f"{SYSTEMD_DIR}/specdeploy-acs-off.service",   # gpu_host: ACS redirect off at boot
    "acs_script": "/usr/local/sbin/specdeploy-acs-off",
    "exporter_unit": f"{SYSTEMD_DIR}/specdeploy-exporter.service",
    "run": "/run/specdeploy",                      # runtime state: the readiness wait's baseline
    # the weight-cache daemon: its sockets (per engine), the key of the weights it holds and its last load's record
    "weight_cache": f"{STATE_DIR}/weight-cache",
    "compile_cache": f"{STATE_DIR}/compile-cache",  # compile caches kept across restarts, per release and model
    "sandbox_base_archive": SANDBOX_BASE_ARCHIVE,
}

# Paths with parts that vary (a release id, an engine, a fingerprint): each part is one path component, checked.
PATH_TEMPLATES: dict[str, tuple[str, str]] = {
    "release": ("releases", "{0}"),                        # a release's directory: plan.json, drafter, gate-vars.yml
    "release_file": ("releases", "{0}/{1}"),
    "drafter_out": ("drafter", "{0}"),                     # the link an engine's converted drafter is served from
    "drafter_conversion": ("drafter_store", "{0}-{1}-{2}"),  # engine, release, drafter fingerprint
    "drafter_earlier": ("drafter_store", "{0}-earlier"),   # a conversion from before they were kept per fingerprint
    "conversion_record": ("drafter_store", "{0}/" + CONVERSION_RECORD),  # a conversion's record, by its directory
    "standin_build": ("build", "standin-{0}"),             # sandbox: the stand-in image's build context, per engine
    "verified_stamp": ("verified", "{0}.json"),            # the checked checkpoint's record, per kind
    "staging_progress": ("state", "staging-{0}.json"),     # a shared copy's progress, per kind
    "nccl_result": ("nccl", "{0}.json"),                   # an NCCL sweep's result, per hardware/driver/NCCL key
    "unit_dropins": ("systemd", "{0}.d"),                  # a unit's drop-in directory
    "unit_dropin": ("systemd", "{0}.d/{1}"),
    "weight_cache_sockets": ("weight_cache", "{0}"),        # a daemon's sockets and ready files, per engine
    "weight_cache_key": ("weight_cache", "{0}.key"),        # the weights the running daemon holds, per engine
    "weight_cache_record": ("weight_cache", "{0}.json"),    # its last full load and the engine's last attach
    "compile_cache_dir": ("compile_cache", "{0}"),          # engine-release-model key
}

# AF_UNIX socket paths hold at most 107 bytes: the longest name a daemon puts in its socket directory (vLLM's
# vllm_weight_cache_<md5 of the GPU uuid>_draft.sock, SGLang's <GPU uuid>.sock under specdeploy's template) must
# fit behind it (tests hold every engine's socket directory to this).
SOCKET_PATH_MAX = 107

# The units specdeploy installs; an engine's carries the engine's name.
UNITS: dict[str, str] = {
    "exporter": HOST_PATHS["exporter_unit"].rsplit("/", 1)[1],
    "router": HOST_PATHS["router_unit"].rsplit("/", 1)[1],
    "acs": HOST_PATHS["acs_unit"].rsplit("/", 1)[1],
    "engine": "specdeploy-{0}.service",
    "weight_cache": "specdeploy-{0}-weights.service",  # an engine's weight-cache daemon
}


# What specdeploy runs or keeps inside a Python environment it installs (the tools venv, the router's venv).
VENV_FILES = ("bin/python", "bin/pip", "bin/specdeploy", "bin/smg", ".specdeploy-stamp")


def in_venv(venv: str, rel: str) -> str:
    """A file of ours inside the Python environment ``venv``."""
    if rel not in VENV_FILES:
        raise KeyError(f"no venv file {rel!r}; known: {', '.join(VENV_FILES)}")
    return f"{venv.rstrip('/')}/{rel}"


def _part(name: str, value) -> str:
    text = str(value)
    if not text or text in (".", "..") or "/" in text or "\x00" in text or any(ord(c) < 32 for c in text):
        raise ValueError(f"host path {name!r}: {text!r} is not one path component")
    return text


def host_path(name: str, *parts) -> str:
    """A host path of specdeploy's by name; a templated one (``PATH_TEMPLATES``) with its parts, each checked to
    be one path component (never '..', '/' or a control character)."""
    if name in HOST_PATHS and not parts:
        return HOST_PATHS[name]
    if name in PATH_TEMPLATES:
        base, tail = PATH_TEMPLATES[name]
        want = tail.count("{")
        if len(parts) != want:
            raise KeyError(f"host path {name!r} takes {want} part(s), not {len(parts)}")
        return f"{HOST_PATHS[base]}/{tail.format(*(_part(name, p) for p in parts))}"
    if name in HOST_PATHS:
        raise KeyError(f"host path {name!r} takes no parts")
    raise KeyError(f"no host path {name!r}; known: {', '.join([*HOST_PATHS, *PATH_TEMPLATES])}")


def unit_name(component: str, engine: str | None = None) -> str:
    """The systemd unit of a component: ``exporter``, ``router``, or ``engine`` and ``weight_cache`` (the engine's
    weight-cache daemon) with the engine's name."""
    if component not in UNITS:
        raise KeyError(f"no unit {component!r}; known: {', '.join(UNITS)}")
    if component in ("engine", "weight_cache"):
        if not engine:
            raise KeyError(f"the {component} unit needs the engine's name")
        return UNITS[component].format(_part("unit", engine))
    return UNITS[component]


def unit_file(name: str) -> str:
    """Where a unit of specdeploy's is installed."""
    return f"{SYSTEMD_DIR}/{_part('unit', name)}"


def expand(text: str) -> str:
    """A role default that uses the path filter, as plain text: "{{ 'state' | specdeploy_path }}/x" ->
    "/var/lib/specdeploy/x" (other template expressions are left as they are)."""
    import re
    return re.sub(r"\{\{\s*'(\w+)'\s*\|\s*specdeploy_path\s*\}\}", lambda m: host_path(m.group(1)), text)
