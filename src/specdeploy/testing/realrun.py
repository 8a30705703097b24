"""The real engine started from the command line specdeploy renders for a host, on this machine's loopback (tests
and benchmarks only).

:func:`host_vars` validates a host's variables as an inventory gives them (the venv runtime, the real-engine venv
as ``specdeploy_venv_path``, a loopback bind address and port, the tiny target and drafter); :func:`launch` takes
the plan ``render_host`` makes for that host, wraps the engine argv for the venv runtime exactly as the unit's
``ExecStart`` is wrapped, relocates the one host path that does not exist here (the converted drafter, which a
deploy writes under the state directory) to the local drafter, and runs it in its own process group with the
plan's environment only, as systemd's ``EnvironmentFile=`` would give it.

The runner plays systemd's part and nothing more: :meth:`Engine.unit_state` answers the properties
``readiness.wait`` reads (``ActiveState``, ``ExecMainStatus``, ...) from the process, :meth:`Engine.stop` sends
SIGTERM to the unit's processes (``KillMode=control-group``) and :meth:`Engine.kill` SIGKILL to the main
process, and the lines systemd adds to a unit's journal when its main process ends (``Main process exited,
code=killed, status=9/KILL``) go to a separate ``unit.log``, written from the exit status the kernel reported.
The engine's own output is ``engine.log``; ``journal()`` is both, in order, as ``journalctl -u`` shows them.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from specdeploy.values import peerhttp
from specdeploy.plan import render_host
from specdeploy.checks.readiness import Outcome, wait
from specdeploy.plan.render.runtime import exec_argv
from specdeploy.hostvars.schema import HostVars, validate_host
from specdeploy.testing import realengine
from specdeploy.values.topology import Rank

HOST = "realhost"
PROMPT = [{"role": "user", "content": "Reply with one short sentence: what is speculative decoding?"}]


def tiny_cache_from_env() -> None:
    """Build the tiny models under ``$SPECDEPLOY_TINY_CACHE`` when it is set (a generator being changed beside
    this one prunes the shared cache's entries of other keys)."""
    d = os.environ.get("SPECDEPLOY_TINY_CACHE")
    if d:
        from specdeploy.testing import tinymodels
        tinymodels.CACHE = Path(d)
        tinymodels.LOCK = Path(d) / "tinymodels.lock"
        tinymodels.CACHE.mkdir(parents=True, exist_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def venv(version: str) -> Path:
    """The real-engine venv, without waiting on the build lock when it is already complete."""
    return realengine.path(version) if realengine.ready(version) else realengine.venv(version)


def host_vars(target: Path, drafter: Path | None = None, k: int = 1, port: int | None = None,
              version: str = "0.32.0", served: str = "tiny", extra: dict | None = None,
              drafters: bool | None = None) -> HostVars:
    """The variables an inventory would give a host that serves ``target`` (with the EAGLE-3 ``drafter``, k draft
    tokens) from the real-engine venv; the CPU build's needs (its KV-cache size, eager mode, a short context, no
    weight-cache daemon) come in through the ordinary variables, validated as any inventory's are. ``drafters``:
    whether the host will run the target beside a drafter (by default, when given one; True for a host that a
    measurement starts with drafters of its own, such as ``breakeven --measure``), which decides the CPU build's
    MLA environment (realengine.env)."""
    with_drafter = drafter is not None if drafters is None else drafters
    v = {
        "specdeploy_engine": realengine.ENGINE, "specdeploy_engine_version": version, "specdeploy_runtime": "venv",
        "specdeploy_venv_path": str(venv(version)), "specdeploy_hardware": "h200_nvl8",
        "specdeploy_tensor_parallel_size": 1, "specdeploy_model_path": str(target),
        "specdeploy_served_model_name": served, "specdeploy_bind_address": "127.0.0.1",
        "specdeploy_port": port or free_port(), "specdeploy_max_model_len": 512,
        "specdeploy_engine_extra_args": ["--max-num-seqs", "4", "--enforce-eager"],
        "specdeploy_engine_env": realengine.env(version, with_drafter and realengine.uses_mla(target)),
        # the CPU build refuses the weight-cache daemon (UnsupportedPlatformForIPCError: CUDA IPC only), which
        # `auto` would plan for an unquantized target of a release that has one: this host loads from disk
        "specdeploy_weight_cache": "off",
    }
    if drafter is not None:
        v.update(specdeploy_spec_enabled=True, specdeploy_spec_method="eagle3", specdeploy_drafter_path=str(drafter),
                 specdeploy_spec_num_tokens=k)
    v.update(extra or {})
    return validate_host(HOST, v)


def group(target: Path, drafter: Path | None = None, layout: str = "tp", size: int = 2, k: int = 1,
          version: str = "0.32.0", extra: dict | None = None) -> dict[str, tuple[HostVars, Rank]]:
    """A serving group of ``size`` hosts on this machine's loopback, as an inventory would give it: each host one
    CPU "GPU" (a ``custom`` hardware profile of one device), ``specdeploy_topology: layout``, one rendezvous port;
    host name -> (its variables, its rank from ``topology.resolve``), the leader first. Every rank shares the
    leader's API port in its variables (a group agrees on it); only the leader serves it."""
    from specdeploy.topology.groups import Member, resolve
    one = {"gpu_count": 1, "gpu_memory_gib": 16, "compute_capability": "9.0", "interconnect": "pcie", "rdma": True}
    hv = host_vars(target, drafter, k=k, version=version, extra={
        "specdeploy_topology": layout, "specdeploy_group": "loopback", "specdeploy_hardware": "custom",
        "specdeploy_hardware_custom": one, "specdeploy_tensor_parallel_size": None,
        "specdeploy_dist_port": free_port(), **(extra or {})})
    names = [f"{HOST}{i}" for i in range(size)]
    ranks = resolve([Member(n, "127.0.0.1", hv) for n in names])
    return {n: (hv, ranks[n]) for n in names}


def command(hv: HostVars, rank: Rank | None = None, host: str = HOST) -> tuple[list[str], dict[str, str], object]:
    """(argv the unit's ExecStart runs, its environment, the plan), with the converted drafter's host path
    relocated to the drafter given in ``hv``; ``rank``: the host's place in its serving group."""
    plan = render_host(host, hv, "127.0.0.1", rank)
    argv = exec_argv(hv, plan.argv, plan.image)
    if plan.drafter_path:
        argv = [a.replace(plan.drafter_path, hv.specdeploy_drafter_path) for a in argv]
    return argv, dict(plan.env), plan


@dataclass
class Engine:
    argv: list[str]
    env: dict[str, str]
    url: str
    served: str
    logdir: Path
    unit: str
    proc: subprocess.Popen | None = None
    started: float = 0.0
    returncode: int | None = None
    orphans_killed: bool = False      # after kill(): children outlived the main process and were SIGKILLed
    ready: Outcome | None = None      # what readiness.wait said
    answer: dict | None = None        # the readiness gate's chat completion
    _out: object = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def log(self) -> Path:
        return self.logdir / "engine.log"

    @property
    def unit_log(self) -> Path:
        return self.logdir / "unit.log"

    def start(self) -> "Engine":
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log, "ab")
        self.started = time.time()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=str(self.logdir))
        return self

    # --- what systemd would say about the unit ------------------------------------------------------------
    def _reap(self) -> int | None:
        with self._lock:
            if self.returncode is None and self.proc is not None and self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                self._journal_exit(self.returncode)
            return self.returncode

    def _journal_exit(self, rc: int):
        """The lines systemd writes when a unit's main process ends, from the status the kernel reported."""
        if rc < 0:
            name = signal.Signals(-rc).name.removeprefix("SIG")
            lines = [f"{self.unit}: Main process exited, code=killed, status={-rc}/{name}"]
            if -rc not in (signal.SIGTERM, signal.SIGINT):  # systemd counts SIGTERM/SIGINT as a clean stop
                lines.append(f"{self.unit}: Failed with result 'signal'.")
        elif rc == 0:
            lines = [f"{self.unit}: Deactivated successfully."]
        else:
            lines = [f"{self.unit}: Main process exited, code=exited, status={rc}/FAILURE",
                     f"{self.unit}: Failed with result 'exit-code'."]
        with open(self.unit_log, "a") as fh:
            fh.write("".join(line + "\n" for line in lines))

    def unit_state(self, _unit: str = "") -> dict[str, str]:
        """The systemd properties readiness.wait reads, for this process (the unit has Restart=always, which this
        runner does not play: an exit is a failed unit)."""
        rc = self._reap()
        pid = str(self.proc.pid) if self.proc else "0"
        if rc is None:
            return {"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0",
                    "ExecMainStatus": "0", "ExecMainCode": "0", "InvocationID": f"run-{pid}", "ExecMainPID": pid}
        code, status = ("2", str(-rc)) if rc < 0 else ("1", str(rc))  # CLD_KILLED / CLD_EXITED
        return {"ActiveState": "failed", "SubState": "failed", "Result": "signal" if rc < 0 else "exit-code",
                "NRestarts": "0", "ExecMainStatus": status, "ExecMainCode": code, "InvocationID": f"run-{pid}",
                "ExecMainPID": "0"}

    def journal_tail(self, _unit: str = "", n: int = 12) -> list[str]:
        return [line for line in self.journal() if line.strip()][-n:]

    def journal(self) -> list[str]:
        out = self.log.read_text(errors="replace").splitlines() if self.log.is_file() else []
        if self.unit_log.is_file():
            out += self.unit_log.read_text().splitlines()
        return out

    # --- readiness, as the inference_engine role gates it -------------------------------------------------
    def wait_ready(self, timeout: float = 240) -> Outcome:
        """readiness.wait over this process and the plan's readiness URL, in slices, until it is not waiting."""
        until = time.time() + timeout
        state = self.logdir / "ready-state.json"
        state.unlink(missing_ok=True)
        while True:
            o = wait(self.unit, self.url + "/health", until, slice_s=30, poll_s=0.5, state_file=state,
                     read_state=self.unit_state, journal=self.journal_tail)
            if o.status != "waiting":
                return o

    def chat(self, messages=None, max_tokens: int = 32, deadline: float = 300) -> dict:
        """The chat completion the readiness gate sends after the health check (ready.yml)."""
        body = json.dumps({"model": self.served, "messages": messages or PROMPT, "max_tokens": max_tokens,
                           "temperature": 0}).encode()
        return peerhttp.json_object(self.url + "/v1/chat/completions", deadline,
                                    headers={"content-type": "application/json"}, body=body)

    def metrics(self) -> str:
        return peerhttp.text(self.url + "/metrics", 10)

    # --- the end of the unit ------------------------------------------------------------------------------
    def wait_exit(self, timeout: float) -> int | None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._reap()

    def stop(self, timeout: float = 120) -> int:
        """``systemctl stop``: SIGTERM to every process of the unit, SIGKILL to what is left at TimeoutStopSec."""
        if self._reap() is None:
            self.thaw()  # a frozen engine would not see its SIGTERM
            self._signal_group(signal.SIGTERM)
            if self.wait_exit(timeout) is None:
                self._signal_group(signal.SIGKILL)
                self.wait_exit(30)
        self._close()
        return self.returncode

    def kill(self, timeout: float = 60) -> int:
        """``kill -9`` of the engine's main process; what it leaves behind is cleaned up afterwards."""
        if self._reap() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.wait_exit(timeout)
        self._cleanup_group(timeout)
        self._close()
        return self.returncode

    def freeze(self):
        """SIGSTOP to every process of the engine: an idle engine still polls its queue and takes CPU from the one
        measured beside it (a paired measurement's idle side)."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self):
        self._signal_group(signal.SIGCONT)

    def _signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _cleanup_group(self, timeout: float):
        """Children of a killed main process (engine core, workers) end on their own when they see their parent
        gone; what is still there after ``timeout`` is killed."""
        end = time.time() + timeout
        while time.time() < end and self._group_alive():
            time.sleep(0.5)
        if self._group_alive():
            self.orphans_killed = True
            self._signal_group(signal.SIGKILL)
            end = time.time() + 15
            while time.time() < end and self._group_alive():
                time.sleep(0.2)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def _close(self):
        if self._out is not None:
            self._out.close()
            self._out = None


def launch(hv: HostVars, logdir: Path, rank: Rank | None = None, host: str = HOST, start: bool = True) -> Engine:
    """Start the engine of ``hv`` (not waiting for it; ``start=False``: only make it); ``rank``: its place in a
    serving group (a rank that joins a leader serves no HTTP: its ``url`` is the leader's)."""
    argv, env, plan = command(hv, rank, host)
    base = {"PATH": f"{hv.specdeploy_venv_path}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": str(logdir / "home"),
            "LANG": "C.UTF-8",
            "HF_HUB_OFFLINE": "1"}  # local checkpoints only: nothing is looked up on the Hub
    (logdir / "home").mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{hv.specdeploy_port}"
    eng = Engine(argv, {**base, **env}, url, plan.served_model_name, logdir, plan.engine_unit)
    return eng.start() if start else eng


def serve(hv: HostVars, logdir: Path, timeout: float = 240) -> Engine:
    """Start the engine and pass the readiness gate (health, then a real chat completion with text); raise with
    the engine's last lines when it does not."""
    eng = launch(hv, logdir)
    try:
        o = eng.ready = eng.wait_ready(timeout)
        if o.status != "ready":
            raise RuntimeError(f"{o.status}: {o.detail}\n" + "\n".join(eng.journal_tail(n=40)))
        answer = eng.answer = eng.chat()
        if not answer["choices"][0]["message"]["content"]:
            raise RuntimeError("the engine answered /v1/chat/completions without text")
    except BaseException:
        eng.stop(30)
        raise
    return eng
