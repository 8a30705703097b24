"""A simulated fleet for the playbooks (docs/fleet.md): an inventory of N engine hosts made from
``inventory/example``, whose connection is the test-only ``specdeploy_fleetsim`` plugin (every module call answered
by ``testing/fleethost.py`` from per-host state), and the real ``ansible-playbook ansible/deploy.yml`` run against
it with the controller's CPU and wall time measured. The same plays, filters, serving-group logic and serial
batches run as in a real deploy; no host is reached and nothing on the controller outside the state directory and
the inventory is written.

Used by the fleet tests (a few tens of hosts, seconds) and ``bench/fleet_scale.py`` (8 to 1,024 hosts)."""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
PLUGINS = Path(__file__).resolve().parent / "fleet_plugins"
CONNECTION = "specdeploy_fleetsim"
RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                   r"\s+rescued=(\d+)\s+ignored=(\d+)", re.M)
MAX_HOSTS = 20000
# "1" in a run's environment: the simulated hosts count module calls from workers forked from an unfrozen controller
# heap (``unfrozen_module_calls`` in a host's state; the connection plugin's probe)
FREEZE_PROBE = "SPECDEPLOY_FLEETSIM_FREEZE_PROBE"


def host_names(n: int) -> list[str]:
    return [f"gpu-{i:04d}" for i in range(n)]


def address(i: int) -> str:
    """A loopback address of its own per host (127.0.0.0/8 is loopback on Linux; nothing listens unless a test
    serves it, as the status test does)."""
    return f"127.1.{i // 250}.{i % 250 + 1}"


def index(addr: str) -> int:
    """The host number whose :func:`address` ``addr`` is."""
    _, _, a, b = (int(x) for x in addr.split("."))
    return a * 250 + b - 1


def write_inventory(dest: Path, state: Path, n: int, group_size: int = 1, extra_group_vars: dict | None = None,
                    monitoring: bool = True) -> Path:
    """``dest``: inventory/example's variables for ``n`` engine hosts (``group_size`` > 1: serving groups of
    that many hosts, tensor parallel across them) and one monitoring host, each at an address of its own.
    ``state``: the simulator's state directory (its ``addresses.json`` maps addresses to hosts)."""
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"a simulated fleet has 1 to {MAX_HOSTS} hosts, not {n}")
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} hosts do not split into serving groups of {group_size}")
    dest.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    names = host_names(n)
    children: dict = {}
    if group_size == 1:
        children["specdeploy_engines"] = {"hosts": {h: {"ansible_host": address(i)} for i, h in enumerate(names)}}
    else:
        groups = {}
        for g in range(n // group_size):
            members = names[g * group_size:(g + 1) * group_size]
            groups[f"group_{g:04d}"] = {"hosts": {h: {"ansible_host": address(names.index(h))} for h in members},
                                        "vars": {"specdeploy_group": f"group-{g:04d}"}}
        children["specdeploy_engines"] = {"children": groups}
    if monitoring:
        children["specdeploy_monitoring"] = {"hosts": {"mon-1": {"ansible_host": "127.1.250.1",
                                                                 "specdeploy_sandbox": True}}}
    (dest / "hosts.yml").write_text("# A simulated fleet (specdeploy.testing.fleetsim).\n"
                                    + yaml.safe_dump({"all": {"children": children}}, sort_keys=False))
    gv = yaml.safe_load((REPO / "inventory/example/group_vars/specdeploy_engines.yml").read_text())
    key = state / "api-key"
    key.write_text("fleetsim-key-0123456789abcdef\n")
    key.chmod(0o600)
    gv.update({
        "specdeploy_api_key_file": str(key),
        "specdeploy_model_config_copy": str(REPO / "examples/models/kimi-k2.5-int4"),
        "specdeploy_drafter_config_copy": str(REPO / "examples/models/kimi-k2.5-eagle3"),
        # the gate measures a real engine under load from the controller: nothing to measure in a simulated host
        "specdeploy_spec_gate": False,
    })
    if group_size > 1:
        gv.update({"specdeploy_topology": "tp", "specdeploy_rdma": True})
    gv.update(extra_group_vars or {})
    (dest / "group_vars").mkdir(exist_ok=True)
    (dest / "group_vars/specdeploy_engines.yml").write_text(yaml.safe_dump(gv, sort_keys=False))
    (state / "addresses.json").write_text(json.dumps({address(i): h for i, h in enumerate(names)}
                                                     | ({"127.1.250.1": "mon-1"} if monitoring else {})))
    return dest


def set_faults(state: Path, faults: dict[str, dict]) -> None:
    """What goes wrong on which host (testing/fleethost.py): ``{"gpu-0003": {"crash_when": "...",}}``."""
    (state / "faults.json").write_text(json.dumps(faults))


def environment(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"SPECDEPLOY_FLEETSIM_STATE": str(state), "ANSIBLE_CONNECTION_PLUGINS": str(PLUGINS),
                "PYTHONPATH": str(REPO / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
                "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"})
    env.pop("ANSIBLE_CONFIG", None)
    return env


@dataclass
class Run:
    """One ansible(-playbook) run: its exit status, the recap per host, the controller's wall and CPU seconds
    (ansible's process and every worker it forked)."""
    rc: int
    wall_s: float
    cpu_s: float
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    output: str = ""

    @property
    def changed(self) -> int:
        return sum(r["changed"] for r in self.recap.values())

    @property
    def failed_hosts(self) -> list[str]:
        return [h for h, r in self.recap.items() if r["failed"] or r["unreachable"]]


def run(argv: list[str], state: Path, timeout: float = 3600, log: Path | None = None,
        env_extra: dict[str, str] | None = None) -> Run:
    """Run an ansible command line from the repository with the simulator's connection; measure it."""
    env = environment(state)
    env.update(env_extra or {})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log, "w") if log else open(os.devnull, "w") as sink:
        p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                           errors="replace")
        sink.write(p.stdout + p.stderr)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    recap = {m.group(1): dict(zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored"),
                                  map(int, m.groups()[1:]))) for m in RECAP.finditer(p.stdout)}
    return Run(p.returncode, wall, cpu, recap, p.stdout + p.stderr)


def playbook(inventory: Path, state: Path, playbook: str = "ansible/deploy.yml", extra: list[str] | None = None,
             forks: int | None = None, timeout: float = 3600, log: Path | None = None, tags: str | None = None,
             env_extra: dict[str, str] | None = None) -> Run:
    argv = [_tool("ansible-playbook"), "-i", str(inventory), playbook, "-e", f"ansible_connection={CONNECTION}"]
    for e in extra or []:
        argv += ["-e", e]
    if forks:
        argv += ["-f", str(forks)]
    if tags:
        argv += ["--tags", tags]
    return run(argv, state, timeout, log, env_extra)


def ping(inventory: Path, state: Path, forks: int | None = None, timeout: float = 3600) -> Run:
    """The baseline: a bare ``ansible -m ping`` over the same engine hosts and connection."""
    argv = [_tool("ansible"), "-i", str(inventory), "specdeploy_engines", "-m", "ping",
            "-e", f"ansible_connection={CONNECTION}"]
    if forks:
        argv += ["-f", str(forks)]
    r = run(argv, state, timeout)
    r.recap = {m.group(1): {"ok": 1, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 0, "rescued": 0,
                            "ignored": 0} for m in re.finditer(r"^(\S+) \| SUCCESS", r.output, re.M)}
    return r


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def host_state(state: Path, host: str) -> dict:
    """A simulated host's state as the deploy left it (files, units, packages, images)."""
    p = state / "hosts" / f"{host}.json"
    return json.loads(p.read_text()) if p.exists() else {}


def serving_release(state: Path, host: str) -> str:
    """The release the host's engine serves: its ``current`` mark, when its engine unit runs healthy; '' when
    it serves nothing."""
    from specdeploy.values.hostpaths import host_path
    s = host_state(state, host)
    files, units = s.get("files", {}), s.get("units", {})
    engines = [u for n, u in units.items() if n.startswith("specdeploy-") and n != "specdeploy-exporter.service"]
    if not any(u.get("active") and not u.get("crashed") for u in engines):
        return ""
    cur = files.get(host_path("current"), {}).get("content") or ""
    return cur.strip()


class Exporters:
    """Every simulated host's spec exporter on one port: a threaded HTTP server on all addresses of the loopback
    range that answers ``/metrics`` as the exporter of the host whose address the client asked (the socket's
    local address), for ``specdeploy status`` at a fleet's size. ``behaviour`` maps an address to ``slow``
    (answers after ``slow_s``), ``garbage``, ``down`` (the engine is down) or a release id; the rest serve
    ``release``. Only clients on the loopback range are answered. Counts the most requests in flight at once."""

    def __init__(self, behaviour: dict[str, str] | None = None, release: str = "r1", slow_s: float = 5.0,
                 page=None):
        """``page``: a function of the address that gives the whole page instead (bench/fleet_report.py)."""
        import http.server
        import socketserver
        import threading
        self.behaviour, self.release, self.slow_s = dict(behaviour or {}), release, slow_s
        if page is not None:
            self.page = page
        self.lock, self.inflight, self.peak, self.asked = threading.Lock(), 0, 0, set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if not self.client_address[0].startswith("127."):
                    self.close_connection = True
                    return
                addr = self.request.getsockname()[0]
                with outer.lock:
                    outer.inflight += 1
                    outer.peak = max(outer.peak, outer.inflight)
                    outer.asked.add(addr)
                try:
                    body = outer.page(addr).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass
                finally:
                    with outer.lock:
                        outer.inflight -= 1

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            request_queue_size = 1024

        self.server = Server(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def page(self, addr: str) -> str:
        what = self.behaviour.get(addr, self.release)
        if what == "slow":
            time.sleep(self.slow_s)
            what = self.release
        if what == "garbage":
            return "\x00\x01 not metrics {{{\n"
        up = 0.0 if what == "down" else 1.0
        release = self.release if what == "down" else what
        return ("# TYPE specdeploy_engine_up gauge\n"
                f"specdeploy_engine_up {up}\n"
                "# TYPE specdeploy_engine_info gauge\n"
                f'specdeploy_engine_info{{engine="vllm",version="0.16.0",release="{release}",spec_tokens="3"}} 1.0\n'
                "# TYPE specdeploy_spec_acceptance_length gauge\n"
                "specdeploy_spec_acceptance_length 2.6\n")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
