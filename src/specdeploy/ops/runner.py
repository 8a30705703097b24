"""Deploy, rollback and verify through ansible-runner: one live row per host (phase, load progress, staging
progress), the events written down with secrets redacted."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from specdeploy.ops import phases
from specdeploy.ops.fleet import Target, read_journal
from specdeploy.ops.progress import parse_load


REPO = Path(__file__).resolve().parents[3]
PLAYBOOKS = {"deploy": "site.yml", "rollback": "rollback.yml", "verify": "verify.yml"}
ANSIBLE_DIR = REPO / "ansible"

REDACTED = "<redacted>"
# words of a variable name (split at _ - . and case changes) that make its value a secret
SECRET_WORDS = {"pass", "pw", "pwd", "token", "auth", "key", "privkey", "cert"}
SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "credential", "apikey")


def secret_name(key: str) -> bool:
    """Whether a variable's name says its value is a secret: api_key, ansible_become_pass, HF_TOKEN, db_password,
    a nested client_secret (words: split at _ - . and case changes; specdeploy_spec_num_tokens is no secret)."""
    words = [w.lower() for w in re.split(r"[_.\-\s]+|(?<=[a-z0-9])(?=[A-Z])", str(key)) if w]
    return bool(SECRET_WORDS & set(words)) or any(part in w for w in words for part in SECRET_PARTS)


def redact(extra: dict, vaulted: set[str] | frozenset = frozenset()) -> tuple[dict, set[str]]:
    """``-e`` values as they may be written down: a value whose key looks secret, that came from a vault
    (``vaulted``: top-level keys) or that is itself vault ciphertext becomes ``<redacted>``. Also the plain
    text of every redacted value, to scrub from anything else written."""
    found: set[str] = set()

    def hide(value) -> str:
        if isinstance(value, dict):
            for v in value.values():
                hide(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                hide(v)
        elif value is not None and not isinstance(value, bool) and len(str(value)) >= 4:
            found.add(str(value))
        return REDACTED

    def walk(obj, top: bool):
        if isinstance(obj, dict):
            return {k: hide(v) if secret_name(k) or (top and k in vaulted) else walk(v, False)
                    for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v, False) for v in obj]
        if isinstance(obj, str) and obj.lstrip().startswith("$ANSIBLE_VAULT"):
            return hide(obj)
        return obj
    return walk(extra or {}, True), found


def private_dir(path: Path) -> Path:
    """A directory only its owner reads (0700 when this creates it; its parents as the umask makes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    return path


@dataclass
class HostRow:
    host: str
    phase: str = "waiting"
    task: str = ""
    progress: str = ""
    started: float = field(default_factory=time.time)
    phase_since: float = field(default_factory=time.time)
    result: str = ""
    failed_task: str = ""
    message: str = ""
    triage: dict | None = None
    changed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class Run:
    """One ansible-runner run of a playbook, folded into per-host rows; every event goes to a JSON lines log."""

    def __init__(self, hosts: list[Target], events_path: Path, on_change: Callable[["Run", str], None] | None = None,
                 secrets: set[str] | frozenset = frozenset()):
        self.rows = {t.host: HostRow(t.host) for t in hosts}
        self.targets = {t.host: t for t in hosts}
        self.events_path = events_path
        # the log may hold what the hosts answered: created 0600 in a 0700 directory, never widened
        private_dir(events_path.parent)
        fd = os.open(events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        if os.fstat(fd).st_mode & 0o077:  # an existing file (--events): narrowed before the first line
            os.fchmod(fd, 0o600)
        self._log = os.fdopen(fd, "a")
        self.secrets = sorted(secrets, key=len, reverse=True)
        self.lock = threading.Lock()
        self.on_change = on_change
        self.done = threading.Event()
        self.stats: dict[str, dict[str, int]] = {}
        self.rc: int | None = None
        self.started = time.time()

    def scrub(self, text: str) -> str:
        """``text`` with every secret value of the run replaced by <redacted>."""
        for s in self.secrets:
            text = text.replace(s, REDACTED)
        return text

    def log(self, **rec):
        rec.setdefault("t", time.time())
        line = json.dumps(rec, default=str)
        for s in self.secrets:  # as JSON writes it
            line = line.replace(json.dumps(s)[1:-1], REDACTED)
        with self.lock:
            self._log.write(line + "\n")
            self._log.flush()

    def event(self, ev: dict) -> bool:
        """ansible-runner's event_handler."""
        kind = ev.get("event", "")
        d = ev.get("event_data") or {}
        host = d.get("host") or d.get("remote_addr")
        if kind == "playbook_on_stats":
            for key in ("ok", "changed", "failures", "dark", "skipped", "rescued"):
                for h, n in (d.get(key) or {}).items():
                    self.stats.setdefault(h, {})[key] = n
            self.log(event=kind, stats=self.stats)
            return True
        if host not in self.rows:
            return True
        row = self.rows[host]
        task = d.get("task") or ""
        if kind == "runner_on_start":
            ph = phases.index(ANSIBLE_DIR).phase(d.get("task_path"))
            with self.lock:
                row.task = task
                if ph and ph != row.phase and not (row.phase == "gate" and ph in ("start", "load", "ready")):
                    row.phase, row.phase_since, row.progress = ph, time.time(), ""
                    changed = True
                else:
                    changed = False
            self.log(event=kind, host=host, task=task, role=d.get("role"), phase=row.phase)
            if changed and self.on_change:
                self.on_change(self, host)
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            res = d.get("res") or {}
            facts = res.get("ansible_facts") or {}
            if isinstance(facts.get("inference_engine_triage"), dict):
                row.triage = facts["inference_engine_triage"]
            if res.get("changed"):
                row.changed += 1
            if kind != "runner_on_ok" and not d.get("ignore_errors"):
                # the final result comes from the play recap: a block's rescue may still recover
                row.failed_task = task
                row.message = self.scrub(str(res.get("msg") or res.get("stderr") or ""))[:2000]
                if kind == "runner_on_unreachable":
                    row.result = "unreachable"
                if self.on_change:
                    self.on_change(self, host)
            said = kind == "runner_on_ok" and str(d.get("task_action", "")).endswith("debug") and res.get("msg")
            self.log(event=kind, host=host, task=task, phase=row.phase, changed=bool(res.get("changed")),
                     **({"msg": row.message} if kind != "runner_on_ok" else {"msg": res["msg"]} if said else {}),
                     **({"triage": row.triage} if "inference_engine_triage" in facts else {}))
        return True

    def poll_stage(self, host: str) -> str:
        """Staging progress of a host: a `controller` copy's rsync log on this machine, else a `shared` copy's
        progress file on the host."""
        from specdeploy.plan.render.paths import STATE_DIR
        from specdeploy.ops.copy import controller_log, rsync_progress
        parts = []
        for kind in ("model", "drafter"):
            log = controller_log(host, kind)
            try:
                if log.stat().st_mtime < self.started:
                    continue
                p = rsync_progress(log.read_bytes()[-4096:].decode("utf-8", "replace"))
            except OSError:
                continue
            if p:
                parts.append(f"{kind} {p['line']}")
        if parts:
            return "; ".join(parts)
        t = self.targets[host]
        try:
            r = subprocess.run(t.ssh + [f"cd {STATE_DIR} 2>/dev/null && for f in $(find . -maxdepth 1 -name "
                                        f"'staging-*.json' -newermt @{int(self.started)}); do "
                                        'echo "$f $(cat $f)"; done; true'],
                               capture_output=True, text=True, timeout=8)
        except (subprocess.TimeoutExpired, OSError):
            return ""
        for line in r.stdout.splitlines():
            name, _, js = line.partition(" ")
            try:
                snap = json.loads(js)
            except ValueError:
                continue
            parts.append(f"{name.removeprefix('./staging-').removesuffix('.json')} {snap.get('line', '')}")
        return "; ".join(parts)

    def poll_load(self, interval: float = 2.0):
        """While a host stages weights or loads them, show progress: bytes, rate and ETA of the copy; shards,
        KV cache and CUDA graphs of the engine's load, read from its log."""
        while not self.done.wait(interval):
            for host, row in list(self.rows.items()):
                if row.phase == "stage" and not row.result:
                    text = self.poll_stage(host)
                    if text and text != row.progress:
                        row.progress = text
                        self.log(event="stage_progress", host=host, phase="stage", progress=text)
                        if self.on_change:
                            self.on_change(self, host)
                    continue
                if row.phase != "load" or row.result:
                    continue
                lines = read_journal(self.targets[host])
                if lines is None:
                    continue
                p = parse_load(lines, time.time(), self.targets[host].engine)
                text = p.text()
                if text != row.progress:
                    row.progress = text
                    self.log(event="load_progress", host=host, phase="load", progress=asdict(p))
                    if self.on_change:
                        self.on_change(self, host)

    def finish(self, rc: int):
        self.rc = rc
        self.done.set()
        for host, row in self.rows.items():
            st = self.stats.get(host, {})
            if row.result != "unreachable":
                if st.get("dark"):
                    row.result = "unreachable"
                elif st.get("failures"):
                    row.result = "failed"
                elif host in self.stats:
                    row.result = "ok"
                else:
                    row.result = "not run"
        self.log(event="finished", rc=rc, rows={h: r.to_dict() for h, r in self.rows.items()})
        self._log.close()

    @property
    def exit_code(self) -> int:
        bad = any(r.result in ("failed", "unreachable") for r in self.rows.values())
        return 1 if bad or self.rc not in (0, None) else 0


def run_playbook(run: Run, playbook: str, inventory: str, limit: str | None, extra: dict,
                 runner_dir: Path, vault=None, extra_files: list[str] | None = None) -> int:
    """ansible-playbook through ansible-runner; ``vault`` (inventory_ansible.Vault): the vault secrets given to
    specdeploy, passed on with those of ansible.cfg and the environment; ``extra_files``: vaulted ``-e @FILE``s,
    handed on as files (ansible-playbook decrypts them; the runner would write ``extra`` to disk in clear)."""
    import ansible_runner
    vault_args = vault.playbook_args() if vault is not None else []
    for f in extra_files or []:
        vault_args += ["-e", f"@{f}"]
    private_dir(runner_dir)
    poller = threading.Thread(target=run.poll_load, daemon=True)
    poller.start()
    thread, runner = ansible_runner.run_async(
        private_data_dir=str(runner_dir), playbook=str(REPO / "ansible" / playbook),
        inventory=str(Path(inventory).resolve()), limit=limit, extravars=extra or None, quiet=True,
        event_handler=run.event, envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        project_dir=str(REPO), settings={"suppress_ansible_output": True},
        **({"cmdline": shlex.join(vault_args)} if vault_args else {}))
    thread.join()
    rc = runner.rc if runner.rc is not None else 2
    run.finish(rc)
    return rc
