"""The writing side of the security classes (robust_security): hostile output targets for every command that
writes, the same writers against system paths inside a private mount namespace, writers racing each other, and
the state file two regate runs share."""
from __future__ import annotations

import json
import os
import random
import typing
from pathlib import Path


import robust_cases as rc
from robust_security import TRACEBACK, SecCase, alerts_body, child_env, fill, no_network, with_peer


# --- class: output targets --------------------------------------------------------------------------------------

def _results(ctx):
    p = Path(ctx["root"]) / "r.json"
    p.write_text(json.dumps(rc._tune_results()))


# command -> (argv with {t}, what it writes, setup); each is refused before any work when {t} is not its own
WRITERS = {
    "plan": (["plan", "-i", "{inv}", "--out", "{t}"], "dir", None),
    "gate": (["gate", "--url", "{closed}", "--out", "{t}"], "dir", None),
    "canary": (["canary", "-i", "{inv}", "--host", "gpu-a", "--out", "{t}"], "dir", None),
    "convert": (["drafter", "convert", "{models}/drafter", "--target", "{models}/target", "--engine", "vllm",
                 "--out", "{t}"], "dir", None),
    "standin": (["engine", "standin", "--engine", "vllm", "--version", "0.16.0", "--out", "{t}"], "dir", None),
    "wheelhouse": (["wheelhouse", "--out", "{t}", "--target", "3.11:x86_64:2.36"], "dir", None),
    "tune": (["nccl", "tune", "--gpus", "1", "--only", "default", "--no-aa", "--modes", "eager", "--iters", "1",
              "--out", "{t}"], "file", None),
    "tuner-csv": (["nccl", "choose", "{root}/r.json", "--tuner-csv", "{t}"], "file", _results),
    "chart": (["nccl", "choose", "{root}/r.json", "--chart", "{t}"], "png", _results),
    "host-vars": (["nccl", "choose", "{root}/r.json", "--write-host-vars", "{t}"], "edit", _results),
    "report": (["report", "--prometheus", "{closed}", "--out", "{t}"], "png", None),
    "events": (["verify", "-i", "{inv}", "--events", "{t}"], "log", None),
    "state": (["regate", "-i", "{inv}", "--prometheus", "{closed}", "--dry-run", "--state", "{t}"], "file", None),
}


def _victim_file(p: Path, seed: int) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(random.Random(seed).randbytes(300) + b"\n# the operator's own\n")
    p.chmod(0o640)


def _victim_dir(p: Path, seed: int, names=("notes.txt", "sub/data.bin")) -> None:
    for i, n in enumerate(names):
        _victim_file(p / n, seed + i)
    for d in {(p / n).parent for n in names} - {p}:
        d.chmod(0o750)


def _target_kinds() -> dict[str, typing.Callable[[dict, str], str]]:
    """kind -> setup(ctx, name) returning the target path; each makes something the tool did not create."""
    def at(ctx, name):
        return Path(ctx["victim"]) / name

    def file(ctx, name):
        _victim_file(at(ctx, name), 1)
        return str(at(ctx, name))

    def directory(ctx, name):
        _victim_dir(at(ctx, name), 2)
        return str(at(ctx, name))

    def lookalike(ctx, name):  # a directory holding files named as an output's, without its marker
        _victim_dir(at(ctx, name), 3, ("report.json", "prometheus/prometheus.yml", "canary.json", "config.json"))
        return str(at(ctx, name))

    def link_file(ctx, name):
        _victim_file(Path(ctx["victim"]) / "elsewhere" / "precious", 4)
        at(ctx, name).symlink_to(Path(ctx["victim"]) / "elsewhere" / "precious")
        return str(at(ctx, name))

    def link_dir(ctx, name):
        _victim_dir(Path(ctx["victim"]) / "elsewhere", 5)
        at(ctx, name).parent.mkdir(parents=True, exist_ok=True)
        at(ctx, name).symlink_to(Path(ctx["victim"]) / "elsewhere")
        return str(at(ctx, name))

    def dangling(ctx, name):
        at(ctx, name).parent.mkdir(parents=True, exist_ok=True)
        at(ctx, name).symlink_to(Path(ctx["victim"]) / "nowhere")
        return str(at(ctx, name))

    def fifo(ctx, name):
        at(ctx, name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(at(ctx, name))
        return str(at(ctx, name))

    def cwd_dot(ctx, name):
        return "."

    def cwd_empty(ctx, name):
        return ""

    def home(ctx, name):
        return ctx["home"]

    def under_file(ctx, name):  # a path whose parent is a file
        _victim_file(Path(ctx["victim"]) / "afile", 6)
        return str(Path(ctx["victim"]) / "afile" / name)
    return {"file": file, "dir": directory, "lookalike": lookalike, "link-file": link_file, "link-dir": link_dir,
            "dangling": dangling, "fifo": fifo, "cwd": cwd_dot, "cwd-empty": cwd_empty, "home": home,
            "under-file": under_file}


def output_target_cases() -> list[SecCase]:
    cases = []
    kinds = _target_kinds()
    for (wname, (argv, what, setup)), (kname, make) in ((w, k) for w in WRITERS.items() for k in kinds.items()):
        if what == "edit" and kname == "file":
            continue  # the one writer that edits a file of yours by design (test_security checks the edit)
        name = "out.png" if what == "png" else "out"

        def case_setup(ctx, make=make, name=name, setup=setup):
            if setup:
                setup(ctx)
            ctx["t"] = make(ctx, name)
        cases.append(SecCase("output-targets", f"{wname}-{kname}", argv, ("{t}", "--out", "--events", "--state",
                                                                           "--tuner-csv", "--chart",
                                                                           "--write-host-vars", "working directory",
                                                                           "home directory"),
                             setup=case_setup, timeout=30, patch=no_network))
    return cases


# --- class: concurrency -----------------------------------------------------------------------------------------

def _hold_lock(ctx, mp):
    """Another regate holds the state file's lock while the command runs."""
    import fcntl
    st = Path(ctx["root"]) / "st.json"
    fd = os.open(st.parent / f".{st.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _LOCKS.append(fd)


_LOCKS: list[int] = []


def release_locks() -> None:
    while _LOCKS:
        os.close(_LOCKS.pop())


def _earlier_events(ctx):
    p = Path(ctx["out"]) / "events.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text('{"event": "started", "action": "verify"}\n{"event": "finished", "rc": 0}\n')
    p.chmod(0o600)


def concurrency_cases() -> list[SecCase]:
    cases = []
    for variant, extra in (("once", []), ("dry-run", ["--dry-run"]), ("watch", ["--watch", "30"])):
        for prom in ("{closed}", "{peer}"):
            cases.append(SecCase("concurrency", f"regate-locked-{variant}-{'peer' if prom == '{peer}' else 'down'}",
                                 ["regate", "-i", "{inv}", "--prometheus", prom, "--state", "{root}/st.json", *extra],
                                 ("--state",), patch=_both(_hold_lock, with_peer(alerts_body("")))))
    for action in ("deploy", "rollback", "verify"):
        cases.append(SecCase("concurrency", f"events-again-{action}", [action, "-i", "{inv}", "--skip-preflight",
                                                                      "--events", "{out}/events.jsonl"]
                             if action == "deploy" else [action, "-i", "{inv}", "--events", "{out}/events.jsonl"],
                             ("--events",), setup=_earlier_events, patch=no_network))
    return cases


def _both(*patches):
    def patch(ctx, mp):
        for p in patches:
            p(ctx, mp)
    return patch


# --- system paths in a private mount namespace --------------------------------------------------------------

OVERLAID = ("/etc", "/usr", "/var", "/boot", "/opt")
SYSTEM_TARGETS = {"etc": "/etc", "etc-new": "/etc/specdeploy-out", "usr": "/usr/local/share/specdeploy-out",
                  "var": "/var/lib/specdeploy-out", "boot": "/boot/specdeploy-out", "home-root": "/home",
                  "root": "/"}


def namespace_problem() -> str | None:
    """Why this machine cannot give a private mount namespace (None when it can)."""
    import subprocess
    try:
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if r.returncode == 0 else r.stderr.decode(errors="replace").strip()


OVERLAID = ("/etc", "/usr", "/var", "/boot", "/opt")
SYSTEM_TARGETS = {"etc": "/etc", "etc-new": "/etc/specdeploy-out", "usr": "/usr/local/share/specdeploy-out",
                  "var": "/var/lib/specdeploy-out", "boot": "/boot/specdeploy-out", "home-root": "/home",
                  "root": "/"}


def run_in_namespace(argv: list[str], upper: Path, cwd: Path, env: dict, python: str):
    """``specdeploy argv`` in a private mount namespace where each of OVERLAID is an overlay whose writes land
    in ``upper/<dir>`` (the real directory stays as it is), and the root filesystem is read-only."""
    mounts = []
    for d in OVERLAID:
        if not os.path.isdir(d):
            continue
        u, w = upper / d.strip("/") / "upper", upper / d.strip("/") / "work"
        u.mkdir(parents=True)
        w.mkdir(parents=True)
        mounts.append(f"mount -t overlay overlay -o lowerdir={d},upperdir={u},workdir={w} {d}")
    script = " && ".join(["mount --make-rprivate /", *mounts, "mount -o remount,bind,ro /",
                          'exec "$@"'])
    import subprocess
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           python, "-m", "specdeploy.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def system_cases() -> list[tuple[str, str, list[str]]]:
    """(writer, target label, argv) for every writer against every system target: generated from WRITERS."""
    out = []
    for wname, (argv, what, _) in WRITERS.items():
        for tname, target in SYSTEM_TARGETS.items():
            t = target + ("/out.png" if what == "png" and target != "/" else "")
            out.append((wname, tname, [a.replace("{t}", t) for a in argv]))
    return out


def system_case(writer: str, target: str, argv: list[str], tmp: Path) -> None:
    """One writer against one system path, in the namespace: refused naming the path, nothing written there."""
    import sys
    ctx = rc.scratch(tmp / "tree")
    (tmp / "tree" / "r.json").write_text(json.dumps(rc._tune_results()))
    argv = [fill(a, ctx) for a in argv]
    env = child_env(tmp / "home")
    (tmp / "home").mkdir()
    r = run_in_namespace(argv, tmp / "overlay", tmp / "tree" / "cwd", env, sys.executable)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert TRACEBACK not in out, out
    assert "never writes there" in out and (SYSTEM_TARGETS[target].rstrip("/").split("/")[-1] in out
                                            or target == "root" and ": /" in out), out
    written = [str(p.relative_to(tmp / "overlay")) for p in (tmp / "overlay").rglob("*") if "/upper/" in str(p)]
    assert not written, f"{writer} wrote into the system directories: {written[:5]}"


# --- writers racing ---------------------------------------------------------------------------------------------

RACES = {"plan": ["plan", "-i", "{inv}", "--out", "{root}/race"],
         "tuner-csv": ["nccl", "choose", "{root}/r.json", "--tuner-csv", "{root}/race.csv"],
         "convert": ["drafter", "convert", "{models}/drafter", "--target", "{models}/target", "--engine", "vllm",
                     "--out", "{root}/race"]}


def race(writer: str, start: str, tmp: Path) -> None:
    """Two ``writer`` runs at once into one output (``start``: absent, or the writer's own earlier output):
    each ends cleanly (written, or refused naming the path), one whole output is left, no temporary file."""
    import subprocess
    import sys

    from specdeploy.plan.outdir import MARKER, _listing
    ctx = rc.scratch(tmp)
    Path(ctx["root"], "r.json").write_text(json.dumps(rc._tune_results()))
    argv = [fill(a, ctx) for a in RACES[writer]]
    env = child_env(tmp)
    cmd = [sys.executable, "-m", "specdeploy.cli", *argv]
    if start == "own":
        assert subprocess.run(cmd, env=env, cwd=tmp / "cwd", capture_output=True, timeout=120).returncode == 0
    procs = [subprocess.Popen(cmd, env=env, cwd=tmp / "cwd", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for code, out, err in results:
        assert TRACEBACK not in out + err, out + err
        assert code == 0 or "--out" in err or "--tuner-csv" in err, out + err
    assert any(code == 0 for code, _, _ in results)
    left = [p.name for p in Path(ctx["root"]).iterdir() if ".specdeploy-" in p.name]
    assert not left, left
    target = Path(argv[-1])
    if target.is_dir():
        marker = json.loads((target / MARKER).read_text())
        assert sorted(marker["files"]) == sorted(_listing(target))
    else:
        assert target.read_text().startswith("# written by `specdeploy nccl choose`")


