"""One simulated fleet host: what the module calls of a real deploy do to a host, kept as per-host state in a JSON
file, so that the playbooks' controller side (the same plays, filters, serving-group logic and serial batches)
runs against hundreds of hosts on one machine (docs/fleet.md).

The connection plugin (``testing/fleet_plugins/specdeploy_fleetsim.py``) hands every module call here (commands
through ``testing/fleethost_commands.py``): the module's
name and arguments as Ansible sent them (decoded from the AnsiballZ payload, nothing run), and the few shell lines
Ansible runs itself (its temporary directory). The answer is the module's JSON result as the real module gives it:
``changed`` only when the state changed, so that a second deploy reports changed=0. Nothing here touches the
controller's /etc, systemd or docker: a host is a dict of files, units, packages and images under ``state_dir``.

Faults are the world's, not the inventory's: ``<state_dir>/faults.json`` maps a host to what goes wrong there
(``crash_when``: the engine crashes during its load when its installed release holds that text, with the
engine's real multi-worker crash log in its journal; ``unreachable``: every connection fails; ``slow_s``: its
engine takes that long to become ready)."""
from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

# units that packages or the base system provide (a unit file under /etc/systemd/system is the deploy's own)
PACKAGE_UNITS = {"prometheus-node-exporter": "prometheus-node-exporter.service", "prometheus": "prometheus.service",
                 "grafana": "grafana-server.service", "datacenter-gpu-manager-exporter": "nvidia-dcgm-exporter.service"}
BASE_UNITS = {"docker.service", "ssh.service"}
FACTS = {"distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.8",
         "distribution_release": "bookworm", "os_family": "Debian", "architecture": "x86_64", "system": "Linux",
         "kernel": "6.1.0-28-amd64", "python_version": "3.11.2", "processor_vcpus": 128,
         "memtotal_mb": 2063836, "pkg_mgr": "apt", "service_mgr": "systemd"}
HOST_PYTHON = "3.11:x86_64:2.36"  # what the host's python3 reports to the common role (its wheelhouse target)
MAX_STATE = 64 << 20


class Unreachable(Exception):
    """The host does not answer (a fault): the connection plugin raises Ansible's connection failure."""


def sha1(text: str | bytes) -> str:
    return hashlib.sha1(text.encode() if isinstance(text, str) else text).hexdigest()


class FleetHost:
    def __init__(self, state_dir: str | os.PathLike, name: str):
        self.dir = Path(state_dir)
        self.name = name
        self.path = self.dir / "hosts" / f"{name}.json"
        self.s: dict = {}

    # ---------------------------------------------------------------- state
    @contextmanager
    def session(self):
        """The host's state, locked for one module call and written back after it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self.s = json.loads(self.path.read_text()) if self.path.exists() else {}
            except ValueError:
                self.s = {}
            for k in ("files", "units", "packages", "images", "users", "tmp"):
                self.s.setdefault(k, {})
            self.s.setdefault("calls", 0)
            self.s["calls"] += 1
            yield self
            text = json.dumps(self.s, sort_keys=True)
            if len(text) > MAX_STATE:
                raise RuntimeError(f"fleetsim: the state of {self.name} grew past {MAX_STATE} bytes")
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, self.path)

    def fault(self) -> dict:
        try:
            faults = json.loads((self.dir / "faults.json").read_text())
        except (OSError, ValueError):
            return {}
        got = faults.get(self.name) if isinstance(faults, dict) else None
        return got if isinstance(got, dict) else {}

    # ---------------------------------------------------------------- files
    @property
    def files(self) -> dict:
        return self.s["files"]

    def get(self, path: str) -> dict | None:
        return self.files.get(os.path.normpath(path))

    def resolve(self, path: str) -> str:
        p = os.path.normpath(path)
        for _ in range(16):
            e = self.files.get(p)
            if e is None or e["t"] != "l":
                return p
            p = os.path.normpath(os.path.join(os.path.dirname(p), e["target"]))
        return p

    def mkdirs(self, path: str, mode: str = "0755", owner: str = "root") -> bool:
        path = os.path.normpath(path)
        changed = False
        parts = path.strip("/").split("/") if path != "/" else []
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in self.files:
                self.files[p] = {"t": "d", "mode": mode if i == len(parts) else "0755",
                                 "owner": owner if i == len(parts) else "root"}
                changed = True
        return changed

    def write(self, path: str, content: str, mode: str | None = None, owner: str | None = None) -> bool:
        path = os.path.normpath(path)
        self.mkdirs(os.path.dirname(path))
        old = self.files.get(path)
        new = {"t": "f", "mode": mode or (old or {}).get("mode", "0644"), "owner": owner or (old or {}).get(
            "owner", "root"), "sha1": sha1(content), "content": content}
        self.files[path] = new
        return old != new

    def read(self, path: str) -> str | None:
        e = self.files.get(self.resolve(path))
        return e.get("content") if e is not None and e["t"] == "f" else None

    def remove(self, path: str) -> bool:
        path = os.path.normpath(path)
        gone = [p for p in self.files if p == path or p.startswith(path + "/")]
        for p in gone:
            del self.files[p]
        return bool(gone)

    def link(self, path: str, target: str) -> bool:
        path = os.path.normpath(path)
        self.mkdirs(os.path.dirname(path))
        old = self.files.get(path)
        new = {"t": "l", "target": target, "mode": "0777", "owner": "root"}
        self.files[path] = new
        return old != new

    # ---------------------------------------------------------------- units
    def unit(self, name: str) -> dict | None:
        if name in self.s["units"]:
            return self.s["units"][name]
        if self.unit_exists(name):
            self.s["units"][name] = {"active": False, "enabled": False, "loaded": self.unit_sha(name)}
            return self.s["units"][name]
        return None

    def unit_file(self, name: str) -> str:
        return f"/etc/systemd/system/{name}"

    def unit_sha(self, name: str) -> str:
        e = self.get(self.unit_file(name))
        return e.get("sha1", "") if e else ""

    def unit_exists(self, name: str) -> bool:
        if name in BASE_UNITS or self.get(self.unit_file(name)) is not None:
            return True
        return any(u == name and p in self.s["packages"] for p, u in PACKAGE_UNITS.items())

    def unit_status(self, name: str) -> dict:
        u = self.unit(name)
        if u is None:
            return {"LoadState": "not-found", "ActiveState": "inactive", "NeedDaemonReload": "no",
                    "UnitFileState": ""}
        crashed = u.get("crashed", False)
        return {"LoadState": "loaded", "ActiveState": "failed" if crashed else "active" if u["active"] else "inactive",
                "SubState": "failed" if crashed else "running" if u["active"] else "dead",
                "NeedDaemonReload": "yes" if u.get("loaded", "") != self.unit_sha(name) else "no",
                "UnitFileState": "enabled" if u["enabled"] else "disabled", "Id": name}

    def engine_release_text(self) -> str:
        """What the engine's unit starts: the unit, env and argv files specdeploy installed (its release)."""
        return "\n".join(e.get("content") or "" for p, e in sorted(self.files.items())
                         if e["t"] == "f" and (p.startswith("/etc/specdeploy/") or
                                               p.startswith("/etc/systemd/system/specdeploy-")))

    def start(self, name: str) -> None:
        u = self.unit(name)
        u["active"] = True
        u["crashed"] = False
        u["starts"] = u.get("starts", 0) + 1
        when = self.fault().get("crash_when")
        if name.startswith("specdeploy-") and name != "specdeploy-exporter.service" and when \
                and when in self.engine_release_text():
            u["crashed"] = True  # it starts, then dies during its load (readiness sees it)

    def engine_healthy(self) -> bool:
        engines = [n for n, u in self.s["units"].items() if n.startswith("specdeploy-") and n not in
                   ("specdeploy-exporter.service",)]
        return any(self.s["units"][n]["active"] and not self.s["units"][n].get("crashed") for n in engines)

    # ---------------------------------------------------------------- converged (the host script's snapshot)
    def snapshot(self, roots: list[str], skip: list[str], links: list[str], units: list[str]) -> dict:
        """What hostscripts/converged.py's snapshot reads on a real host, read from this host's state."""
        def under(p: str, r: str) -> bool:
            if r.endswith("*"):
                return p.startswith(r[:-1])
            return p == r or p.startswith(r.rstrip("/") + "/")
        files = {}
        for p, e in self.files.items():
            if e["t"] == "d" or not any(under(p, r) for r in roots) or any(under(p, s) for s in skip):
                continue
            files[p] = f"{e['mode']}:{e['owner']}:" + (f"-> {e['target']}" if e["t"] == "l" else e.get("sha1", ""))
        names = sorted({os.path.basename(p) for p in self.files if p.startswith("/etc/systemd/system/specdeploy")
                        and p.endswith(".service")} | {u for u in units if self.unit_exists(u)})
        state = {}
        for u in names:
            st = self.unit_status(u)
            state[u] = (f"Id={u}\nActiveState={st['ActiveState']}\nUnitFileState={st['UnitFileState']}\n"
                        f"NeedDaemonReload={st['NeedDaemonReload']}")
        docker = {"images": sorted(f"{t} {i['id']}" for t, i in self.s["images"].items() if t.startswith("specdeploy"))}
        return {"files": files, "links": {p: (self.get(p) or {}).get("target", "") for p in links}, "units": state,
                "docker": docker}

    # ---------------------------------------------------------------- HTTP as the host answers it
    def http(self, url: str) -> tuple[int, str]:
        """(status, body) of a URL asked from this host: its own exporter, Prometheus and router answer as their
        units run; anything off the host is unreachable (a simulated host reaches no internet)."""
        from urllib.parse import urlsplit
        u = urlsplit(url)
        if u.hostname not in ("127.0.0.1", "localhost", "::1"):
            return -1, "Request failed: <urlopen error [Errno 101] Network is unreachable>"
        exporter = self.s["units"].get("specdeploy-exporter.service", {})
        if u.path == "/metrics" and exporter.get("active"):
            up = 1.0 if self.engine_healthy() else 0.0
            return 200, f"# TYPE specdeploy_engine_up gauge\nspecdeploy_engine_up {up}\n"
        if u.path == "/-/ready" and self.s["units"].get("prometheus.service", {}).get("active"):
            return 200, "Prometheus Server is Ready.\n"
        if u.path == "/workers" and self.s["units"].get("specdeploy-router.service", {}).get("active"):
            return 200, json.dumps({"workers": self.s.get("router_workers", [])})
        if u.path == "/api/health" and self.s["units"].get("grafana-server.service", {}).get("active"):
            return 200, json.dumps({"database": "ok"})
        if u.path not in ("/metrics", "/-/ready", "/workers", "/api/health") and self.engine_healthy():
            return 200, ""  # the engine's own health and API paths
        return -1, f"Request failed: <urlopen error [Errno 111] Connection refused> ({u.path})"

    # ---------------------------------------------------------------- the module calls
    def call(self, module: str, args: dict) -> dict:
        name = module.rsplit(".", 1)[-1]
        fn = getattr(self, f"m_{name}", None) if name not in ("command", "shell") else None
        if fn is None:
            return {"failed": True, "msg": f"fleetsim: no simulated module {module} (add it to testing/fleethost.py; "
                    "commands: testing/fleethost_commands.call)"}
        return fn(args)

    def m_ping(self, args):
        return {"ping": args.get("data", "pong"), "changed": False}

    def m_setup(self, args):
        facts = {f"ansible_{k}": v for k, v in FACTS.items()}
        facts.update(ansible_hostname=self.name.split(".")[0], ansible_fqdn=self.name, ansible_nodename=self.name,
                     ansible_python={"executable": "/usr/bin/python3", "version": {"major": 3, "minor": 11}},
                     ansible_date_time={"epoch": str(int(time.time()))}, module_setup=True)
        return {"ansible_facts": facts, "changed": False}

    def m_stat(self, args):
        path = args["path"]
        p = self.resolve(path) if args.get("follow") else os.path.normpath(path)
        e = self.files.get(p)
        if e is None:
            return {"changed": False, "stat": {"exists": False}}
        st = {"exists": True, "path": path, "mode": e["mode"], "pw_name": e["owner"], "gr_name": e["owner"],
              "uid": 0, "gid": 0, "isdir": e["t"] == "d", "isreg": e["t"] == "f", "islnk": e["t"] == "l",
              "size": len((e.get("content") or "").encode()), "mtime": 0.0}
        if e["t"] == "l":
            st["lnk_target"] = st["lnk_source"] = e["target"]
        if e["t"] == "f" and args.get("get_checksum", True):
            st["checksum"] = e["sha1"]
        return {"changed": False, "stat": st}

    def m_slurp(self, args):
        text = self.read(args["src"])
        if text is None:
            return {"failed": True, "msg": f"file not found: {args['src']}"}
        return {"changed": False, "content": base64.b64encode(text.encode()).decode(), "encoding": "base64",
                "source": args["src"]}

    def m_file(self, args):
        path = os.path.normpath(args.get("path") or args.get("dest"))
        state = args.get("state") or ("file" if path in self.files else "file")
        mode = _mode(args.get("mode"))
        owner = args.get("owner")
        e = self.files.get(path)
        if state == "absent":
            return {"changed": self.remove(path), "path": path, "state": "absent"}
        if state == "directory":
            changed = self.mkdirs(path)
            e = self.files[path]
            if e["t"] != "d":
                return {"failed": True, "msg": f"{path} already exists as a {e['t']}"}
            changed |= _attrs(e, mode, owner)
            return {"changed": changed, "path": path, "state": "directory", "mode": e["mode"]}
        if state == "link":
            return {"changed": self.link(path, args["src"]), "dest": path, "state": "link"}
        if state == "touch":
            changed = e is None
            if e is None:
                self.write(path, "", mode)
            return {"changed": changed | _attrs(self.files[path], mode, owner), "dest": path}
        if e is None:
            return {"failed": True, "msg": f"file ({path}) is absent, cannot continue", "path": path}
        return {"changed": _attrs(e, mode, owner), "path": path, "state": "file" if e["t"] == "f" else e["t"]}

    def m_copy(self, args):
        dest = args["dest"]
        src = args.get("src")
        content = self.s["tmp"].pop(src, None) if src else None
        if content is None:
            return {"failed": True, "msg": f"fleetsim: copy without a transferred source ({src})"}
        if dest.endswith("/"):
            dest = dest + (args.get("_original_basename") or os.path.basename(src))
        e = self.files.get(os.path.normpath(dest))
        if e is not None and e["t"] == "d":
            dest = os.path.join(dest, args.get("_original_basename") or os.path.basename(src))
        changed = self.write(dest, content, _mode(args.get("mode")), args.get("owner"))
        return {"changed": changed, "dest": dest, "checksum": sha1(content), "state": "file",
                "mode": self.files[os.path.normpath(dest)]["mode"], "size": len(content.encode())}

    def m_systemd_service(self, args):
        name = args.get("name")
        if args.get("daemon_reload") and not name:
            return self._daemon_reload() or {"changed": True}
        if not name.endswith((".service", ".timer", ".socket", ".target")):
            name += ".service"
        if args.get("daemon_reload"):
            self._daemon_reload()
        u = self.unit(name)
        if u is None:
            if args.get("state") in ("stopped", None) and not args.get("enabled"):
                return {"changed": False, "name": name, "status": self.unit_status(name)}
            return {"failed": True, "msg": f"Could not find the requested service {name}: host"}
        changed = False
        if args.get("enabled") is not None and bool(args["enabled"]) != u["enabled"]:
            u["enabled"] = bool(args["enabled"])
            changed = True
        state = args.get("state")
        if state == "started" and not u["active"]:
            self.start(name)
            changed = True
        elif state == "restarted":
            self.start(name)
            changed = True
        elif state == "reloaded":
            changed = True
        elif state == "stopped" and (u["active"] or u.get("crashed")):
            u["active"], u["crashed"] = False, False
            changed = True
        return {"changed": changed, "name": name, "state": state, "enabled": u["enabled"],
                "status": self.unit_status(name)}

    m_systemd = m_systemd_service

    def _daemon_reload(self):
        for n, u in self.s["units"].items():
            u["loaded"] = self.unit_sha(n)

    def m_user(self, args):
        name = args["name"]
        changed = name not in self.s["users"]
        self.s["users"][name] = {"system": bool(args.get("system")), "home": args.get("home")}
        return {"changed": changed, "name": name, "state": "present"}

    def m_apt(self, args):
        names = args.get("name") or args.get("pkg") or []
        names = [names] if isinstance(names, str) else list(names)
        if args.get("deb"):
            names.append(os.path.basename(args["deb"]).split("_")[0])
        changed = False
        if args.get("state", "present") not in ("present", "latest"):
            return {"failed": True, "msg": f"fleetsim: apt state {args.get('state')} is not simulated"}
        for n in names:
            pkg, _, version = n.partition("=")
            want = version or self.s["packages"].get(pkg, "1")
            if self.s["packages"].get(pkg) != want:
                self.s["packages"][pkg] = want
                changed = True
        return {"changed": changed, "cache_updated": False}

    def m_dpkg_selections(self, args):
        held = self.s.setdefault("held", [])
        changed = args["name"] not in held
        if changed:
            held.append(args["name"])
        return {"changed": changed, "before": "install", "after": args.get("selection")}

    def m_uri(self, args):
        status, body = self.http(args["url"])
        want = args.get("status_code") or [200]
        want = [int(x) for x in (want if isinstance(want, list) else [want])]
        out = {"changed": False, "status": status, "url": args["url"], "msg": "OK" if status == 200 else body}
        if status == 200 and args.get("return_content", False):
            out["content"] = body
        if status == 200 and body.startswith("{"):
            out["json"] = json.loads(body)
        if status not in want:
            out.update(failed=True, msg=f"Status code was {status} and not {want}: {body}")
        return out

    def m_docker_image_info(self, args):
        names = args.get("name") or []
        names = [names] if isinstance(names, str) else names
        return {"changed": False, "images": [self.s["images"][n]["info"] for n in names if n in self.s["images"]]}

    def m_docker_image(self, args):
        tag = args["name"]
        build = args.get("build") or {}
        labels = {"io.specdeploy.source": str((build.get("args") or {}).get("SPECDEPLOY_SOURCE", "unknown"))}
        info = {"RepoTags": [tag], "Id": "sha256:" + sha1(json.dumps([tag, build], sort_keys=True, default=str)),
                "Config": {"Labels": labels}}
        old = self.s["images"].get(tag)
        if old is not None and not args.get("force_source") and args.get("source") != "build":
            return {"changed": False, "image": old["info"]}
        changed = old is None or old["info"] != info or bool(args.get("force_source"))
        self.s["images"][tag] = {"info": info, "id": info["Id"][7:19]}
        return {"changed": changed, "image": info, "actions": [f"Built image {tag} from {build.get('path')}"]}

    def m_docker_image_load(self, args):
        return {"changed": True, "image_names": [], "images": []}


def _mode(mode) -> str | None:
    if mode is None:
        return None
    s = str(mode)
    if s.isdigit():
        return ("0" + s.lstrip("0")).rjust(4, "0") if len(s) <= 4 else s
    return s


def _attrs(e: dict, mode: str | None, owner: str | None) -> bool:
    changed = False
    if mode and e.get("mode") != mode:
        e["mode"] = mode
        changed = True
    if owner and e.get("owner") != owner:
        e["owner"] = owner
        changed = True
    return changed
