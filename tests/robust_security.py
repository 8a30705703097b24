"""The security classes of the generative robustness suite: hostile output targets, hostile names, terminal
control, secrets by value, depth and size, concurrency. Each class is generated from its parts (the commands that
write, the kinds of a target, the mutations of a name, the control sequences and where they enter, ...), never
listed case by case.

A case runs in a fresh scratch tree (robust_cases.scratch: {root}, {inv}, {gv}, {models}, {out}, {closed}, and
{home}, the HOME the command sees). ``run`` checks what every case must hold: no traceback, no hang, on bad input a
non-zero exit naming one of ``names``, no raw control character in the output, every file that was there before
byte-identical with its mode (``writes``: the only paths the command may create, besides ~/.ansible, which
importing Ansible makes), and no ``secrets`` value in
any file under the tree or in the output. tests/unit/cli/test_security.py runs a deterministic sample
(:func:`sample`); bench/security_sweep.py runs every case.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import threading
import typing
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


import robust_cases as rc

CLASSES = ("output-targets", "hostile-names", "terminal-control", "secrets", "depth-size", "concurrency")
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class SecCase:
    cls: str
    id: str
    argv: list[str]
    names: tuple[str, ...] = ()
    expect: str = "error"  # error: exit != 0 naming one of names; any: either exit, cleanly
    setup: typing.Callable[[dict], None] | None = None
    writes: tuple[str, ...] = ()  # paths (placeholders) the command may create or change
    secrets: tuple[str, ...] = ()  # values that must not be on disk afterwards, nor in the output
    timeout: float = 20.0
    patch: typing.Callable[[dict, typing.Any], None] | None = None  # (ctx, monkeypatch): in-process stand-ins
    check: typing.Callable[[dict, str], None] | None = None  # a case's own assertion on (ctx, output)
    extra: dict = field(default_factory=dict)


# --- the scratch tree and the checks --------------------------------------------------------------------------

def fill(s: str, ctx: dict) -> str:
    for k, v in ctx.items():
        if isinstance(v, str):
            s = s.replace("{" + k + "}", v)
    return s


def prepare(case: SecCase, root: Path) -> dict:
    ctx = rc.scratch(root)
    home = root / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# the operator's own\n")
    ctx.update(home=str(home), victim=str(root / "victim"))
    if case.setup:
        case.setup(ctx)
    return ctx


def fingerprint(root: Path, skip: list[Path] = ()) -> dict[str, tuple]:
    """{path: (kind, mode, content hash or link target)} of everything under root (``skip`` paths and below
    left out): what a case must leave byte-identical with its mode."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for n in dirnames + filenames:
            p = d / n
            if p in skip:
                continue
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest()
                            if st.st_size < 64 << 20 else (st.st_size, st.st_mtime_ns))
            else:
                out[rel] = ("dir" if stat.S_ISDIR(st.st_mode) else "special", stat.S_IMODE(st.st_mode), "")
    return out


def leaked(root: Path, secrets: typing.Iterable[str]) -> list[str]:
    """'path: value' for each secret value found in a file under root."""
    found = []
    secrets = [s.encode() for s in secrets]
    for dirpath, _, filenames in os.walk(root):
        for n in filenames:
            p = Path(dirpath) / n
            try:
                if not p.is_file() or p.is_symlink() or p.stat().st_size > 64 << 20:
                    continue
                data = p.read_bytes()
            except OSError:
                continue
            found += [f"{p}: {s.decode()}" for s in secrets if s in data]
    return found


def shm_runs() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("specdeploy-run-")}
    except OSError:
        return set()


class CaseTimeout(BaseException):
    pass


def run_inprocess(argv: list[str], cwd: Path, timeout: float, env: dict | None = None):
    """(exit code or None on a hang, output, traceback text or None)."""
    from typer.testing import CliRunner

    from specdeploy.cli import app
    from specdeploy.values.errors import SpecdeployError

    def alarm(signum, frame):
        raise CaseTimeout()
    old = os.getcwd()
    os.chdir(cwd)
    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        res = CliRunner().invoke(app, argv, catch_exceptions=True, env=env)
    except CaseTimeout:
        return None, "", None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(old)
    exc = res.exception
    if isinstance(exc, SpecdeployError):
        return 2, res.output + "\n".join(p.line() for p in exc.problems), None
    if isinstance(exc, CaseTimeout):
        return None, res.output, None
    if exc is not None and not isinstance(exc, SystemExit):
        import traceback
        return 1, res.output, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return res.exit_code, res.output, None


def run(case: SecCase, root: Path, monkeypatch) -> str:
    """Run ``case`` in a scratch tree under ``root`` and assert what every case must hold; returns the output."""
    from specdeploy.values.terminal import unsafe_chars
    ctx = prepare(case, root)
    if case.patch:
        case.patch(ctx, monkeypatch)
    # Ansible's own local temporary directory, which importing Ansible makes (as ansible-playbook does)
    allowed = [Path(fill(w, ctx)) for w in case.writes] + [Path(ctx["home"]) / ".ansible"]
    before = fingerprint(root, allowed)
    argv = [fill(a, ctx) for a in case.argv]
    code, out, tb = run_inprocess(argv, root / "cwd", case.timeout, {"HOME": ctx["home"], "COLUMNS": "200"})
    label = f"{case.cls}/{case.id}"
    assert code is not None, f"{label}: no answer within {case.timeout:g} s"
    assert tb is None and TRACEBACK not in out, f"{label}: traceback\n{tb or out}"
    if case.expect == "error":
        assert code != 0, f"{label}: exit 0 on hostile input\n{out[-2000:]}"
        names = [fill(n, ctx) for n in case.names]
        assert any(n in out for n in names), f"{label}: the error names none of {names}\n{out[-2000:]}"
    raw = unsafe_chars(out)
    assert not raw, f"{label}: raw control characters on the terminal: {sorted(set(map(repr, raw)))}\n{out[-800:]}"
    after = fingerprint(root, allowed)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"{label}: changed what it did not create: {changed[:10]}"
    secrets = [fill(s, ctx) for s in case.secrets]
    holders = case.extra.get("allowed_holders", ())
    found = [f for f in leaked(root, secrets) if Path(f.split(": ")[0]).name not in holders]
    assert not found, f"{label}: secret values on disk: {found[:5]}"
    assert not [s for s in secrets if s in out], f"{label}: a secret value in the output"
    if case.check:
        case.check(ctx, out)
    return out


def child_env(home: Path) -> dict:
    """The environment of a command run as a process: this tree's code, ``home`` as its HOME, and matplotlib's
    font cache where this process keeps it (a fresh HOME would rebuild it, for seconds, in every run)."""
    import matplotlib
    return dict(os.environ, PYTHONPATH=str(rc.REPO / "src"), HOME=str(home), COLUMNS="200",
                MPLCONFIGDIR=os.environ.get("MPLCONFIGDIR") or matplotlib.get_configdir())


# --- peers: a fake exporter, a fake Prometheus ----------------------------------------------------------------

class Peer:
    """A local HTTP server answering every GET with ``body`` (a str, or a callable of the path)."""

    def __init__(self, body):
        self.body = body
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                b = outer.body(self.path) if callable(outer.body) else outer.body
                b = b.encode() if isinstance(b, str) else b
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4" if self.path.startswith("/metrics")
                                 else "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def with_peer(body, key: str = "peer"):
    """patch: start a Peer for the case ({peer}, {peer_port}); close_peers() stops it."""
    def patch(ctx, mp):
        p = Peer(body)
        ctx[key] = p.url
        ctx[key + "_port"] = str(p.port)
        _PEERS.append(p)
    return patch


_PEERS: list[Peer] = []


def close_peers() -> None:
    while _PEERS:
        _PEERS.pop().close()


def no_network(ctx, mp):
    """Nothing a refused output reaches: pip, the package index, ansible-runner (each would mean the refusal
    came too late)."""
    import ansible_runner

    import specdeploy.ops.wheelhouse as wh

    def refuse(*a, **kw):
        raise AssertionError("the command ran its work before refusing its output")
    mp.setattr(wh.subprocess, "run", refuse)
    mp.setattr(ansible_runner, "run_async", refuse)
    from specdeploy.engines import upstream
    mp.setattr(upstream, "source", refuse)


def alerts_body(p: str) -> str:
    return json.dumps({"status": "success", "data": {"alerts": [
        {"state": "firing", "activeAt": f"now{p}", "value": f"1{p}",
         "labels": {"specdeploy_action": "regate", "host": f"gpu-z{p}", "alertname": f"A{p}"}}]}})


# --- all of them ------------------------------------------------------------------------------------------------

def all_cases() -> list[SecCase]:
    import robust_security_inputs as inputs
    import robust_security_outputs as outputs
    return (outputs.output_target_cases() + inputs.hostile_name_cases() + inputs.terminal_cases()
            + inputs.secret_cases() + inputs.depth_size_cases() + outputs.concurrency_cases())


def sample(cases: list[SecCase], per_class: dict[str, int] | None = None) -> list[SecCase]:
    """A deterministic sample that reaches every part each class is generated from: a greedy cover of the parts
    of the case ids (writer and target kind, name mutation, placement and command, sequence and carrier, ...),
    each step taking the case that adds the most parts not yet reached, then topped up to ``per_class[cls]``
    with cases spread evenly over the rest."""
    out = []
    for cls in CLASSES:
        mine = [c for c in cases if c.cls == cls]
        parts = {c.id: set(c.id.split("-")) for c in mine}
        todo = set().union(*parts.values()) if parts else set()
        chosen: list[SecCase] = []
        while todo:
            best = max(mine, key=lambda c: (len(parts[c.id] & todo), -mine.index(c)))
            chosen.append(best)
            todo -= parts[best.id]
        rest = [c for c in mine if c not in chosen]
        want = (per_class or {}).get(cls, 0) - len(chosen)
        if want > 0 and rest:
            step = max(1, len(rest) // want)
            chosen += rest[::step][:want]
        out += sorted(chosen, key=mine.index)
    return out
