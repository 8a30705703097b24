"""The host plan: everything a deployment installs on one host (:func:`render_host`: units, env files, the
engine's command line wrapped for its runtime, the exporter unit), and ``specdeploy plan`` over every engine host
of an inventory. The CLI and Ansible (filter ``specdeploy_render``) both call :func:`render_host`, so a plan and a
deploy cannot disagree."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specdeploy.nccl import env as nccl_env
from specdeploy.engines import get_adapter, names
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.plan.render.paths import (CONFIG_DIR, SERVICE_USER, STATE_DIR, converted_drafter_path,
                                          engine_files, secret_env_path, secret_path, unit_name)
from specdeploy.plan.render.prometheus import render_prometheus
from specdeploy.plan.render.quoting import shell_line
from specdeploy.plan.render.runtime import engine_image, exec_argv
from specdeploy.plan.render.systemd import jinja_env
from specdeploy.hostvars.schema import HostVars
from specdeploy.values.hostpaths import host_path, unit_file
from specdeploy.values.hostpaths import unit_name as unit_name_of
from specdeploy.values.topology import Rank


@dataclass
class HostPlan:
    host: str
    engine: str
    version: str
    runtime: str
    tp: int
    spec: bool
    nccl_source: str
    engine_unit: str
    exporter_unit: str | None  # None on a rank that serves no HTTP
    argv: list[str]
    env: dict[str, str]
    image: str | None
    drafter_path: str | None
    files: dict[str, str] = field(default_factory=dict)  # path on host -> content
    ports: dict[str, int] = field(default_factory=dict)
    health: dict[str, str] = field(default_factory=dict)
    served_model_name: str = ""
    other_engines: list[dict] = field(default_factory=list)  # what switching away from each other engine removes
    rank: dict | None = None  # the host's place in its serving group (values.topology.Rank.to_dict)
    # the weight-cache daemon the engine attaches to (plan/render/weightcache.py), None when it loads from disk;
    # why either way; the persistent compile-cache directory (None: not kept)
    weight_cache: dict | None = None
    weight_cache_why: str = ""
    compile_cache: str | None = None

    @property
    def serves(self) -> bool:
        """The engine on this host answers HTTP: every host but a multi-host group's followers (headless)."""
        return self.rank is None or self.rank["rank"] == 0

    def summary(self) -> dict:
        return {"engine": self.engine, "version": self.version, "runtime": self.runtime, "tp": self.tp,
                "rank": self.rank, "serves": self.serves,
                "speculation": self.spec, "nccl": self.nccl_source, "ports": self.ports,
                "engine_unit": self.engine_unit, "exporter_unit": self.exporter_unit, "image": self.image,
                "drafter_path": self.drafter_path, "health": self.health,
                "served_model_name": self.served_model_name, "release": self.release_id(),
                "weight_cache": self.weight_cache, "weight_cache_why": self.weight_cache_why,
                "compile_cache": self.compile_cache,
                # who writes the daemon's sockets and the compile caches: the container's root, or the service user
                "run_as": "root" if self.runtime == "docker" else SERVICE_USER}

    def release_id(self) -> str:
        """Content hash of everything installed: the same inputs give the same release."""
        import hashlib
        import json
        blob = json.dumps({"files": self.files, "image": self.image}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def to_dict(self) -> dict:
        d = self.summary()
        d.update({"argv": self.argv, "env": self.env, "files": self.files, "other_engines": self.other_engines})
        return d


def engine_command(hv: HostVars, rank: Rank | None = None):
    adapter = get_adapter(hv.specdeploy_engine, hv.specdeploy_engine_version)
    if rank is None or rank.layout == "single":  # an adapter that renders only single needs no rank
        return adapter, adapter.command(hv, converted_drafter_path(hv))
    return adapter, adapter.command(hv, converted_drafter_path(hv), rank)


def group_env(rank: Rank | None) -> dict[str, str]:
    """What NCCL and Gloo need between the hosts of a serving group: the interface they talk over. The engines do
    not read these variables; NCCL and torch's Gloo do (docs/topology.md)."""
    if rank is None or not rank.interface or not (rank.multi_host or rank.layout == "pd"):
        return {}
    return {"NCCL_SOCKET_IFNAME": rank.interface, "GLOO_SOCKET_IFNAME": rank.interface}


def render_host(host: str, hv: HostVars, address: str | None = None, rank: Rank | None = None,
                base: Path | None = None) -> HostPlan:
    """One host's plan; ``rank`` is its place in a serving group (topology.resolve), None for a host of its own;
    ``base``: the inventory's directory, under which a relative config copy is read (the checkpoint's quantization
    decides whether a weight-cache daemon can hold it)."""
    from specdeploy.plan.render import weightcache as wc
    if rank is None and hv.specdeploy_topology != "single":
        raise SpecdeployError([Finding("error", "specdeploy_topology", f"{host} is {hv.specdeploy_topology} in "
                                       f"group {hv.specdeploy_group}, whose ranks come from the whole inventory",
                                       "render it from the inventory (specdeploy plan -i), or through the role, "
                                       "which passes the group's hosts", host)])
    res = wc.resolve(host, hv, base)
    hv = res.hv
    adapter, cmd = engine_command(hv, rank)
    env_vars, nccl_source = nccl_env.resolve(hv)
    env = dict(env_vars)
    env.update(group_env(rank))
    env.update(cmd.env)
    image = engine_image(hv)
    compile_root, compile_env = wc.compile_cache(hv)
    env.update(compile_env)
    env.update(hv.specdeploy_engine_env)
    unit = unit_name(hv.specdeploy_engine)
    name = unit.removesuffix(".service")
    unit_path, env_path, argv_path = engine_files(hv.specdeploy_engine)  # the same list an engine switch removes
    execv = exec_argv(hv, cmd.argv, image, bool(cmd.secret_env))  # the caches' and sockets' mounts: container_spec
    ctx = dict(
        host=host, hv=hv, engine=hv.specdeploy_engine, version=hv.specdeploy_engine_version,
        unit=unit, name=name, exec_argv=execv, env_file=env_path,
        secret_env_file=secret_env_path(hv.specdeploy_engine) if hv.specdeploy_api_key_file and cmd.secret_env
        else None,
        credential=f"{cmd.credential}:{secret_path(cmd.credential)}" if cmd.credential else None,
        docker=hv.specdeploy_runtime == "docker",
        user=SERVICE_USER, state_dir=STATE_DIR,
        start_timeout=hv.specdeploy_start_timeout,
        binds_to=unit_name_of("weight_cache", hv.specdeploy_engine) if res.on else None,
        stop_post=wc.stop_post(hv.specdeploy_engine) if res.on else None,
    )
    j = jinja_env()
    files = {
        unit_path: j.get_template("engine.service.j2").render(**ctx),
        # One reader per env file: the container (docker --env-file) or systemd (venv), each in its own syntax.
        ctx["env_file"]: j.get_template("engine.env.j2").render(env=sorted(env.items()), nccl_source=nccl_source,
                                                                  host=host, consumer="docker" if ctx["docker"]
                                                                  else "systemd"),
        argv_path: shell_line(cmd.argv) + "\n",
    }
    summary = None
    if res.on:  # the daemon's env: the engine's (its API key is in a file of the engine's own, not here)
        wc_files, summary = wc.daemon_files(host, hv, rank, env, image,
                                            [f"{hv.specdeploy_venv_path}/bin/specdeploy", "ready", "--within",
                                             str(hv.specdeploy_ready_timeout_s)], j, res.support.why)
        files.update(wc_files)
    exp_argv = [f"{hv.specdeploy_venv_path}/bin/specdeploy", "exporter", "--engine", hv.specdeploy_engine,
                "--engine-url", f"http://127.0.0.1:{hv.specdeploy_port}",
                "--listen", f"0.0.0.0:{hv.specdeploy_exporter_port}",
                "--info", f"version={hv.specdeploy_engine_version}",
                "--info", f"spec_tokens={hv.specdeploy_spec_num_tokens if hv.specdeploy_spec_enabled else 0}",
                "--info", f"drafter={converted_drafter_path(hv) or ''}",
                "--info", f"patch_set={image_patch_label(hv)}"]
    if summary:  # the exporter reports the daemon's health and its last load (the role records it)
        exp_argv += ["--weight-cache-health", summary["health"], "--weight-cache-record",
                     host_path("weight_cache_record", hv.specdeploy_engine)]
    serves = rank is None or rank.leader
    if rank is not None and rank.multi_host and rank.leader:  # it tells which ranks are joined (topology/links)
        exp_argv += ["--group-port", str(rank.port)]
        for h, a in list(zip(rank.hosts, rank.addresses))[1:]:
            exp_argv += ["--group-rank", f"{h}={a}"]
    if serves:  # a rank that joins a leader serves no HTTP: the leader's exporter speaks for the group
        files[unit_file(unit_name_of("exporter"))] = j.get_template("exporter.service.j2").render(
            exec_argv=exp_argv, engine_unit=unit, user=SERVICE_USER, state_dir=STATE_DIR)
    return HostPlan(
        host=host, engine=hv.specdeploy_engine, version=hv.specdeploy_engine_version,
        runtime=hv.specdeploy_runtime + ("+simulator" if hv.specdeploy_sandbox
                                         and hv.specdeploy_sandbox_engine == "simulator" else ""),
        tp=adapter.tp_of(hv, rank),
        spec=hv.specdeploy_spec_enabled, nccl_source=nccl_source, engine_unit=unit,
        exporter_unit=unit_name_of("exporter") if serves else None, argv=cmd.argv, env=env, image=image,
        drafter_path=converted_drafter_path(hv), files=files,
        ports={"engine": hv.specdeploy_port, "exporter": hv.specdeploy_exporter_port},
        health={"liveness": adapter.health.liveness, "readiness": adapter.health.readiness},
        served_model_name=hv.served_model_name,
        other_engines=[{"engine": e, "unit": unit_name(e), "files": engine_files(e),
                        "weight_cache_unit": unit_name_of("weight_cache", e),
                        "weight_cache_files": weight_cache_files(e)}
                       for e in names() if e != hv.specdeploy_engine],
        rank=rank.to_dict() if rank is not None else None,
        weight_cache=summary, weight_cache_why=res.support.why, compile_cache=compile_root,
    )


def weight_cache_files(engine: str) -> list[str]:
    """The files of an engine's weight-cache daemon unit (an engine switch removes them with the unit)."""
    stem = unit_name_of("weight_cache", engine).removesuffix(".service")
    return [unit_file(unit_name_of("weight_cache", engine)), f"{CONFIG_DIR}/{stem}.env", f"{CONFIG_DIR}/{stem}.argv"]


def secret_files(hv: HostVars, key: str) -> dict[str, str]:
    """Path -> content of the 0600 files that carry the API key ``key`` to the engine, in the form its adapter
    asks for (environment lines, or a credential file systemd hands over); empty without an API key file."""
    if not hv.specdeploy_api_key_file:
        return {}
    adapter, cmd = engine_command(hv)
    out = {}
    if cmd.secret_env:
        # One env file, two readers (systemd's EnvironmentFile= and docker --env-file) that quote differently:
        # only a key that needs no quoting reads the same in both.
        if not key or any(c.isspace() or c in "\"'\\" for c in key):
            raise SpecdeployError([Finding(
                "error", "specdeploy_api_key_file", f"{hv.specdeploy_api_key_file}: the API key is empty or holds "
                "white space, quotes or backslashes, which systemd and docker read differently from an env file",
                "use a key of letters, digits and punctuation without quotes or backslashes (e.g. "
                "`openssl rand -hex 32`)")])
        out[secret_env_path(hv.specdeploy_engine)] = "".join(f"{var}={key}\n" for var in cmd.secret_env)
    if cmd.credential:
        out[secret_path(cmd.credential)] = adapter.credential_content(cmd.credential, key)
    return out


def image_patch_label(hv: HostVars) -> str:
    from specdeploy.engines.patches import patch_set_id
    return patch_set_id(hv.specdeploy_engine, hv.specdeploy_engine_version, hv.specdeploy_engine_patches)


def prometheus_targets(plans: list[tuple[str, str, HostPlan]]) -> list[dict]:
    """(host, address, plan) -> one target dict per host."""
    return [{"host": h, "address": a, "engine": p.engine, "engine_port": p.ports["engine"],
             "exporter_port": p.ports["exporter"]} for h, a, p in plans]


def plan(inventory: str, limit: str | None = None, extra: dict | None = None, vault=None):
    """Every engine host of ``inventory`` rendered, and the scrape config over them (vault: the vault secrets
    given on the command line)."""
    from specdeploy.hostvars import inventory as inv_mod
    from specdeploy.topology import inventory_ranks
    inv = inv_mod.load(inventory, limit=limit, extra=extra, vault=vault)
    ranks = inventory_ranks(inv)
    base = Path(inventory) if Path(inventory).is_dir() else Path(inventory).parent
    plans: list[tuple[str, str, HostPlan]] = []
    for h in inv.engine_hosts:
        plans.append((h.name, h.address, render_host(h.name, h.hv, h.address, ranks.get(h.name), base)))
    prom = render_prometheus(prometheus_targets(plans), rules_files=["/etc/prometheus/rules/specdeploy.rules.yml"])
    return inv, plans, prom


PLAN_CMD = "plan"


def out_files(plans, prom: str) -> list[tuple[Path, str]]:
    """(path relative to --out, content) of every file ``plan --out`` writes: each host's files under its name,
    the scrape config under prometheus/. A path that would leave --out (a host named with '..' or '/', which the
    inventory readers refuse) is refused here too."""
    files = [(Path(host) / path.lstrip("/"), content) for host, _, p in plans for path, content in p.files.items()]
    files.append((Path("prometheus") / "prometheus.yml", prom))
    for rel, _ in files:
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts[0] in ("", "."):
            from specdeploy.values.terminal import safe
            raise SpecdeployError([Finding("error", "--out", f"{safe(rel)} would be written outside --out",
                                           "give every inventory host a plain name (letters, digits, '.', '-', "
                                           "'_')")])
    return files


def write_out(out: Path, plans, prom: str) -> list[Path]:
    """Write the plan under ``out`` by the output rule (plan.outdir): a new directory beside it, renamed in; an
    earlier plan output is replaced, anything else refused; Ctrl-C or a failure leaves ``out`` as it was."""
    from specdeploy.plan.outdir import atomic_output_dir
    files = out_files(plans, prom)
    with atomic_output_dir(out, PLAN_CMD) as tmp:
        for rel, content in files:
            dest = tmp / rel
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                with open(dest, "x") as f:
                    f.write(content)
            except OSError as exc:
                raise SpecdeployError([Finding("error", "--out", f"cannot write {out / rel}: {exc.strerror or exc}",
                                               "give a writable directory")]) from None
    return [out / rel for rel, _ in files]
