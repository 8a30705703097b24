"""The commands a deploy runs on a simulated fleet host (testing/fleethost.py), answered from the host's state as
the real command answers: the stdlib host scripts (converged check and record, staging), ``specdeploy ready`` and
``drafter``, the host's python3, venvs and pip, journalctl, dpkg-query and the probe's ``docker run``. On the
controller (a task delegated to localhost), the copies to hosts (rsync) land in the target host's state and the
wheelhouse is named, not built. A command nobody taught the simulator fails loudly (rc 127), never silently."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import time
from pathlib import Path

from specdeploy.testing.fleethost import HOST_PYTHON, FleetHost, sha1

MAX_TREE_FILES = 5000  # a controller tree an rsync sends (the build context): bounded
CONTROLLER = ("localhost", "127.0.0.1", "::1")


def _scripts() -> dict[str, str]:
    from specdeploy.hostscripts import converged, files, staging
    out = {}
    for mod in (converged, staging, files):
        out[sha1(Path(mod.__file__).read_text())] = Path(mod.__file__).stem
    return out


_SCRIPTS: dict[str, str] | None = None


def call(host: FleetHost, module: str, args: dict) -> dict:
    """A module call on ``host``: the command and shell modules here, every other module in FleetHost."""
    if module.rsplit(".", 1)[-1] in ("command", "shell"):
        return run(host, args)
    return host.call(module, args)


def run(host: FleetHost, args: dict) -> dict:
    """The command module's result for ``args`` (argv or a command line, stdin, creates/removes)."""
    argv = args.get("argv")
    raw = args.get("_raw_params") or args.get("cmd") or ""
    shell = bool(args.get("_uses_shell"))
    if not argv:
        try:
            argv = shlex.split(raw) if not shell else ["/bin/sh", "-c", raw]
        except ValueError:
            argv = ["/bin/sh", "-c", raw]
    argv = [str(a) for a in argv]
    t0 = time.time()
    for key, exists in (("creates", True), ("removes", False)):
        p = args.get(key)
        if p and (host.get(p) is not None) == exists:
            why = "exists" if exists else "does not exist"
            return {"changed": False, "rc": 0, "stdout": f"skipped, since {p} {why}", "stderr": "", "cmd": argv,
                    "msg": f"Did not run command since '{p}' {why}"}
    rc, out, err, changed = answer(host, argv, str(args.get("stdin") or ""), shell)
    res = {"changed": changed, "rc": rc, "stdout": out.rstrip("\n") if args.get("strip_empty_ends", True) else out,
           "stderr": err.rstrip("\n"), "cmd": argv, "start": time.strftime("%Y-%m-%d %H:%M:%S"),
           "end": time.strftime("%Y-%m-%d %H:%M:%S"), "delta": f"0:00:{time.time() - t0:09.6f}", "msg": ""}
    if rc != 0:
        res.update(failed=True, msg="non-zero return code")
    return res


def answer(host: FleetHost, argv: list[str], stdin: str, shell: bool) -> tuple[int, str, str, bool]:
    """(rc, stdout, stderr, changed) of one command on ``host``."""
    global _SCRIPTS
    if _SCRIPTS is None:
        _SCRIPTS = _scripts()
    if host.name in CONTROLLER:
        return controller(host, argv)
    text = " ".join(argv)
    if len(argv) >= 2 and argv[1] == "-" and stdin:
        script = (_SCRIPTS or {}).get(sha1(stdin)) or (_SCRIPTS or {}).get(sha1(stdin + "\n"))
        if script == "converged":
            return converged(host, argv[2:])
        if script == "staging":
            return staging(host, argv[2:])
        if script == "files":
            return files(host, argv[2:])
        return 127, "", "fleetsim: a script on stdin that is not one of specdeploy's host scripts", False
    if argv[0].endswith("python3") and len(argv) > 2 and argv[1] == "-c" and "platform" in argv[2]:
        return 0, HOST_PYTHON + "\n", "", True
    if argv[:3] == ["python3", "-m", "venv"] and len(argv) == 4:
        venv = argv[3]
        for f in ("bin/python", "bin/pip"):
            host.write(f"{venv}/{f}", f"#!{venv}/bin/python3\n", "0755")
        return 0, "", "", True
    if shell and " install " in text and "pip" in text:
        return pip_install(host, argv[-1])
    if argv[0].endswith("/bin/specdeploy") and len(argv) > 1:
        return specdeploy(host, argv[1:])
    if argv[:2] == ["mv", "-T"] and len(argv) == 4:
        return move(host, argv[2], argv[3])
    if argv[0] == "rsync":
        return rsync_local(host, argv)
    if argv[0] == "journalctl":
        unit = argv[argv.index("-u") + 1] if "-u" in argv else ""
        return 0, "\n".join(host.s.get("journal", {}).get(unit, [])) + "\n", "", True
    if argv[:2] == ["dpkg-query", "-W"] and len(argv) == 4:
        pkg = argv[3]
        if pkg not in host.s["packages"]:
            return 1, "", f"dpkg-query: no packages found matching {pkg}", True
        return 0, ("install ok installed" if "Status" in argv[2] else host.s["packages"][pkg]), "", True
    if argv[:2] == ["docker", "run"]:  # the engine probe, in the release's image: a host without GPUs says so
        return (125, "", "docker: Error response from daemon: could not select device driver \"\" with capabilities:"
                " [[gpu]].", True)
    return 127, "", f"fleetsim: no simulated answer for: {text[:300]}", True


# ---------------------------------------------------------------- host scripts
def converged(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    """hostscripts/converged.py on the host's state: the same arguments, the same record and comparison."""
    from specdeploy.hostscripts import converged as script
    ap = argparse.ArgumentParser(prog="converged")
    ap.add_argument("action", choices=["check", "record"])
    ap.add_argument("--state", default=script.LEGACY_STATE)
    ap.add_argument("--digest", required=True)
    for flag in ("--root", "--skip", "--link", "--unit", "--url", "--expect", "--reason"):
        ap.add_argument(flag, action="append", default=[])
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    snap = host.snapshot(a.root, a.skip + [a.state], a.link, a.unit)
    if a.action == "record":
        if a.reason:
            return 0, json.dumps({"recorded": False, "reasons": a.reason}), "", True
        bad = [u for u, s in snap["units"].items() if "ActiveState=active" not in s]
        if bad:
            return 0, json.dumps({"recorded": False, "reasons": [f"unit {u} is not active" for u in bad]}), "", True
        host.write(a.state, json.dumps({"digest": a.digest, **snap}, sort_keys=True))
        return 0, json.dumps({"recorded": True, "files": len(snap["files"]), "units": sorted(snap["units"])}), "", True
    reasons = list(a.reason)
    text = host.read(a.state)
    old = None
    try:
        old = json.loads(text) if text is not None else None
    except ValueError:
        old = None
    if old is None:
        reasons.append("no record of a completed deploy on this host")
    else:
        if old.get("digest") != a.digest:
            reasons.append("the deploy's inputs changed (variables, -e, inventory, code or controller weights)")
        reasons += script._diff(old, snap)
        reasons += [f"unit {u} needs a daemon-reload" for u, s in snap["units"].items() if "NeedDaemonReload=yes" in s]
        expects = a.expect + [""] * (len(a.url) - len(a.expect))
        for url, expect in zip(a.url, expects):
            status, body = host.http(url)
            if status != 200 or (expect and expect not in body):
                reasons.append(f"{url} answered {status} without {expect!r}")
    if reasons and old is not None and not a.keep:
        host.remove(a.state)
    return 0, json.dumps({"converged": not reasons, "reasons": reasons}), "", True


def staging(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    """hostscripts/staging.py's host-source steps on the host's state: the weights are there (a fleet's hosts hold
    their checkpoints); precheck and verify pass, id names the directory, switch flips a link."""
    if not argv:
        return 2, "", "staging: an action is required", False
    action, rest = argv[0], argv[1:]
    if action == "precheck":
        return 0, "", "", False
    if action == "verify":
        return 0, "ok: 64 weight files, 595.00 GB, 0 hashed\n", "", False
    if action == "id":
        return 0, "w" + sha1(rest[0])[:16] + "\n", "", False
    if action == "switch":
        link, target = rest[0], rest[1]
        prev = (host.get(link) or {}).get("target")
        host.link(link, target)
        return 0, json.dumps({"changed": prev != target, "previous": prev, "target": target}), "", True
    return 2, "", f"fleetsim: staging {action} is not simulated (a controller or shared weight source)", False


def files(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    """hostscripts/files.py on the host's state: ``dirs`` makes each directory or puts its mode and owner back
    (what would change under --check), ``read`` gives each file's text ("" where absent)."""
    from specdeploy.testing.fleethost import _attrs
    if argv[:1] == ["read"]:
        return 0, json.dumps({p: host.read(p) or "" for p in argv[1:]}), "", False
    if argv[:1] != ["dirs"]:
        return 2, "", "files: dirs or read", False
    check, changed = "--check" in argv, []
    for spec in (a for a in argv[1:] if a != "--check"):
        path, mode, owner = spec.rsplit(":", 2)
        e = host.get(host.resolve(path))  # a link to a directory is followed, as on a host
        if e is not None and e["t"] != "d":
            return 1, "", f"specdeploy host files: {path} is there and is not a directory", False
        if e is None:
            changed.append(path)
            if not check:
                host.mkdirs(path, mode, owner)
        elif e["mode"] != mode or e["owner"] != owner:
            changed.append(path)
            if not check:
                _attrs(e, mode, owner)
    return 0, json.dumps({"changed": changed}), "", bool(changed)


# ---------------------------------------------------------------- specdeploy on the host
def specdeploy(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    if argv[0] == "ready":
        return ready(host, argv[1:])
    if argv[:2] == ["drafter", "convert"]:
        out = argv[argv.index("--out") + 1]
        from specdeploy.values.hostpaths import CONVERSION_RECORD
        host.write(f"{out}/config.json", json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
        host.write(f"{out}/{CONVERSION_RECORD}", json.dumps({"converted": True}))
        return 0, json.dumps({"ok": True, "out": out, "changed": []}), "", True
    if argv[:2] == ["drafter", "check"]:
        return 0, json.dumps({"ok": True, "findings": []}), "", False
    return 127, "", f"fleetsim: specdeploy {' '.join(argv[:2])} is not simulated", False


def ready(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    """``specdeploy ready --unit U ...``: ready when the engine unit runs; crashed (exit 1, its journal) when the
    fault made it die during the load."""
    unit = argv[argv.index("--unit") + 1] if "--unit" in argv else ""
    u = host.s["units"].get(unit) or {}
    slow = float(host.fault().get("slow_s") or 0)
    if slow > 0:
        time.sleep(min(slow, 30.0))
    if u.get("crashed"):
        journal = crash_journal(host, unit)
        host.s.setdefault("journal", {})[unit] = journal
        o = {"status": "crashed", "unit": unit, "elapsed_s": 41.0 + slow, "detail": "the unit failed during the load "
             "(exit status 1)", "state": {"ActiveState": "failed"}, "journal": journal[-12:]}
        return 1, json.dumps(o), "", False
    if not u.get("active"):
        o = {"status": "crashed", "unit": unit, "elapsed_s": 0.0, "detail": "the unit is not running",
             "state": {"ActiveState": "inactive"}, "journal": []}
        return 1, json.dumps(o), "", False
    o = {"status": "ready", "unit": unit, "elapsed_s": 38.0 + slow, "detail": "healthy; answered: Speculative "
         "decoding drafts tokens with a small model and verifies them with the large one.", "state": {},
         "journal": []}
    return 0, json.dumps(o), "", False


def crash_journal(host: FleetHost, unit: str) -> list[str]:
    """The engine's own multi-worker crash log (the simulator's, in the engine's format) for the release the unit
    runs: the journal a real crash leaves, which the deploy's triage reads."""
    from specdeploy.testing.simulator import crash_log
    argv = host.read(f"/etc/specdeploy/{unit.removesuffix('.service')}.argv") or ""
    engine = "sglang" if "sglang" in unit else "vllm"
    version = "0.16.0"
    for line in (host.read(f"/etc/systemd/system/{unit}") or "").splitlines():
        if line.startswith("# Managed by specdeploy:"):
            parts = line.split()
            version = parts[4] if len(parts) > 4 else version
    model = argv.split()[2] if len(argv.split()) > 2 else "/models/model"
    return crash_log(engine, version, model, 3, 8).splitlines()


def pip_install(host: FleetHost, script: str) -> tuple[int, str, str, bool]:
    for line in script.splitlines():
        line = line.strip()
        if line.startswith("PIP="):
            pip = shlex.split(line[4:])[0]
            venv = os.path.dirname(os.path.dirname(pip))
            host.write(f"{venv}/bin/specdeploy", f"#!{venv}/bin/python\n", "0755")
            return 0, "", "", True
        if "pip" in line and "sglang-router" in line:
            venv = os.path.dirname(os.path.dirname(shlex.split(line)[0]))
            host.write(f"{venv}/bin/smg", f"#!{venv}/bin/python\n", "0755")
            return 0, "", "", True
    return 127, "", "fleetsim: a pip install this simulator does not know", False


def move(host: FleetHost, src: str, dst: str) -> tuple[int, str, str, bool]:
    src, dst = os.path.normpath(src), os.path.normpath(dst)
    moved = {p: e for p, e in host.files.items() if p == src or p.startswith(src + "/")}
    if not moved:
        return 1, "", f"mv: cannot stat '{src}': No such file or directory", False
    for p, e in moved.items():
        del host.files[p]
        host.files[dst + p[len(src):]] = e
    return 0, "", "", True


def rsync_local(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    """``rsync -a [--delete] SRC/ DEST/`` within the host."""
    src, dest = os.path.normpath(argv[-2]), os.path.normpath(argv[-1])
    tree = {p[len(src):]: dict(e) for p, e in host.files.items() if p.startswith(src + "/")}
    return 0, "", "", apply_tree(host, dest, tree, "--delete" in argv)


def apply_tree(host: FleetHost, dest: str, tree: dict[str, dict], delete: bool) -> bool:
    """Make ``dest`` hold ``tree`` (relative path -> entry); True when anything changed."""
    changed = host.mkdirs(dest)
    for rel, e in tree.items():
        p = dest + rel
        if host.files.get(p) != e:
            if e["t"] != "d":
                host.mkdirs(os.path.dirname(p))
            host.files[p] = e
            changed = True
    if delete:
        for p in [p for p in host.files if p.startswith(dest + "/") and p[len(dest):] not in tree]:
            del host.files[p]
            changed = True
    return changed


# ---------------------------------------------------------------- the controller side of a delegated task
def controller(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    if "specdeploy.cli" in argv and "wheelhouse" in argv:
        target = argv[argv.index("--target") + 1] if "--target" in argv else ""
        return 0, wheelhouse_stamp(target) + "\n", "", False
    if "specdeploy.ops.copy" in argv and "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if argv and argv[0] == "rsync":
        return rsync_to_host(host, argv)
    return 127, "", f"fleetsim: no simulated controller command for: {' '.join(argv)[:300]}", False


_STAMP: str | None = None


def wheelhouse_stamp(target: str) -> str:
    """The stamp ``specdeploy wheelhouse`` prints (ops/wheelhouse.py: the source hash and the target); the
    wheelhouse itself is not built, and nothing is written in the controller's cache."""
    global _STAMP
    if _STAMP is None:
        from specdeploy.ops.wheelhouse import source_hash
        _STAMP = source_hash()
    return _STAMP + (f"-{target.strip()}" if target else "")


def rsync_to_host(host: FleetHost, argv: list[str]) -> tuple[int, str, str, bool]:
    """``rsync -a ... SRC USER@ADDR:DEST`` from the controller: SRC as the controller has it (the repository's
    build context, read), or a wheelhouse, which this simulator names without building (a few stand-in files per
    stamp); the target host is found by its address (``addresses.json`` of the simulated fleet)."""
    args = [a for a in argv[1:] if a not in ("--itemize-changes",)]
    src, dest = args[-2], args[-1]
    addr, _, path = dest.rpartition(":")
    addr = addr.rpartition("@")[2]
    try:
        names = json.loads((host.dir / "addresses.json").read_text())
    except (OSError, ValueError):
        names = {}
    target = names.get(addr)
    if target is None:
        return 255, "", f"ssh: connect to host {addr} port 22: No route to host (not a simulated host)", False
    tree = controller_tree(src)
    if tree is None:
        return 23, "", f'rsync: [sender] change_dir "{src}" failed: No such file or directory (2)', False
    other = FleetHost(host.dir, target)
    with other.session():
        base = os.path.normpath(path)
        before = {p: e for p, e in other.files.items() if p == base or p.startswith(base + "/")}
        changed = apply_tree(other, base, tree, "--delete" in argv)
        sent = sorted(rel for rel, e in tree.items() if before.get(base + rel) != e)
    out = "".join(f"<f+++++++++ {rel.lstrip('/')}\n" for rel in sent) if changed else ""
    return 0, out, "", changed


def controller_tree(src: str) -> dict[str, dict] | None:
    """Relative path -> entry of what rsync sends from ``src`` on the controller."""
    root = Path(src)
    if "/.cache/wheelhouse/" in src.replace("\\", "/") and not root.exists():
        stamp = wheelhouse_stamp(root.name)
        files = {"/specdeploy-0-py3-none-any.whl": stamp, "/requirements-host.txt": "typer\n", "/STAMP": stamp}
        return {rel: {"t": "f", "mode": "0644", "owner": "root", "sha1": sha1(c), "content": None}
                for rel, c in files.items()}
    if not root.is_dir():
        return None
    out: dict[str, dict] = {}
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            p = Path(d) / name
            rel = "/" + str(p.relative_to(root)) if src.endswith("/") else f"/{root.name}/{p.relative_to(root)}"
            st = p.stat()
            out[rel] = {"t": "f", "mode": "0644", "owner": "root", "sha1": sha1(f"{st.st_size}:{st.st_mtime_ns}"),
                        "content": None}
            if len(out) > MAX_TREE_FILES:
                return out
    return out
