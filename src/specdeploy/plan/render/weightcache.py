"""The weight-cache daemon and the compile caches in a host's plan: whether the host's engine attaches to a daemon
(``specdeploy_weight_cache`` resolved against the pinned release, the configuration and the checkpoint's
quantization, read from its config.json on the controller), the daemon's unit, env and argv files, and the
persistent compile-cache directory with the environment that points the engine (and its daemon) at it."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specdeploy.checkpoint.modelcfg import load_json, local_config_dir
from specdeploy.engines import get_adapter
from specdeploy.engines.weightcache import Support, quant_kind
from specdeploy.hostvars.schema import HostVars
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.values.hostpaths import CONFIG_DIR, host_path, unit_file, unit_name


@dataclass
class Resolution:
    hv: HostVars           # specdeploy_weight_cache resolved to on or off
    support: Support
    quant: str | None      # the checkpoint's quantization (engines.weightcache.quant_kind); None: unknown here
    config_dir: Path | None

    @property
    def on(self) -> bool:
        return self.hv.specdeploy_weight_cache == "on"


def checkpoint_quant(hv: HostVars, base: Path | None) -> tuple[str | None, Path | None]:
    """The checkpoint's quantization from the first config.json this machine has of it (the config copy, the
    controller source, the host path where this machine has it too), as preflight reads it."""
    d = local_config_dir([hv.specdeploy_model_config_copy, hv.specdeploy_model_controller_path,
                          hv.specdeploy_model_path], base)
    if d is None:
        return None, None
    try:
        return quant_kind(load_json(d / "config.json", "target config.json")), d
    except SpecdeployError:
        return None, d  # preflight names the broken file


def resolve(host: str, hv: HostVars, base: Path | None) -> Resolution:
    """``auto`` becomes ``on`` where the release attaches this engine to a daemon for this checkpoint, else
    ``off``; ``on`` stays on unless the release or the checkpoint cannot (then the plan is refused)."""
    adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    quant, cdir = checkpoint_quant(hv, base)
    s = adapter.weight_cache_support(hv, quant)
    mode = hv.specdeploy_weight_cache
    if mode == "on" and s.ok is False:
        raise SpecdeployError([Finding("error", "specdeploy_weight_cache", f"is on, but {s.why}",
                                       "set specdeploy_weight_cache: auto (off where it cannot be used)", host)])
    on = mode == "on" or (mode == "auto" and s.ok is True)
    return Resolution(hv.model_copy(update={"specdeploy_weight_cache": "on" if on else "off"}), s, quant, cdir)


def compile_cache(hv: HostVars) -> tuple[str | None, dict[str, str]]:
    """(the persistent compile-cache directory, the environment that points the release's caches at it); (None,
    {}) where it is off or the release's caches were not read."""
    from specdeploy.plan.render.paths import compile_cache_dir
    root = compile_cache_dir(hv)
    if root is None:
        return None, {}
    return root, get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version).compile_cache_env(root)


def daemon_files(host: str, hv: HostVars, rank, env: dict[str, str], image: str | None, start_post: list[str], jinja,
                 why: str) -> tuple[dict[str, str], dict]:
    """The daemon's unit, env file and argv record (path -> content), and the plan's summary of it: its unit, health
    check, key (a digest of what it was started with: a new key restarts it, a full load), local ranks, and what an
    engine attached to it does."""
    from specdeploy.plan.render.quoting import shell_line
    from specdeploy.plan.render.runtime import exec_argv
    adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    sockets = host_path("weight_cache_sockets", hv.specdeploy_engine)
    d = adapter.weight_cache_daemon(hv, rank, sockets)
    unit = unit_name("weight_cache", hv.specdeploy_engine)
    stem = unit.removesuffix(".service")
    env_path, argv_path = f"{CONFIG_DIR}/{stem}.env", f"{CONFIG_DIR}/{stem}.argv"
    denv = {**env, **d.env}
    if "expandable_segments:true" in denv.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower():
        # its memory cannot be exported over CUDA IPC (the daemon refuses it); the engine may keep it
        denv.pop("PYTORCH_CUDA_ALLOC_CONF")
    execv = exec_argv(hv, d.argv, image, unit=unit, env_file=env_path, drafter=False)
    docker = hv.specdeploy_runtime == "docker"
    from specdeploy.plan.render.paths import SERVICE_USER, STATE_DIR
    files = {
        unit_file(unit): jinja.get_template("engine.service.j2").render(
            host=host, hv=hv, engine=hv.specdeploy_engine, version=hv.specdeploy_engine_version, unit=unit,
            name=stem, exec_argv=execv, env_file=env_path, secret_env_file=None, credential=None, docker=docker,
            user=SERVICE_USER, state_dir=STATE_DIR, start_timeout=hv.specdeploy_start_timeout,
            role="weight-cache daemon", restart="no", exec_start_post=start_post + ["--url", d.health]),
        env_path: jinja.get_template("engine.env.j2").render(env=sorted(denv.items()), nccl_source="the engine's",
                                                            host=host, consumer="docker" if docker else "systemd"),
        argv_path: shell_line(d.argv) + "\n",
    }
    key = hashlib.sha256("\0".join(f"{p}\0{c}" for p, c in sorted(files.items())).encode()).hexdigest()[:16]
    summary = {"unit": unit, "health": d.health, "sockets": sockets, "key": key, "local_ranks": d.local_ranks,
               "argv": d.argv, "drafter": d.drafter, "engine_outlives_daemon": d.engine_outlives,
               "without_daemon": d.without_daemon, "host_pid": d.host_pid, "files": sorted(files), "why": why,
               "memory_fraction": adapter.memory_fraction(hv, True), "notes": d.notes}
    return files, summary


STOPPED_WITH = "specdeploy: this engine stopped with its weight-cache daemon"


def stop_post(engine: str) -> list[str]:
    """The engine unit's ExecStopPost= where it is bound to a daemon (run with full privileges, ``+``): one journal
    line naming the daemon and its state when the engine stops while the daemon is not active. systemd stops a unit
    bound to one that died without a line of its own (its retroactive stop logs nothing), so without this the
    engine's journal would show only a stop nobody asked for; triage reads this line (the signature
    ``bound-unit-stopped``).

    Where the daemon failed (killed, crashed), the engine is stopped for good, as the daemon is: the next deploy
    (or starting the engine) reloads both. Without that, an engine whose own watchdog killed it before systemd's
    bound stop ran would come back after RestartSec= and pull the daemon into a full load nobody asked for, while
    the same failure seen first by systemd leaves both down: which one happened would be a race. A daemon stopped
    on purpose (a deploy restarting it) is never failed, so this stop never races a deploy's start."""
    d, e = unit_name("weight_cache", engine), unit_name("engine", engine)
    script = (f's=$(systemctl is-active {d}); [ "$s" = active ] && exit 0; '
              f'echo "{STOPPED_WITH} {d}, which is $s (result: $(systemctl show -p Result --value {d}))"; '
              f'if [ "$s" = failed ]; then systemctl stop --no-block {e}; fi')
    return ["/bin/sh", "-c", script]
