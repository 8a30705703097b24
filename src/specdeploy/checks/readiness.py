"""Engine readiness on the host: fail fast on a crash loop, wait (wall time) only for an engine that is alive.

A deterministic crash on load restarts the unit forever (``Restart=always``); waiting for the health endpoint
alone would notice it only at the ready timeout, an hour by default. Each poll therefore reads the unit's
systemd state too: a new invocation, a rising ``NRestarts``, an ``auto-restart`` or ``failed`` state is a crash,
reported at once with ``ExecMainStatus``. The ready timeout is a wall-clock deadline (``until``, epoch seconds)
that applies only while the unit stays up. A wait is cut into slices (``slice_s``) so Ansible shows progress;
the first slice of a wait stores the unit's invocation in a state file that the later slices compare with.
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_DIR = Path("/run/specdeploy")
PROPS = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "ExecMainCode", "InvocationID",
         "ExecMainPID")

READY, CRASHED, TIMEOUT, WAITING = "ready", "crashed", "timeout", "waiting"
EXIT = {READY: 0, CRASHED: 1, TIMEOUT: 1, WAITING: 3}


@dataclass
class Outcome:
    status: str
    unit: str
    elapsed_s: float
    detail: str
    state: dict = field(default_factory=dict)
    journal: list[str] = field(default_factory=list)  # the unit's last lines, on a crash

    def to_dict(self) -> dict:
        return asdict(self)


def unit_state(unit: str) -> dict[str, str]:
    r = subprocess.run(["systemctl", "show", unit, "--property=" + ",".join(PROPS)], capture_output=True,
                       text=True, timeout=30)
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def journal_tail(unit: str, n: int = 12) -> list[str]:
    r = subprocess.run(["journalctl", "-u", unit, "-o", "cat", "--no-pager", "-n", str(n)], capture_output=True,
                       text=True, timeout=30)
    return [line for line in r.stdout.splitlines() if line.strip()][-n:]


def http_ok(url: str, timeout: float = 5) -> bool:
    """The health endpoint answered 200 within ``timeout`` seconds in all (peerhttp: a total deadline)."""
    from specdeploy.values.peerhttp import ok
    return ok(url, timeout)[0]


def crash_reason(state: dict[str, str], baseline: dict[str, str]) -> str | None:
    """Why ``state`` shows the engine crashed since ``baseline`` was taken, or None while it is up."""
    code, status = state.get("ExecMainCode", ""), state.get("ExecMainStatus", "")
    how = f"ExecMainStatus={status}" + (f" (ExecMainCode={code})" if code not in ("", "0", "1") else "")
    if state.get("ActiveState") == "failed":
        return f"the unit failed ({state.get('Result')}, {how})"
    if state.get("SubState") == "auto-restart":
        return f"the engine exited ({state.get('Result')}, {how}) and systemd is restarting it"
    restarts, base = int(state.get("NRestarts") or 0), int(baseline.get("NRestarts") or 0)
    if restarts > base:
        return f"systemd restarted the engine {restarts - base} time(s) since the wait began ({how})"
    if baseline.get("InvocationID") and state.get("InvocationID") not in ("", baseline["InvocationID"]):
        return f"the engine was restarted since the wait began ({how})"
    if state.get("ActiveState") in ("inactive", "deactivating"):
        return f"the unit is {state.get('ActiveState')} ({how})"
    return None


def wait(unit: str, url: str, until: float, slice_s: float = 30, poll_s: float = 1, state_file: Path | None = None,
         read_state=unit_state, probe=http_ok, clock=time.time, sleep=time.sleep, journal=journal_tail) -> Outcome:
    """Poll the unit and the readiness URL until ready, crashed, the deadline ``until`` or the end of the slice."""
    t0 = clock()
    state_file = state_file or STATE_DIR / f"ready-{unit}-{int(until)}.json"
    if state_file.is_file():
        baseline = json.loads(state_file.read_text())
    else:
        baseline = read_state(unit)
        baseline["started"] = t0
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(baseline))
    started = float(baseline.get("started", t0))
    while True:
        state = read_state(unit)
        now = clock()
        why = crash_reason(state, baseline)
        if why:
            return Outcome(CRASHED, unit, now - started, why, state, journal(unit))
        if probe(url):
            return Outcome(READY, unit, now - started, f"{url} answered 200", state)
        if now >= until:
            return Outcome(TIMEOUT, unit, now - started, f"alive but not ready at the deadline ({url})", state)
        if now - t0 >= slice_s:
            return Outcome(WAITING, unit, now - started, f"loading ({state.get('SubState')}); "
                           f"{until - now:.0f} s left", state)
        sleep(max(0.0, min(poll_s, until - now)))
