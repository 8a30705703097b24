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

from specdeploy.values.hostpaths import host_path

STATE_DIR = Path(host_path("run"))
PROPS = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "ExecMainCode", "InvocationID",
         "ExecMainPID")

READY, CRASHED, TIMEOUT, WAITING = "ready", "crashed", "timeout", "waiting"
NO_TEXT = "no-generation"
EXIT = {READY: 0, CRASHED: 1, TIMEOUT: 1, WAITING: 3, NO_TEXT: 1}
PROMPT = "Reply with one short sentence: what is speculative decoding?"


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
    """The health endpoint answered 200 within ``timeout`` seconds in all (peerhttp: a total deadline); a
    weight-cache daemon's ``files:GLOB:N`` check is read as its adapter wrote it (engines/weightcache.py)."""
    from specdeploy.engines.weightcache import health
    return health(url, timeout)[0]


def pid_gone(pid: int) -> bool:
    """The process ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def wait_url(url: str, until: float, poll_s: float = 1, clock=time.time, sleep=time.sleep,
             probe=http_ok, main_pid: int | None = None, gone=pid_gone) -> Outcome:
    """Poll a health check alone (a weight-cache daemon's, from its unit's ExecStartPost) until it passes, the
    deadline ``until`` or, with ``main_pid`` (systemd's $MAINPID for ExecStartPost), the exit of the process it
    waits for: systemd keeps waiting for ExecStartPost after its main process died."""
    t0 = clock()
    while True:
        if probe(url):
            return Outcome(READY, url, clock() - t0, f"{url} ready")
        if main_pid is not None and gone(main_pid):
            return Outcome(CRASHED, url, clock() - t0, f"its main process {main_pid} exited before {url} was ready")
        now = clock()
        if now >= until:
            return Outcome(TIMEOUT, url, now - t0, f"not ready at the deadline ({url})")
        sleep(max(0.0, min(poll_s, until - now)))


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


def generate(base_url: str, model: str, api_key: str | None = None, max_tokens: int = 32,
             deadline_s: float = 300) -> tuple[bool, str]:
    """The readiness check's real generation: one chat completion at ``base_url`` (an engine, or the router that
    pairs a prefill and a decode instance), greedy; (True, the text) when it answers with text, else (False, why).
    The one place specdeploy writes this request."""
    from specdeploy.values.peerhttp import PeerError, json_object
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    url = base_url.rstrip("/") + "/v1/chat/completions"
    try:
        data = json_object(url, deadline_s, headers=headers, body=body)
    except PeerError as exc:
        return False, str(exc)
    try:
        text = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return False, f"{url} answered without choices[0].message.content"
    if not isinstance(text, str) or not text:
        return False, f"{url} answered without text"
    return True, text


def generate_until(base_url: str, model: str, until: float, api_key: str | None = None, poll_s: float = 2,
                   clock=time.time, sleep=time.sleep) -> Outcome:
    """Retry the generation until it answers with text or the deadline (a router registers its workers once their
    health checks pass)."""
    t0 = clock()
    while True:
        ok, what = generate(base_url, model, api_key, deadline_s=max(1.0, min(300.0, until - clock())))
        now = clock()
        if ok:
            return Outcome(READY, base_url, now - t0, f"answered: {what}")
        if now >= until:
            return Outcome(NO_TEXT, base_url, now - t0, what)
        sleep(max(0.0, min(poll_s, until - now)))
