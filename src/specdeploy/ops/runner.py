"""Deploy, rollback and verify through ansible-runner: one live row per host (phase, load progress, staging
progress), the events written down with secrets redacted.

What a run leaves on disk is its event log (``.cache/runs/<time>-<action>/events.jsonl``, 0600 in a 0700
directory, created exclusively), with every secret value replaced by ``<redacted>``: each ``-e`` value but numbers,
booleans and the schema's choices (by value, wherever it appears), every value out of a vault, the API key files'
contents. ansible-runner's own files (its private data directory with the ``-e`` values, its artifacts: the job
events, the command with the environment, the fact cache) live in a private temporary directory, on tmpfs where
the machine has ``/dev/shm``, removed when the run ends however it ends; the ``-e`` values reach ansible-playbook
as ``-e @FILE`` from there, never as ansible-runner's ``env/extravars``. The last :data:`KEEP_RUNS` run
directories are kept; older ones that specdeploy made are removed at the start of a run."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
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


KEEP_RUNS = 20  # run directories kept under .cache/runs (the newest ones)
POLL_WORKERS = 16  # hosts whose load or copy progress is read at once (ssh), however many hosts load
SCRUB_MIN = 4   # a secret value shorter than this is hidden where it is given, not searched for in other text


def _public(key, value) -> bool:
    """A ``-e`` value that is no secret: a number, a boolean, nothing, or one of the schema's choices for the
    variable it is given to (an engine name, a layout, a hardware profile)."""
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if not isinstance(value, str):
        return False
    import typing

    from specdeploy.hostvars.schema import HostVars
    field = HostVars.model_fields.get(str(key))
    if field is None:
        return False
    choices: set = set()
    todo = [field.annotation]
    while todo:
        a = todo.pop()
        if typing.get_origin(a) is typing.Literal:
            choices.update(typing.get_args(a))
        else:
            todo.extend(typing.get_args(a))
    return value in choices


def redact(extra: dict, vaulted: set[str] | frozenset = frozenset()) -> tuple[dict, set[str]]:
    """``-e`` values as they may be written down: every value is taken for a secret (a name does not say whether
    it is one: ``hf_tok``) except numbers, booleans and the schema's choices (:func:`_public`); a value whose
    key looks secret, that came from a vault (``vaulted``: top-level keys) or that is vault ciphertext is hidden
    whatever it is. Hidden values become ``<redacted>``. Also the plain text of every hidden value, to scrub from
    anything else written."""
    found: set[str] = set()

    def hide(value) -> str:
        if isinstance(value, dict):
            for v in value.values():
                hide(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                hide(v)
        elif value is not None and not isinstance(value, bool) and len(str(value)) >= SCRUB_MIN:
            found.add(str(value))
        return REDACTED

    def walk(obj, key, top: bool):
        if isinstance(obj, dict):
            return {k: hide(v) if secret_name(k) or (top and k in vaulted) else walk(v, k, False)
                    for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v, key, False) for v in obj]
        if isinstance(obj, str) and (obj.lstrip().startswith("$ANSIBLE_VAULT") or not (top and _public(key, obj))):
            return hide(obj)
        return obj
    return {k: hide(v) if secret_name(k) or k in vaulted else walk(v, k, True)
            for k, v in (extra or {}).items()}, found


def secret_values(inv) -> set[str]:
    """The secret values an inventory holds besides ``-e``: every value that came out of a vault, and the
    contents of the engine hosts' API key files (read as the deploy reads them, trailing white space dropped)."""
    from specdeploy.values.bounded import read_regular
    out = {s for s in getattr(inv, "secrets", ()) if len(s) >= SCRUB_MIN}
    for h in getattr(inv, "engine_hosts", ()):
        key = h.hv.specdeploy_api_key_file
        if key:
            try:
                text = read_regular(key, 64 << 10).decode("utf-8", "replace").rstrip()
            except (OSError, ValueError):
                continue
            if len(text) >= SCRUB_MIN:
                out.update({text, *[line.strip() for line in text.splitlines() if len(line.strip()) >= SCRUB_MIN]})
    return out


def private_dir(path: Path) -> Path:
    """A directory only its owner reads (0700 when this creates it; its parents as the umask makes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    return path


RUN_NAME = re.compile(r"\d{8}T\d{6}Z-(deploy|rollback|verify)(-\d+)?\Z")
RUN_FILES = {"events.jsonl", "runner"}  # what a run directory holds (runner: left by earlier releases)


def new_run_dir(base: Path, action: str, keep: int = KEEP_RUNS) -> Path:
    """A new run directory ``base/<UTC time>-<action>`` (0700; ``-2``, ``-3``... when the second is taken), after
    removing all but the newest ``keep - 1`` earlier ones. Only directories specdeploy made are removed: a name
    of its pattern holding nothing but a run's files."""
    base.mkdir(parents=True, exist_ok=True)
    prune_runs(base, keep - 1)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1, 1000):
        path = base / (f"{stamp}-{action}" + (f"-{n}" if n > 1 else ""))
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(str(base / f"{stamp}-{action}"))


def prune_runs(base: Path, keep: int) -> list[Path]:
    """Remove the run directories under ``base`` but the newest ``keep``; returns what was removed."""
    import shutil
    runs = []
    for p in base.iterdir():
        if RUN_NAME.match(p.name) and p.is_dir() and not p.is_symlink() \
                and {c.name for c in p.iterdir()} <= RUN_FILES:
            runs.append(p)
    runs.sort(key=lambda p: (p.name[:16], int(p.name.rsplit("-", 1)[1]) if p.name[-1].isdigit() else 1))
    gone = runs[:max(0, len(runs) - keep)]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def private_tmp(prefix: str = "specdeploy-run-") -> Path:
    """A new 0700 directory for what must not stay on disk: on tmpfs (``/dev/shm``) where the machine has it."""
    import tempfile
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=where))


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


def _fork_noise(unraisable) -> bool:
    """CPython 3.11's forked child, on its way to exec ansible-playbook, may report a lock another thread held at
    the fork as "Exception ignored ... RuntimeError: release unlocked lock" (the runner forks its pty while the
    progress poller runs): noise in the child, not an error of the run."""
    exc = unraisable.exc_value
    return isinstance(exc, RuntimeError) and str(exc) == "release unlocked lock" and \
        getattr(unraisable.object, "__name__", "") == "release"


def quiet_fork_noise() -> None:
    """Drop that one report (every other unraisable exception still goes to the hook there was)."""
    previous = sys.unraisablehook
    if getattr(previous, "_specdeploy_fork_noise", False):
        return

    def hook(unraisable):
        if not _fork_noise(unraisable):
            previous(unraisable)
    hook._specdeploy_fork_noise = True
    sys.unraisablehook = hook


class Run:
    """One ansible-runner run of a playbook, folded into per-host rows; every event goes to a JSON lines log."""

    def __init__(self, hosts: list[Target], events_path: Path, on_change: Callable[["Run", str], None] | None = None,
                 secrets: set[str] | frozenset = frozenset()):
        from specdeploy.values.outputs import create_exclusive
        self.rows = {t.host: HostRow(t.host) for t in hosts}
        self.targets = {t.host: t for t in hosts}
        self.events_path = events_path
        # the log may hold what the hosts answered: a new file, 0600, its new directories 0700 (values.outputs);
        # an existing file is refused, never appended to or narrowed
        fd = create_exclusive(events_path, "--events", "a new file path for the event log")
        self._log = os.fdopen(fd, "w")
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

    def scrub_all(self, obj):
        """``obj`` (a JSON-like value) with every secret value of the run replaced in its strings."""
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, dict):
            return {self.scrub(str(k)): self.scrub_all(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.scrub_all(v) for v in obj]
        return obj

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
        task = self.scrub(str(task))
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
                row.triage = self.scrub_all(facts["inference_engine_triage"])
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

    def poll_load(self, interval: float = 2.0, workers: int = POLL_WORKERS):
        """While a host stages weights or loads them, show progress: bytes, rate and ETA of the copy; shards,
        KV cache and CUDA graphs of the engine's load, read from its log. At most ``workers`` hosts are read at
        once (each read bounded by its own timeout): a fleet's rounds take longer, never more connections."""
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="progress") as pool:
            while not self.done.wait(interval):
                busy = [h for h, row in list(self.rows.items()) if row.phase in ("stage", "load") and not row.result]
                list(pool.map(self.poll_host, busy))

    def poll_host(self, host: str) -> None:
        row = self.rows[host]
        if row.phase == "stage" and not row.result:
            text = self.poll_stage(host)
            if text and text != row.progress:
                row.progress = text
                self.log(event="stage_progress", host=host, phase="stage", progress=text)
                if self.on_change:
                    self.on_change(self, host)
            return
        if row.phase != "load" or row.result:
            return
        lines = read_journal(self.targets[host])
        if lines is None:
            return
        p = parse_load(lines, time.time(), self.targets[host].engine)
        p = self.daemon_load(host) or p  # a full load of the weight-cache daemon this run started
        text = p.text()
        if text != row.progress:
            row.progress = text
            self.log(event="load_progress", host=host, phase="load", progress=asdict(p))
            if self.on_change:
                self.on_change(self, host)

    def daemon_load(self, host: str):
        """The weight-cache daemon's full load on ``host`` while it runs, when this run started it (its journal since
        its last start, begun after the run began, not yet at its ready line); else None."""
        from dataclasses import replace as _replace
        t = self.targets[host]
        if not getattr(t, "weight_cache_unit", None):
            return None
        lines = read_journal(_replace(t, unit=t.weight_cache_unit))
        if not lines or lines[0][0] is None or lines[0][0] < self.started:
            return None
        p = parse_load(lines, time.time(), t.engine, daemon=True)
        return None if p.stage == "ready" else p

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
                 vault=None, extra_files: list[str] | None = None, forks: int | None = None) -> int:
    """ansible-playbook through ansible-runner; ``vault`` (inventory_ansible.Vault): the vault secrets given to
    specdeploy, passed on with those of ansible.cfg and the environment; ``extra_files``: vaulted ``-e @FILE``s,
    handed on as files (ansible-playbook decrypts them). ``extra`` goes as ``-e @FILE`` from a private temporary
    file, and every file the runner writes stays in that temporary directory, removed when the run ends."""
    import json as _json
    import shutil

    import ansible_runner
    vault_args = vault.playbook_args() if vault is not None else []
    tmp = private_tmp()
    try:
        if extra:
            fd = os.open(tmp / "extra-vars.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                _json.dump(extra, f)
            vault_args += ["-e", f"@{tmp / 'extra-vars.json'}"]
        for f in extra_files or []:
            vault_args += ["-e", f"@{f}"]
        private_dir(tmp / "runner")
        quiet_fork_noise()
        poller = threading.Thread(target=run.poll_load, daemon=True)
        poller.start()
        thread, runner = ansible_runner.run_async(
            private_data_dir=str(tmp / "runner"), artifact_dir=str(tmp / "artifacts"),
            playbook=str(REPO / "ansible" / playbook), inventory=str(Path(inventory).resolve()), limit=limit,
            quiet=True, event_handler=run.event, envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
            project_dir=str(REPO), suppress_output_file=True, settings={"suppress_ansible_output": True},
            **({"forks": int(forks)} if forks else {}),
            **({"cmdline": shlex.join(vault_args)} if vault_args else {}))
        thread.join()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rc = runner.rc if runner.rc is not None else 2
    run.finish(rc)
    return rc
