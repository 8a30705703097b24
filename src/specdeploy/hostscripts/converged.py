"""Converged-state check for a no-op deploy.

At the end of a successful full deploy each host records a state file: the digest of every input of the deploy
(computed on the controller) and a snapshot of what the deploy manages there (sha256, mode and owner of every file
under the managed roots, link targets, the weights each link points at by names, sizes and mtimes, the specdeploy
systemd units with their active/enabled/reload state, the specdeploy docker images and containers). A later run
recomputes the digest on the controller and, in one call per host, takes the same snapshot and compares it with
the record, and probes the health URLs. Anything different (or any doubt) and the full deploy runs.

Controller side: :func:`inputs_digest`, :func:`check_args`. Host side: this file run as a plain script with the
host's python3 (standard library only): ``python3 - check|record --state FILE --digest D [--root P]... ``.

Each inventory host keeps its own record (``RECORDS/<host>.json``, :func:`state_path`): two inventory names on one
machine (an engine host that is also the monitoring host) check, remove and write their records at the same time,
and one record file for both raced (a check removed the record the other had just removed). The records' directory
is never part of a snapshot, and a file that vanishes while a snapshot walks past it (another writer's temporary
file) is left out rather than failing the check.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import urllib.request

RECORDS = "/var/lib/specdeploy/converged"
LEGACY_STATE = "/var/lib/specdeploy/converged.json"  # one record per machine, written by earlier releases
BIG = 64 << 20  # larger files (weights, converted drafters) are fingerprinted by size and mtime, as the deploy does
# role defaults whose directories hold files the deploy writes (read from ansible/roles/*/defaults/main/role.yml)
ROOT_DEFAULTS = {"engine": ["inference_engine_state"], "router": ["router_venv"],
                 "monitoring": ["monitoring_prometheus_dir", "monitoring_grafana_provisioning_dir",
                                "monitoring_grafana_dashboards_dir"]}
FIXED_ROOTS = ["/etc/specdeploy", "/etc/systemd/system/specdeploy*", "/opt/specdeploy"]
SKIP_NAMES = {"__pycache__"}


# ---------------------------------------------------------------- controller side

def _sha_file(path: str, h) -> None:
    st = os.stat(path)
    if st.st_size > BIG:
        h.update(f"{path}\0size {st.st_size} mtime {st.st_mtime_ns}\0".encode())
        return
    h.update(f"{path}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def _hash_tree(root: str, h) -> None:
    if os.path.isfile(root):
        _sha_file(root, h)
        return
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_NAMES and x != ".git")
        for name in sorted(files):
            p = os.path.join(d, name)
            if name.endswith(".pyc") or not os.path.isfile(p):
                continue
            _sha_file(p, h)


def inputs_digest(repo: str, package_dir: str, inventory_sources: list[str], extra_vars: list[str],
                  input_files: list[str], weights_ids: list[str]) -> str:
    """sha256 over everything a deploy renders from: the playbooks, roles, templates, Dockerfiles and the core's
    code; the inventory files; the -e arguments as given (and the @files they name); files the variables point
    at (API key, passwords: their content); the controller copies of the weights (names, sizes, mtimes)."""
    h = hashlib.sha256()
    for part in ["ansible", "templates", "docker", "monitoring", "ansible.cfg", "pyproject.toml"]:
        p = os.path.join(repo, part)
        if os.path.exists(p):
            _hash_tree(p, h)
    _hash_tree(package_dir, h)
    for src in sorted(set(inventory_sources)):
        h.update(f"inventory {src}\0".encode())
        if os.path.exists(src):
            _hash_tree(src, h)
    for e in extra_vars:
        h.update(f"extra {e}\0".encode())
        if e.startswith("@") and os.path.isfile(e[1:]):
            _sha_file(e[1:], h)
    for f in sorted(set(input_files)):
        h.update(f"file {f}\0".encode())
        if os.path.isfile(f):
            _sha_file(f, h)
    for w in weights_ids:
        h.update(f"weights {w}\0".encode())
    return h.hexdigest()


def role_defaults(roles_dir: str, resolve=None) -> dict[str, str]:
    """Plain string defaults of the roles, by variable name. A templated one counts only where ``resolve`` (the
    controller's, e.g. for the host-path filter) turns it into plain text; others are left out."""
    import yaml
    out: dict[str, str] = {}
    for f in sorted(glob.glob(os.path.join(roles_dir, "*", "defaults", "main", "role.yml"))):
        with open(f) as fh:
            data = yaml.safe_load(fh) or {}
        for k, v in data.items():
            if isinstance(v, str) and "{{" in v and resolve is not None:
                v = resolve(v)
            if isinstance(v, str) and "{{" not in v:
                out[k] = v
    return out


def state_path(host: str) -> str:
    """The record of one inventory host: its name made safe for a file name, with a hash of the name itself so
    that two names that map to one safe name keep two records."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:64].lstrip(".") or "_"
    return f"{RECORDS}/{safe}-{hashlib.sha256(host.encode()).hexdigest()[:8]}.json"


def check_args(variables: dict, groups: list[str], defaults: dict[str, str], engine: dict | None,
               host: str | None = None) -> list[str]:
    """Arguments of the host-side snapshot: managed roots, weight links, venv markers, health URLs, and where
    ``host``'s record lives. ``engine``: the host's validated engine variables (None when it serves no engine)."""
    def var(name: str) -> str:
        v = variables.get(name)
        return str(v) if isinstance(v, str) and v else defaults[name]
    roots = list(FIXED_ROOTS)
    args: list[str] = ["--unit", "prometheus-node-exporter.service"]
    if host is not None:
        args += ["--state", state_path(host)]
    if engine is not None:
        roots += [var(n) for n in ROOT_DEFAULTS["engine"]]
        venv = engine["venv"]
        args += ["--skip", venv, "--root", f"{venv}/.specdeploy-stamp", "--root", f"{venv}/bin/python"]
        for link in engine["links"]:
            args += ["--link", link]
        if engine.get("serves", True):
            args += ["--url", f"http://127.0.0.1:{engine['exporter_port']}/metrics", "--expect",
                     "specdeploy_engine_up 1.0"]
        else:  # a rank that joins a leader serves no HTTP: its unit runs, and the leader's health speaks for it
            args += ["--unit", engine["unit"]]
    if "specdeploy_routers" in groups:
        rv = var("router_venv")
        args += ["--skip", rv, "--root", f"{rv}/bin/smg", "--root", f"{rv}/bin/python"]
        if engine is not None:
            args += ["--url", f"http://127.0.0.1:{engine['router_port']}/workers", "--expect", ""]
    if "specdeploy_monitoring" in groups:
        roots += [var(n) for n in ROOT_DEFAULTS["monitoring"]]
        url = str(variables.get("monitoring_prometheus_url") or defaults["monitoring_prometheus_url"])
        args += ["--unit", "prometheus.service", "--url", url.rstrip("/") + "/-/ready", "--expect", ""]
    for r in roots:
        args += ["--root", r]
    return args


# ---------------------------------------------------------------- host side

def _entry(path: str) -> str:
    st = os.lstat(path)
    head = f"{stat.S_IMODE(st.st_mode):o}:{st.st_uid}:{st.st_gid}"
    if stat.S_ISLNK(st.st_mode):
        return f"{head}:link:{os.readlink(path)}"
    if stat.S_ISDIR(st.st_mode):
        return f"{head}:dir"
    if not stat.S_ISREG(st.st_mode):
        return f"{head}:other"
    if st.st_size > BIG:
        return f"{head}:big:{st.st_size}:{st.st_mtime_ns}"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"{head}:sha256:{h.hexdigest()}"


def _walk(root: str, skip: set[str], out: dict[str, str]) -> None:
    def entry(path: str) -> None:
        try:
            out[path] = _entry(path)
        except FileNotFoundError:  # gone while we walked past it (another writer's temporary file)
            pass
    skip = skip | {RECORDS, LEGACY_STATE}
    for top in sorted(glob.glob(root)) or [root]:
        if top in skip:
            continue
        if not os.path.lexists(top):
            out[top] = "missing"
            continue
        entry(top)
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_NAMES and os.path.join(d, x) not in skip)
            for name in sorted(dirs) + sorted(files):
                p = os.path.join(d, name)
                if p in skip or name.endswith(".pyc") or name.startswith(".converged."):
                    continue
                entry(p)


def _fingerprint(path: str) -> str:
    """What a weights link points at: the target and its files' names, sizes and mtimes (how the deploy itself
    tells copies apart; weights are not read)."""
    if not os.path.lexists(path):
        return "missing"
    target = os.readlink(path) if os.path.islink(path) else ""
    h = hashlib.sha256()
    for d, dirs, files in os.walk(path, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(d, name)
            try:
                st = os.stat(p)
            except OSError:
                h.update(f"{p} gone\n".encode())
                continue
            h.update(f"{os.path.relpath(p, path)} {st.st_size} {st.st_mtime_ns}\n".encode())
    return f"{target}:{h.hexdigest()}"


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"error: {exc}"


def snapshot(roots: list[str], skip: list[str], links: list[str], units: list[str]) -> dict:
    files: dict[str, str] = {}
    for r in roots:
        _walk(r, set(skip), files)
    units = sorted({os.path.basename(p) for p in glob.glob("/etc/systemd/system/specdeploy*.service")}
                   | {u for u in units if any(os.path.exists(f"{d}/{u}") for d in ("/lib/systemd/system",
                                                                                  "/etc/systemd/system"))})
    shown = _run(["systemctl", "show", "-p", "Id,ActiveState,UnitFileState,NeedDaemonReload", *units]) if units else ""
    state = {u: s for u, s in zip(units, shown.strip().split("\n\n"))} if units else {}
    docker = {}
    if os.path.exists("/usr/bin/docker") and os.path.exists("/var/run/docker.sock"):
        images = _run(["docker", "image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}"])
        docker = {"images": sorted(x for x in images.splitlines() if x.startswith("specdeploy")),
                  "containers": sorted(_run(["docker", "ps", "-a", "--format",
                                             "{{.Names}} {{.Image}} {{.State}}"]).splitlines())}
    return {"files": files, "links": {p: _fingerprint(p) for p in links}, "units": state, "docker": docker}


def _probe(url: str, expect: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode(errors="replace")
            if r.status != 200 or (expect and expect not in body):
                return f"{url} answered {r.status} without {expect!r}"
    except Exception as exc:  # noqa: BLE001 - any failure means: run the full deploy
        return f"{url}: {exc}"
    return ""


def _diff(old: dict, new: dict, limit: int = 8) -> list[str]:
    out = []
    for section in ("files", "links", "units", "docker"):
        a, b = old.get(section, {}), new.get(section, {})
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out.append(f"{section} {k}: {'changed' if k in a and k in b else 'new' if k in b else 'gone'}")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="converged")
    ap.add_argument("action", choices=["check", "record"])
    ap.add_argument("--state", default=LEGACY_STATE, help="this inventory host's record (state_path)")
    ap.add_argument("--digest", required=True)
    ap.add_argument("--root", action="append", default=[])
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--link", action="append", default=[])
    ap.add_argument("--unit", action="append", default=[], help="a unit the deploy keeps running, if installed")
    ap.add_argument("--url", action="append", default=[])
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--reason", action="append", default=[], help="the controller already knows: run the full path")
    ap.add_argument("--keep", action="store_true", help="check: leave a stale record in place (--check runs)")
    a = ap.parse_args(argv)
    snap = snapshot(a.root, a.skip + [a.state], a.link, a.unit)
    if a.action == "record":
        if a.reason:
            print(json.dumps({"recorded": False, "reasons": a.reason}))
            return 0
        bad = [u for u, s in snap["units"].items() if "ActiveState=active" not in s]
        if bad:  # a unit the deploy keeps running is down: record nothing, so the next run is a full one
            print(json.dumps({"recorded": False, "reasons": [f"unit {u} is not active" for u in bad]}))
            return 0
        d, name = os.path.split(a.state)
        os.makedirs(d, mode=0o755, exist_ok=True)
        tmp = os.path.join(d, f".converged.{name}.{os.getpid()}.tmp")  # one per writer, never in a snapshot
        with open(tmp, "w") as f:
            json.dump({"digest": a.digest, **snap}, f, sort_keys=True)
        os.replace(tmp, a.state)
        if a.state != LEGACY_STATE and os.path.lexists(LEGACY_STATE):
            os.unlink(LEGACY_STATE)  # an earlier release's record (ours): no run reads it any more
        print(json.dumps({"recorded": True, "files": len(snap["files"]), "units": sorted(snap["units"])}))
        return 0
    reasons: list[str] = list(a.reason)
    try:
        with open(a.state) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = None
        reasons.append("no record of a completed deploy on this host")
    if old is not None:
        if old.get("digest") != a.digest:
            reasons.append("the deploy's inputs changed (variables, -e, inventory, code or controller weights)")
        reasons += _diff(old, snap)
        reasons += [f"unit {u} needs a daemon-reload" for u, s in snap["units"].items()
                    if "NeedDaemonReload=yes" in s]
        expects = a.expect + [""] * (len(a.url) - len(a.expect))
        reasons += [p for p in (_probe(u, e) for u, e in zip(a.url, expects)) if p]
    if reasons and old is not None and not a.keep:
        try:  # the full deploy runs now; until it completes, no run may trust the old record
            os.unlink(a.state)
        except FileNotFoundError:
            pass
    print(json.dumps({"converged": not reasons, "reasons": reasons}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
