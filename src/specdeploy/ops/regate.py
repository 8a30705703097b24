"""The continuous gate's hand: run the speculation gate again on the hosts Prometheus says need it.

The rules (``templates/monitoring/specdeploy.rules.yml.j2``) label the alerts that ask for a new measurement with
``specdeploy_action="regate"``: ``SpecdeploySpeculationBelowBreakeven`` fires when the live acceptance length has
stayed below the step-time ratio the gate measured (speculation now slower than none) for ``regate_after``, and
never on a host whose speculation is off. :func:`regate` reads the firing ones from Prometheus's alerts API, maps
their ``host`` label to the inventory's engine hosts, and for each host runs the ordinary deploy with the gate on
(``specdeploy deploy --limit HOST -e specdeploy_spec_gate=true -e speculation_gate_force=true``: the
release was gated already, and the traffic moved since), one host at a time: the gate measures a baseline
and the speculative run again and keeps k, reduces it or disables speculation, with the deploy's rollback when
anything fails. A host re-gated within ``cooldown_s`` is left alone (the alert needs the exporter's new figures
before it clears), and so is one that is not in the inventory.

What was done is kept in a small JSON state file (host -> when, which alert, the deploy's exit status), so a
``--watch`` loop and separate runs agree on the cooldown. A run holds a lock beside it (``.<name>.lock``) from its
start to its end: a second ``regate`` on the same state file is refused while the first runs, so two runs never
deploy the same host at once. The state file is written by the output rule (values.outputs: beside, renamed in;
a file that is not a regate state file is never replaced).
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specdeploy.speculation.metrics import REGATE_LABEL as ACTION
from specdeploy.values import peerhttp
from specdeploy.values.errors import Finding, SpecdeployError

MAX_STATE = 1 << 20


@dataclass
class Alert:
    host: str
    name: str
    since: str
    value: str


def firing(prometheus: str, timeout: float = 10.0) -> list[Alert]:
    """The firing alerts that ask for a re-gate, from ``GET /api/v1/alerts`` (a PeerError when Prometheus does not
    answer, or answers something that is not its alerts API)."""
    url = prometheus.rstrip("/") + "/api/v1/alerts"
    body = peerhttp.json_object(url, timeout)
    alerts = (body.get("data") or {}).get("alerts") if isinstance(body.get("data"), dict) else None
    if body.get("status") != "success" or not isinstance(alerts, list):
        raise peerhttp.PeerError(url, "not Prometheus's alerts API (no data.alerts)")
    out = []
    for a in alerts:
        if not isinstance(a, dict) or a.get("state") != "firing" or not isinstance(a.get("labels"), dict):
            continue
        labels = a["labels"]
        if labels.get(ACTION[0]) != ACTION[1] or not isinstance(labels.get("host"), str) or not labels["host"]:
            continue
        out.append(Alert(labels["host"][:200], str(labels.get("alertname", ""))[:200], str(a.get("activeAt", ""))[:40],
                         str(a.get("value", ""))[:40]))
    return out


def read_state(path: Path) -> dict:
    """host -> {"at": seconds, "alert": name, "rc": exit status}; {} when there is none yet."""
    from specdeploy.values.bounded import Refused, read_regular
    try:
        raw = read_regular(path, MAX_STATE)
    except FileNotFoundError:
        return {}
    except Refused as exc:
        raise SpecdeployError([Finding("error", "--state", f"{path} {exc}", "give a regate state file, or a new "
                                       "path")]) from None
    except OSError as exc:
        raise SpecdeployError([Finding("error", "--state", f"{path} cannot be read ({exc.strerror or exc})",
                                       "give a readable file, or a new path")]) from None
    from specdeploy.values.bounded import loads
    try:
        data = loads(raw.decode()) if len(raw) <= MAX_STATE else None
    except (UnicodeDecodeError, ValueError):  # not JSON, or nested beyond bounded.MAX_DEPTH
        data = None
    if not isinstance(data, dict) or not all(isinstance(v, dict) and isinstance(v.get("at"), (int, float))
                                             for v in data.values()):
        raise SpecdeployError([Finding("error", "--state", f"{path} is not a regate state file (host -> "
                                       "{at, alert, rc})", "remove it, or give another --state")])
    return data


REGATE_CMD = "regate"


def _is_state(path: Path) -> bool:
    try:
        read_state(path)
        return True
    except SpecdeployError:
        return False


def write_state(path: Path, state: dict) -> None:
    """The state file written by the output rule; a failure is a finding naming --state, never a traceback."""
    from specdeploy.values.outputs import write_file
    try:
        write_file(path, json.dumps(state, indent=1, sort_keys=True) + "\n", "--state", REGATE_CMD, _is_state,
                   "a regate state file path", mode=0o600)
    except OSError as exc:
        raise SpecdeployError([Finding("error", "--state", f"{path} cannot be written ({exc.strerror or exc})",
                                       "give a writable path for the state file")]) from None


def check_state_path(path: Path) -> None:
    """What the state file may be (values.outputs): absent or a regate state file; never a path the rule
    forbids, a link, a FIFO, a directory or someone else's file."""
    from specdeploy.values.outputs import check_file
    check_file(path, "--state", REGATE_CMD, _is_state, "a regate state file path")


@contextmanager
def state_lock(path: Path) -> Iterator[None]:
    """Hold the state file's lock (``.<name>.lock`` beside it) for the block: a second run on the same state file
    is refused, naming it. The directory is made, and must be writable, before anything runs."""
    from specdeploy.values.terminal import safe
    check_state_path(path)
    lock = path.parent / f".{path.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SpecdeployError([Finding("error", "--state", f"{safe(path)}: its directory cannot hold the state "
                                       f"file ({exc.strerror or exc})", "give a writable path for the state file")
                               ]) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecdeployError([Finding("error", "--state", f"{safe(path)} is in use by another `specdeploy "
                                           "regate` (it holds the lock); two runs would deploy the same hosts",
                                           "wait for it to end, or give it its own --state")]) from None
        if not os.access(path.parent, os.W_OK):
            raise SpecdeployError([Finding("error", "--state", f"{safe(path.parent)} is not writable",
                                           "give a writable path for the state file")])
        yield
    finally:
        os.close(fd)


def choose(alerts: list[Alert], hosts: dict[str, str], state: dict, now: float,
           cooldown_s: float) -> tuple[list[Alert], list[tuple[str, str]]]:
    """(alerts to act on, one per host, in host order; [(host, why not)]). ``hosts``: the inventory's engine hosts,
    inventory name -> the ``host`` label its exporter's figures carry (ansible_host or the name)."""
    by_label = {label: name for name, label in hosts.items()}
    by_label.update({name: name for name in hosts})
    todo: dict[str, Alert] = {}
    skipped: list[tuple[str, str]] = []
    for a in alerts:
        name = by_label.get(a.host)
        if name is None:
            skipped.append((a.host, "not an engine host of this inventory"))
            continue
        last = state.get(name, {}).get("at")
        if last is not None and now - last < cooldown_s:
            skipped.append((name, f"re-gated {now - last:.0f} s ago (cooldown {cooldown_s:.0f} s)"))
            continue
        todo.setdefault(name, Alert(name, a.name, a.since, a.value))
    return [todo[h] for h in sorted(todo)], skipped


def deploy_argv(inventory: str, host: str) -> list[str]:
    """The ordinary deploy of one host with the gate on: the same path as a user's, preflight and rollback included."""
    return [sys.executable, "-m", "specdeploy.cli", "deploy", "-i", inventory, "--limit", host,
            "-e", "specdeploy_spec_gate=true", "-e", "speculation_gate_force=true"]


def regate(inventory: str, prometheus: str, hosts: dict[str, str], state_path: Path, cooldown_s: float,
           dry_run: bool = False, say=print, run=subprocess.run, timeout: float = 7200) -> list[dict]:
    """One pass: what fired, what was done about it (each host's deploy exit status), what was left and why."""
    state = read_state(state_path)
    now = time.time()
    todo, skipped = choose(firing(prometheus), hosts, state, now, cooldown_s)
    out = [{"host": h, "action": "skipped", "why": why} for h, why in skipped]
    for a in todo:
        say(f"regate {a.host}: {a.name} firing since {a.since} (value {a.value}): "
            + ("would run the deploy with the gate" if dry_run else "running the deploy with the gate"))
        if dry_run:
            out.append({"host": a.host, "action": "would-regate", "alert": a.name})
            continue
        state[a.host] = {"at": now, "alert": a.name, "rc": None}
        write_state(state_path, state)  # a crash mid-deploy still counts for the cooldown
        try:
            rc = run(deploy_argv(inventory, a.host), timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        state[a.host] = {"at": now, "alert": a.name, "rc": rc}
        write_state(state_path, state)
        say(f"regate {a.host}: deploy with the gate exited {rc}")
        out.append({"host": a.host, "action": "regated", "alert": a.name, "rc": rc})
    return out


def default_state() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "specdeploy" / "regate.json"
