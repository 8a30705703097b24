"""The operator's front door: deploy/rollback/verify through ansible-runner with one live row per host, the
engine's load progress read from its log, and the fleet's status from the exporters and Prometheus.

Everything here is independent of the terminal: ``cli/frontdoor.py`` draws it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from specdeploy.values import metrics as M

REPO = Path(__file__).resolve().parents[3]
PLAYBOOKS = {"deploy": "site.yml", "rollback": "rollback.yml", "verify": "verify.yml"}
PHASES = ("provision", "image", "stage", "start", "load", "ready", "gate")


# ---- engine load progress, from the engine's own log lines ----------------------------------------------
_SHARDS = re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)")
_KV_VLLM = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_KV_SGLANG = re.compile(r"KV Cache is allocated\. #tokens: (\d+)")
_GRAPHS = re.compile(r"(?:Capturing CUDA graphs?[^:]*|Capturing batches \([^)]*\)):\s+(\d+)%\|[^|]*\| (\d+)/(\d+)")
_GRAPHS_DONE = re.compile(r"Graph capturing finished in|Capture cuda graph end")
_READY = re.compile(r"Application startup complete|The server is fired up and ready to roll")


@dataclass
class LoadProgress:
    stage: str = "starting"          # starting, weights, kv-cache, cuda-graphs, ready
    shards: tuple[int, int] | None = None
    kv_tokens: int | None = None
    graphs: tuple[int, int] | None = None
    eta_s: float | None = None

    def text(self) -> str:
        parts = []
        if self.shards:
            parts.append(f"shards {self.shards[0]}/{self.shards[1]}")
        if self.kv_tokens is not None:
            parts.append(f"KV cache {self.kv_tokens:,} tok")
        if self.graphs:
            parts.append(f"CUDA graphs {self.graphs[0]}/{self.graphs[1]}")
        if self.stage == "ready":
            parts.append("ready")
        if self.eta_s is not None and self.stage != "ready":
            parts.append(f"ETA {fmt_s(self.eta_s)}")
        return ", ".join(parts) or self.stage


def fmt_s(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def parse_load(lines: list[tuple[float | None, str]], now: float | None = None) -> LoadProgress:
    """Progress of one engine start from its log lines [(unix time or None, text)], oldest first. The ETA
    extrapolates the current tqdm bar (weight shards, then CUDA graphs) from the log's own timestamps."""
    p = LoadProgress()
    bar_start: dict[str, tuple[float, int]] = {}
    last: dict[str, tuple[float, int, int]] = {}
    for t, line in lines:
        if m := _SHARDS.search(line):
            n, tot = int(m.group(2)), int(m.group(3))
            p.shards, p.stage = (n, tot), "weights"
            if t is not None:
                bar_start.setdefault("w", (t, n))
                last["w"] = (t, n, tot)
        elif m := (_KV_VLLM.search(line) or _KV_SGLANG.search(line)):
            p.kv_tokens, p.stage = int(m.group(1).replace(",", "")), "kv-cache"
        elif m := _GRAPHS.search(line):
            n, tot = int(m.group(2)), int(m.group(3))
            p.graphs, p.stage = (n, tot), "cuda-graphs"
            if t is not None:
                bar_start.setdefault("g", (t, n))
                last["g"] = (t, n, tot)
        elif _GRAPHS_DONE.search(line):
            p.stage = "cuda-graphs"
            if p.graphs:
                p.graphs = (p.graphs[1], p.graphs[1])
        if _READY.search(line):
            p.stage = "ready"
    bar = {"weights": "w", "cuda-graphs": "g"}.get(p.stage)
    if bar and bar in last and bar in bar_start:
        t0, n0 = bar_start[bar]
        t1, n1, tot = last[bar]
        if n1 > n0 and t1 > t0:
            rate = (n1 - n0) / (t1 - t0)
            p.eta_s = max(0.0, (tot - n1) / rate - ((now or t1) - t1))
    return p


def journal_lines(text: str, unit: str) -> list[tuple[float | None, str]]:
    """``journalctl -o short-unix`` output, from the unit's last start on."""
    out: list[tuple[float | None, str]] = []
    for raw in text.splitlines():
        ts, _, rest = raw.partition(" ")
        try:
            t = float(ts)
        except ValueError:
            t, rest = None, raw
        msg = rest.split(": ", 1)[1] if ": " in rest else rest
        if re.search(rf"(Starting|Started) {re.escape(unit.removesuffix('.service'))}", rest):
            out = []
        out.append((t, msg))
    return out


# ---- hosts ------------------------------------------------------------------------------------------------
@dataclass
class Target:
    host: str
    address: str
    engine: str
    engine_port: int
    exporter_port: int
    unit: str
    ssh: list[str]


def targets(inventory: str, limit: str | None = None, extra: dict | None = None,
            vault=None) -> tuple[list[Target], list[str]]:
    """Engine hosts with their ports and an ssh command line (from the same Ansible variables a play uses),
    and the monitoring hosts' addresses."""
    from specdeploy.hostvars.inventory import load
    from specdeploy.plan.render.paths import unit_name
    inv = load(inventory, limit=limit, extra=extra, vault=vault)
    out = []
    for h in inv.engine_hosts:
        v = h.vars
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3"]
        if v.get("ansible_ssh_private_key_file"):
            ssh += ["-i", str(v["ansible_ssh_private_key_file"])]
        if v.get("ansible_port"):
            ssh += ["-p", str(v["ansible_port"])]
        ssh += shlex.split(str(v.get("ansible_ssh_common_args") or ""))
        ssh.append(f"{v['ansible_user']}@{h.address}" if v.get("ansible_user") else h.address)
        out.append(Target(h.name, h.address, h.hv.specdeploy_engine, h.hv.specdeploy_port,
                          h.hv.specdeploy_exporter_port, unit_name(h.hv.specdeploy_engine), ssh))
    mon = [str(inv.all_vars.get(m, {}).get("ansible_host", m)) for m in inv.monitoring_hosts]
    return out, mon


def read_journal(t: Target, timeout: float = 8) -> list[tuple[float | None, str]] | None:
    try:
        r = subprocess.run(t.ssh + [f"journalctl -u {t.unit} -o short-unix --no-pager -n 3000"],
                           capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return journal_lines(r.stdout, t.unit) if r.returncode == 0 else None


# ---- deploy / rollback / verify through ansible-runner ---------------------------------------------------
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


def phase_of(role: str, task: str, play: str) -> str | None:
    role, task, play = role or "", task or "", play or ""
    if role == "gpu_host" or play.startswith("Provision"):
        return "provision"
    if role in ("engine_image", "nccl_tune") or play.startswith("Build"):
        return "image"
    if role in ("model_store", "drafter"):
        return "stage"
    if role == "speculation_gate":
        return "gate"
    if role == "inference_engine":
        if re.search(r"readiness|health endpoint", task, re.I):
            return "load"
        if re.search(r"chat completion|Check the generation|Record the|current release", task, re.I) \
                and "Read" not in task:
            return "ready"
        if re.search(r"Roll back|rollback|Swap", task, re.I):
            return "rollback"
        return "start"
    if role == "spec_exporter":
        return "ready"
    if play.startswith("Roll back") or "Roll back" in task:
        return "rollback"
    if play.startswith("Verify"):
        return "ready"
    return None


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
            ph = phase_of(d.get("role", ""), task, d.get("play", ""))
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
        from specdeploy.hostscripts.staging import controller_log, rsync_progress
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
                p = parse_load(lines, time.time())
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


# ---- status -----------------------------------------------------------------------------------------------
# Every exporter and Prometheus is an untrusted peer: each request has its own total deadline and size cap
# (peerhttp), all of them run at once, and a host that answers garbage is one bad row, never a dead command.
def scrape_exporter(t: Target, timeout: float = 2.0) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    from specdeploy.values.peerhttp import PeerError, text
    row: dict[str, Any] = {"host": t.host, "address": t.address, "reachable": False}
    where = f"exporter {t.address}:{t.exporter_port}"
    try:
        page = text(f"http://{t.address}:{t.exporter_port}/metrics", timeout)
    except PeerError as exc:
        row["reachable"] = exc.reason.startswith(("HTTP ", "an HTML", "binary", "not UTF-8", "answer"))
        row["error"] = f"{where}: {exc.reason}"
        return row
    row["reachable"] = True
    seen: dict[str, Any] = {}
    try:
        for fam in text_string_to_metric_families(page):
            for s in fam.samples:
                if s.name == "specdeploy_engine_up":
                    seen["up"] = bool(s.value)
                elif s.name == "specdeploy_engine_info":
                    seen.update(engine=s.labels.get("engine"), version=s.labels.get("version"),
                                release=s.labels.get("release") or None,
                                speculation="on" if s.labels.get("spec_tokens") not in ("0", "", None) else "off",
                                spec_tokens=s.labels.get("spec_tokens"))
                elif s.name == "specdeploy_spec_acceptance_length":
                    seen["acceptance_length"] = s.value
                elif s.name == "specdeploy_spec_acceptance_rate":
                    seen["acceptance_rate"] = s.value
                elif s.name == "specdeploy_gate_verdict" and s.value == 1:
                    seen["gate"] = s.labels.get("verdict")
    except Exception as exc:  # noqa: BLE001 - the parser raises bare ValueErrors and more on garbage
        row["error"] = f"{where}: not a metrics page ({str(exc).splitlines()[0][:60] if str(exc) else 'garbage'})"
        return row
    if "up" not in seen:
        row["error"] = f"{where}: no specdeploy_engine_up (not a specdeploy exporter?)"
        return row
    row.update(seen)
    return row


PROM_QUERIES = {"tokens_per_s": M.q_tokens_per_s("1m"), "ttft_p50": M.q_ttft(0.5, "5m"),
                "ttft_p99": M.q_ttft(0.99, "5m"), "restarts": M.Q_RESTARTS}


def prom_query(base: str, q: str, timeout: float = 3.0) -> dict[str, float]:
    """Instant query -> {host: value} (NaN results dropped); a PeerError for anything but a vector answer."""
    from specdeploy.values.peerhttp import PeerError, json_object
    url = f"{base.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    data = json_object(url, timeout)
    result = (data.get("data") or {}).get("result") if isinstance(data.get("data"), dict) else None
    if data.get("status") != "success" or not isinstance(result, list):
        raise PeerError(url, f"not a Prometheus query answer ({str(data.get('error') or 'no result')[:60]})")
    out = {}
    for r in result:
        try:
            v = float(r["value"][1])
            host = r["metric"].get("host", "")
        except (TypeError, KeyError, IndexError, ValueError, AttributeError):
            raise PeerError(url, "a malformed sample in the Prometheus answer") from None
        if v == v:
            out[str(host)] = v
    return out


def fleet_status(hosts: list[Target], prometheus: list[str], timeout: float = 2.0) -> dict:
    """One row per host from its exporter, with serving figures from Prometheus. Every request runs at once with
    its own ``timeout`` as a total deadline, so the whole call takes about ``timeout``, however peers behave."""
    from concurrent.futures import wait
    jobs = len(hosts) + len(prometheus) * len(PROM_QUERIES)
    ex = ThreadPoolExecutor(max_workers=max(1, min(64, jobs)))
    try:
        rows_f = [ex.submit(scrape_exporter, t, timeout) for t in hosts]
        prom_f = {base: {k: ex.submit(prom_query, base, q, timeout) for k, q in PROM_QUERIES.items()}
                  for base in prometheus}
        # the deadline is inside each request; this bound only guards against a queue longer than the pool
        wait(rows_f + [f for fs in prom_f.values() for f in fs.values()], timeout=timeout * (1 + jobs // 64) + 2)
        rows = []
        for t, f in zip(hosts, rows_f):
            if f.done() and not f.exception():
                rows.append(f.result())
            else:
                why = f"{f.exception()}"[:80] if f.done() else f"no answer within {timeout:g} s"
                rows.append({"host": t.host, "address": t.address, "reachable": False,
                             "error": f"exporter {t.address}:{t.exporter_port}: {why}"})
        prom_used, prom_errors = None, []
        figures: dict[str, dict[str, float]] = {}
        for base, fs in prom_f.items():
            bad = [f"{getattr(f.exception(), 'reason', f.exception())}" if f.done() else
                   f"no answer within {timeout:g} s" for f in fs.values() if not f.done() or f.exception()]
            if bad:
                prom_errors.append(f"{base}: {bad[0]}")
                continue
            figures = {k: f.result() for k, f in fs.items()}
            prom_used = base
            break
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
    for row in rows:
        for k, by_host in figures.items():
            if row["host"] in by_host:
                row[k] = by_host[row["host"]]
    return {"time": time.time(), "prometheus": prom_used, "prometheus_errors": prom_errors, "hosts": rows}


def prometheus_urls(monitoring: list[str], explicit: str | None) -> list[str]:
    return [explicit] if explicit else [f"http://{m}:9090" for m in monitoring]
