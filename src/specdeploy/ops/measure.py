"""Engines started on this host for one measurement (``specdeploy breakeven --measure``), from the host's own plan.

Each start validates the host's inventory variables with the measurement's overrides (speculation on or off, the
drafter, k, the synthetic method's keys or environment), renders the host's plan (``plan.render_host``: the same
command line, environment and runtime wrapper the engine unit runs), and runs it as a child process in its own
process group, bound to the loopback on a free port, with the plan's environment only and the generated head in
place of the deployed drafter. It is ready when its health endpoint answers 200; it is stopped as systemd stops a
unit (SIGTERM to the group, SIGKILL after a grace period). Its output goes to ``<workdir>/<label>.log``.

The host's own engine unit must be stopped first (the measurement needs its GPUs); a Docker host's container runs
under its own name (``<unit>-measure``) with a private env file. A multi-host serving group is refused: its ranks
start together, which this runner does not do.

The weight cache: each start runs the engine command line of the host's plan, which attaches to the host's
weight-cache daemon wherever the plan has one (vLLM's ``--load-format ipc_cache``, SGLang's client mode), so a
measurement's many starts do not read the target again; the daemon the deploy started must be up.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from specdeploy.engines import get, get_adapter, synthetic
from specdeploy.values import peerhttp
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.hostvars.schema import HostVars, validate_host
from specdeploy.plan import render_host
from specdeploy.plan.render.runtime import exec_argv
from specdeploy.speculation.measure import EngineFailed, Launched, Plan, sweep

LOG_TAIL = 64 << 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merge(variables: dict, overrides: dict) -> dict:
    out = dict(variables)
    for k, v in overrides.items():
        out[k] = {**(out.get(k) or {}), **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Runner:
    """Starts the engine of ``host`` (its raw inventory variables) for one measurement point at a time."""

    def __init__(self, host: str, variables: dict, workdir: Path, timeout: float | None = None):
        hv = validate_host(host, variables)
        if hv.specdeploy_topology != "single":
            raise SpecdeployError([Finding("error", "--host", f"{host} is a rank of serving group "
                                           f"{hv.specdeploy_group} ({hv.specdeploy_topology}): its ranks start "
                                           "together, which `breakeven --measure` does not do",
                                           "measure on a host that serves alone (specdeploy_topology: single)",
                                           host)])
        self.host, self.variables, self.workdir = host, dict(variables), Path(workdir)
        self.timeout = float(timeout or hv.specdeploy_start_timeout)
        self.workdir.mkdir(parents=True, exist_ok=True)

    def variables_for(self, overrides: dict) -> HostVars:
        v = _merge(self.variables, {"specdeploy_bind_address": "127.0.0.1", "specdeploy_port": free_port(),
                                    **overrides})
        return validate_host(self.host, v)

    def command(self, hv: HostVars) -> tuple[list[str], dict[str, str], list[Path]]:
        """(argv, environment, files to remove afterwards) of the engine unit for ``hv``."""
        plan = render_host(self.host, hv, "127.0.0.1")
        drafter = hv.specdeploy_drafter_path if hv.specdeploy_spec_enabled else None
        argv = exec_argv(hv, plan.argv, plan.image)
        if plan.drafter_path and drafter:
            argv = [a.replace(plan.drafter_path, drafter) for a in argv]
        env = {"PATH": f"{hv.engine_venv}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.workdir / "home"),
               "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", **plan.env}
        temp: list[Path] = []
        if hv.specdeploy_runtime == "docker":
            argv, envfile = _docker(argv, env, drafter, self.workdir)
            temp.append(envfile)
        return argv, env, temp

    def __call__(self, overrides: dict, label: str) -> Launched:
        hv = self.variables_for(overrides)
        argv, env, temp = self.command(hv)
        (self.workdir / "home").mkdir(exist_ok=True)
        log = self.workdir / ("".join(c if c.isalnum() else "-" for c in label).strip("-")[:80] + ".log")
        out = open(log, "ab")
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=str(self.workdir))
        url = f"http://127.0.0.1:{hv.specdeploy_port}"

        def tail() -> str:
            try:
                with open(log, "rb") as fh:
                    fh.seek(max(0, os.path.getsize(log) - LOG_TAIL))
                    return fh.read().decode("utf-8", "replace")
            except OSError:
                return ""

        def stop():
            _stop(proc)
            out.close()
            for f in temp:
                f.unlink(missing_ok=True)

        until = time.monotonic() + self.timeout
        while True:
            if proc.poll() is not None:
                stop()
                raise EngineFailed(f"the engine exited with status {proc.returncode} before it was ready", tail())
            try:
                peerhttp.text(url + get(hv.specdeploy_engine).health.readiness, 5)
                return Launched(url, tail, stop, lambda: _signal(proc, signal.SIGSTOP),
                                lambda: _signal(proc, signal.SIGCONT))
            except OSError:
                pass
            if time.monotonic() > until:
                stop()
                raise EngineFailed(f"the engine was not ready within {self.timeout:.0f} s", tail())
            time.sleep(0.5)


def _signal(proc: subprocess.Popen, sig):
    """A signal to the engine's process group (SIGSTOP / SIGCONT: a paired measurement's idle engine)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop(proc: subprocess.Popen, grace: float = 60.0):
    """``systemctl stop``: SIGTERM to the process group (thawed, should it be frozen), SIGKILL to what is left after
    ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 15.0)):
        try:
            os.killpg(proc.pid, sig)
            os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def _docker(argv: list[str], env: dict, drafter: str | None, workdir: Path) -> tuple[list[str], Path]:
    """The unit's ``docker run`` under its own name, with this start's environment in a private env file and the
    generated drafter mounted read-only."""
    fd, name = tempfile.mkstemp(prefix="engine-", suffix=".env", dir=workdir)
    with os.fdopen(fd, "w") as fh:
        fh.writelines(f"{k}={v}\n" for k, v in env.items() if "\n" not in v)
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--name" and i + 1 < len(argv):
            out += [a, argv[i + 1] + "-measure"]
            i += 2
            continue
        if a == "--env-file" and i + 1 < len(argv):
            out += [a, name] if name not in out else []
            i += 2
            continue
        if a == "--entrypoint" and drafter:
            out += ["-v", f"{drafter}:{drafter}:ro"]
        out.append(a)
        i += 1
    return out, Path(name)


def run(runner: Runner, plan: Plan, target_dir: Path | None, progress=None) -> dict:
    """The measurement on this host: a random head of the right shape generated from the target's config into the
    runner's work directory for the synthetic points (removed afterwards), then the sweep
    (``speculation.measure.sweep``). ``target_dir``: the target's config on this machine (the host's model path)."""
    from specdeploy.drafter.synth import temporary_head
    a = get_adapter(plan.engine, plan.version)
    if not plan.synthetic or synthetic.unavailable(a):  # the sweep records why; no head is needed for that
        return sweep(runner, plan, progress)
    if target_dir is None or not (Path(target_dir) / "config.json").is_file():
        raise SpecdeployError([Finding("error", "--target", f"no config.json in {target_dir}", "give the target's "
                                       "model directory on this host (the synthetic method needs a drafter of the "
                                       "right shape, generated from it)")])
    if progress:
        progress("generating a random EAGLE-3 head from the target's config")
    with temporary_head(runner.workdir, target_dir, plan.engine, plan.version, fill="random") as head:
        return sweep(runner, Plan(**{**plan.__dict__, "head": head["path"]}), progress)
