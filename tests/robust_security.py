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
import random
import signal
import stat
import threading
import typing
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

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
                             setup=case_setup, timeout=30, patch=_no_network))
    return cases


def _no_network(ctx, mp):
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


# --- class: hostile names ---------------------------------------------------------------------------------------

CONTROLS = ("\x1b[2J", "\x07", "\x9b", "\r", "\n", "\t", " ", "\x7f", "\x00")
INVISIBLE = ("\u200b", "\u200d", "\ufeff", "\u202e", "\u2028", "\u00ad")
LOOKALIKE = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441"}


def hostile_names(base: str = "gpu-a") -> dict[str, str]:
    """label -> a name generated from ``base``: path escapes, separators, control and invisible characters at
    each end and inside, leading dot or dash, look-alike letters."""
    out = {"dotdot": "..", "dot": "."}
    for label, pre in (("up", "../"), ("up-etc", "../../etc/systemd/system/"), ("abs", "/"), ("here", "./")):
        out[f"prefix-{label}"] = pre + base
    for sep in ("/", "\\", "/../"):
        out[f"infix-{sep!r}"] = base[:3] + sep + base[3:]
    for i, c in enumerate(CONTROLS + INVISIBLE):
        where = ("end", "inside", "start")[i % 3]
        out[f"char-{ord(c[0]):04x}-{where}"] = (base + c if where == "end" else base[:3] + c + base[3:]
                                            if where == "inside" else c + base)
    out["lead-dot"], out["lead-dash"], out["lead-dashes"] = "." + base, "-" + base, "--" + base
    for ch, look in LOOKALIKE.items():
        if ch in base:
            out[f"look-{ch}"] = base.replace(ch, look, 1)
    return out


def _rename(kind: str, new: str):
    def setup(ctx):
        hosts = Path(ctx["inv"]) / "hosts.yml"
        data = yaml.safe_load(hosts.read_text())
        eng = data["all"]["children"]["specdeploy_engines"]
        if kind == "host":
            eng["hosts"][new] = eng["hosts"].pop("gpu-a")
        else:  # a child group holding gpu-a
            eng.setdefault("children", {})[new] = {"hosts": {"gpu-a": None}}
        hosts.write_text(yaml.safe_dump(data, allow_unicode=False))
    return setup


NAME_COMMANDS = {"plan": ["plan", "-i", "{inv}", "--out", "{out}/p"], "preflight": ["preflight", "-i", "{inv}"],
                 "argv": ["engine", "argv", "-i", "{inv}", "--host", "gpu-b"],
                 "verify": ["verify", "-i", "{inv}", "--events", "{out}/events.jsonl"],
                 "status": ["status", "-i", "{inv}", "--prometheus", "{closed}", "--timeout", "0.5"]}


def hostile_name_cases() -> list[SecCase]:
    from specdeploy.values.terminal import safe
    cases = []
    names = hostile_names()
    for (label, name), kind, (cmd, argv) in ((n, k, c) for n in names.items() for k in ("host", "group")
                                             for c in NAME_COMMANDS.items()):
        if kind == "group" and ("/" in name or name in (".", "..")) and cmd != "plan":
            continue
        shown = safe(name)
        cases.append(SecCase("hostile-names", f"{kind}-{label}-{cmd}", argv, (shown, repr(name)[1:-1]),
                             setup=_rename(kind, name), patch=_no_network))
    return cases


# --- class: terminal control ------------------------------------------------------------------------------------

SEQUENCES = {"clear": "\x1b[2J\x1b[H", "title": "\x1b]0;owned\x07", "link": "\x1b]8;;http://x.invalid/\x1b\\here"
             "\x1b]8;;\x1b\\", "c1-csi": "\x9b31m", "bell": "\x07", "bidi": "\u202ecod.exe", "cr": "\rSPOOF",
             "backspace": "ok\x08\x08", "zero-width": "a\u200bb"}


def _metrics(p: str) -> str:
    lab = p.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return ("# TYPE specdeploy_engine_up gauge\nspecdeploy_engine_up 1\n"
            "# TYPE specdeploy_engine_info gauge\n"
            f'specdeploy_engine_info{{engine="vllm{lab}",version="0.16.0{lab}",release="r{lab}",spec_tokens="3"}} 1\n'
            "# TYPE specdeploy_gate_verdict gauge\n"
            f'specdeploy_gate_verdict{{verdict="keep{lab}"}} 1\n')


def _alerts(p: str) -> str:
    return json.dumps({"status": "success", "data": {"alerts": [
        {"state": "firing", "activeAt": f"now{p}", "value": f"1{p}",
         "labels": {"specdeploy_action": "regate", "host": f"gpu-z{p}", "alertname": f"A{p}"}}]}})


def _terminal_carriers() -> dict[str, typing.Callable[[str], tuple[list[str], typing.Callable | None,
                                                                       typing.Callable | None]]]:
    """carrier -> payload -> (argv, setup, patch): where text from outside reaches the terminal."""
    def log_line(p):
        def setup(ctx):
            (Path(ctx["root"]) / "engine.log").write_text(f"INFO start {p}\nTraceback (most recent call last):\n"
                                                          f"RuntimeError: CUDA out of memory {p}\n")
        return ["triage", "{root}/engine.log"], setup, None

    def log_name(p):
        return ["triage", "{root}/missing" + p.replace("\x00", "") + ".log"], None, None

    def candidate(p):
        def setup(ctx):
            r = rc._tune_results()
            r["rounds"][0]["candidates"].append(dict(r["rounds"][0]["candidates"][0], name=f"cand{p}"))
            (Path(ctx["root"]) / "r.json").write_text(json.dumps(r))
        return ["nccl", "choose", "{root}/r.json"], setup, None

    def e_value(p):
        return ["plan", "-i", "{inv}", "-e", json.dumps({"specdeploy_served_model_name": f"m{p}"})], None, None

    def inv_path(p):
        return ["plan", "-i", "{root}/inv" + p.replace("\x00", "")], None, None

    def out_path(p):
        return ["report", "--prometheus", "{closed}", "--out", "{root}/r" + p.replace("\x00", "") + ".png"], \
            None, None

    def exporter_label(p):
        def setup(ctx):
            rc.set_var(ctx, "specdeploy_exporter_port", int(ctx["peer_port"]))
        return ["status", "-i", "{inv}", "--prometheus", "{closed}", "--timeout", "2"], setup, \
            with_peer(_metrics(p))

    def alert_label(p):
        return ["regate", "-i", "{inv}", "--prometheus", "{peer}", "--dry-run", "--state", "{root}/st.json"], \
            None, with_peer(_alerts(p))
    return {"log-line": log_line, "log-name": log_name, "candidate": candidate, "e-value": e_value,
            "inventory-path": inv_path, "out-path": out_path, "exporter-label": exporter_label,
            "alert-label": alert_label}


def terminal_cases() -> list[SecCase]:
    cases = []
    for (sname, seq), (cname, carrier) in ((s, c) for s in SEQUENCES.items() for c in _terminal_carriers().items()):
        argv, setup, patch = carrier(seq)
        if patch is not None and setup is not None:
            def both(ctx, mp, patch=patch, setup=setup):
                patch(ctx, mp)
                setup(ctx)
            patch, setup = both, None
        cases.append(SecCase("terminal-control", f"{cname}-{sname}", argv, expect="any", setup=setup, patch=patch,
                             writes=("{root}/st.json", "{root}/.st.json.lock")))
    return cases


# --- class: secrets by value ------------------------------------------------------------------------------------

def _token(seed: int) -> str:
    return "s3cr3t-" + random.Random(seed).randbytes(8).hex()


LEAKS = ("task", "msg", "debug", "stderr", "triage")  # where the fake run echoes a value, as a leaky play would


def _fake_runner(values: list[str], channel: str, seen: list):
    """patch: ansible_runner.run_async played by a run that echoes ``values`` through ``channel`` and records
    what reached ansible-playbook (the -e file it was given, read while the run lasts)."""
    def patch(ctx, mp):
        import shlex
        import types

        import ansible_runner

        def run_async(**kw):
            args = shlex.split(kw.get("cmdline") or "")
            files = [a[1:] for a in args if a.startswith("@")]
            seen.append({"extravars": kw.get("extravars"), "files": {f: Path(f).read_text() for f in files
                                                                     if Path(f).is_file()},
                         "private": kw.get("private_data_dir")})
            v = " ".join(values)
            for host in ("gpu-a", "gpu-b"):
                task = f"Use {v}" if channel == "task" else "Install the key"
                h = kw["event_handler"]
                h({"event": "runner_on_start", "event_data": {"host": host, "task": task, "role": "inference_engine"}})
                res = {"msg": f"failed with {v}"} if channel == "msg" else {"stderr": f"key={v}"} \
                    if channel == "stderr" else {"msg": "no"}
                if channel == "debug":
                    h({"event": "runner_on_ok", "event_data": {"host": host, "task": task, "task_action": "debug",
                                                               "res": {"msg": f"value {v}"}}})
                if channel == "triage":
                    res["ansible_facts"] = {"inference_engine_triage": {"root_cause": f"bad {v}", "outcome": "failed"}}
                h({"event": "runner_on_failed", "event_data": {"host": host, "task": task, "res": res}})
            h({"event": "playbook_on_stats", "event_data": {"failures": {"gpu-a": 1, "gpu-b": 1}}})
            t = threading.Thread(target=lambda: None)
            t.start()
            return t, types.SimpleNamespace(rc=2)
        mp.setattr(ansible_runner, "run_async", run_async)
    return patch


def secret_cases() -> list[SecCase]:
    """-e values under names that do not look secret, nested, as KEY=VALUE, JSON and @file; API key file
    contents; each echoed by the run through each channel."""
    cases = []
    shapes = {
        "kv": lambda v: ["-e", f"hf_tok={v}"],
        "kv-plain-name": lambda v: ["-e", f"note={v}"],
        "json-nested": lambda v: ["-e", json.dumps({"cfg": {"endpoint": {"auth": [v]}}})],
        "at-file": lambda v: ["-e", "@{root}/vars.yml"],
        "schema-var": lambda v: ["-e", f"specdeploy_served_model_name={v}"],
        "api-key-file": lambda v: [],
    }
    for i, ((shape, argv_of), channel) in enumerate((s, c) for s in shapes.items() for c in LEAKS):
        v = _token(i)
        seen: list = []

        def setup(ctx, v=v, shape=shape):
            (Path(ctx["root"]) / "vars.yml").write_text(f"model_token: {v}\n")
            if shape == "api-key-file":
                (Path(ctx["root"]) / "secrets" / "example-api-key").write_text(v + "\n")
                rc.set_var(ctx, "specdeploy_api_key_file", str(Path(ctx["root"]) / "secrets" / "example-api-key"))

        def check(ctx, out, v=v, seen=seen, shape=shape):
            (call,) = seen[-1:]
            assert call["extravars"] is None, "the -e values went to ansible-runner's env/extravars"
            if shape != "api-key-file":
                assert any(v in text for text in call["files"].values()), "the -e value did not reach ansible"
            for f in call["files"]:
                assert not Path(f).exists() or f.endswith("vars.yml"), f"{f} was left after the run"
            assert not Path(call["private"]).parent.exists(), "the runner's private directory was left"
            events = list((Path(ctx["root"]) / "cwd" / ".cache" / "runs").glob("*/events.jsonl"))
            assert events and "<redacted>" in events[0].read_text(), "no event log, or nothing redacted"
        argv = ["verify", "-i", "{inv}", *argv_of(v)]
        # the vars file and the API key file are the operator's own: everything else must not hold the value
        cases.append(SecCase("secrets", f"{shape}-{channel}", argv, expect="any", setup=setup,
                             secrets=(v,), patch=_fake_runner([v], channel, seen), check=check,
                             writes=("{root}/vars.yml", "{root}/secrets", "{root}/cwd/.cache"),
                             extra={"allowed_holders": ("vars.yml", "example-api-key")}))
    return cases


# --- class: depth and size --------------------------------------------------------------------------------------

DEPTHS = {"101": 101, "5k": 5000, "100k": 100_000}


def _deep(fmt: str, n: int) -> str:
    if fmt == "json-obj":
        return '{"a": ' * n + "1" + "}" * n
    if fmt == "json-list":
        return "[" * n + "]" * n
    if fmt == "yaml-block":
        return "a:\n" + "".join(" " * i + "a:\n" for i in range(1, min(n, 20_000)))
    return "- " * n + "x\n"  # yaml-dash: a sequence in a sequence in ..., on one line


# reader -> (argv, the file it reads (placeholders), formats it takes, names its error must name)
READERS = {
    "target-check": (["drafter", "check", "{models}/drafter", "--target", "{models}/target", "--engine", "vllm"],
                     "{models}/target/config.json", ("json-obj", "json-list"), ("config.json",)),
    "target-preflight": (["preflight", "-i", "{inv}"], "{models}/target/config.json", ("json-obj",),
                         ("config.json",)),
    "breakeven": (["breakeven", "--target", "{models}/target"], "{models}/target/config.json",
                  ("json-obj", "json-list"), ("config.json",)),
    "drafter-check": (["drafter", "check", "{models}/drafter", "--target", "{models}/target", "--engine", "vllm"],
                      "{models}/drafter/config.json", ("json-obj",), ("config.json",)),
    "choose": (["nccl", "choose", "{root}/r.json"], "{root}/r.json", ("json-obj", "json-list"), ("r.json",)),
    "baseline": (["gate", "--url", "{closed}", "--baseline", "{root}/b.json", "--out", "{out}/g"], "{root}/b.json",
                 ("json-obj",), ("--baseline",)),
    "report-nccl": (["report", "--prometheus", "{closed}", "--nccl", "{root}/r.json", "--out", "{out}/r.png"],
                    "{root}/r.json", ("json-list",), ("--nccl",)),
    "e-file": (["plan", "-i", "{inv}", "-e", "@{root}/x.yml"], "{root}/x.yml",
               ("json-obj", "json-list", "yaml-block", "yaml-dash"), ("x.yml",)),
    "group-vars": (["plan", "-i", "{inv}"], "{inv}/group_vars/all.yml", ("json-obj", "yaml-block", "yaml-dash"),
                   ("all.yml",)),
    "candidates": (["nccl", "tune", "--candidates", "{root}/c.yml", "--out", "{out}/t.json"], "{root}/c.yml",
                   ("json-obj", "yaml-dash"), ("--candidates",)),
    "state": (["regate", "-i", "{inv}", "--prometheus", "{closed}", "--dry-run", "--state", "{root}/st.json"],
              "{root}/st.json", ("json-obj",), ("--state",)),
    "routing-trace": (["breakeven", "--target", "{models}/target", "--routing-trace", "{root}/t.json"],
                      "{root}/t.json", ("json-list",), ("--routing-trace",)),
}


def _put(rel: str, make: typing.Callable[[Path], None]):
    def setup(ctx):
        p = Path(fill(rel, ctx))
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            p.unlink()
        make(p)
    return setup


def _sparse(size: int):
    def make(p: Path):
        with open(p, "wb") as f:
            f.write(b'{"hidden_size": 7168, "pad": "')
            f.truncate(size)
    return make


def _text(text: str):
    return lambda p: p.write_text(text)


def _config_with(**values):
    def setup(ctx):
        p = Path(ctx["models"]) / "target" / "config.json"
        cfg = json.loads(p.read_text())
        (cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg).update(values)
        p.write_text(json.dumps(cfg))
    return setup


JINJA = {"loop": "{% for i in range(100000000) %}x{% endfor %}", "range": "{{ range(100000000) | list | length }}",
         "permutations": "{{ range(12) | permutations | list | length }}", "pow": "{{ 10 ** 100000000 }}",
         "lookup": "{{ lookup('pipe', 'sleep 100') }}", "repeat": "{{ 'x' * 100000000 }}",
         "slow-map": "{{ range(5000000) | map('string') | map('upper') | join | length }}"}


def depth_size_cases() -> list[SecCase]:
    cases = []
    for (rname, (argv, path, fmts, names)), (dname, n) in ((r, d) for r in READERS.items()
                                                            for d in DEPTHS.items()):
        for fmt in fmts:  # block nesting is bounded by its column (bounded.MAX_YAML_COLUMN), not by MAX_DEPTH
            harmless = fmt == "yaml-block" and n <= 1000
            cases.append(SecCase("depth-size", f"deep-{rname}-{fmt}-{dname}", argv, names,
                                 "any" if harmless else "error", setup=_put(path, _text(_deep(fmt, n))), timeout=30))
    cases.append(SecCase("depth-size", "deep-e-inline", ["plan", "-i", "{inv}", "-e", _deep("json-obj", 5000)],
                         ("-e",)))
    cases.append(SecCase("depth-size", "deep-alerts", ["regate", "-i", "{inv}", "--prometheus", "{peer}", "--dry-run",
                                                        "--state", "{root}/st.json"], ("--prometheus",),
                         patch=with_peer(_deep("json-obj", 5000)), writes=("{root}/st.json", "{root}/.st.json.lock")))
    cases.append(SecCase("depth-size", "deep-prometheus-query", ["status", "-i", "{inv}", "--prometheus", "{peer}",
                                                                 "--timeout", "2"], expect="any",
                         patch=with_peer(_deep("json-list", 100000))))
    big = 300 << 20
    for rname in ("target-check", "target-preflight", "breakeven", "choose", "baseline", "e-file", "group-vars",
                  "state", "routing-trace"):
        argv, path, _, names = READERS[rname]
        cases.append(SecCase("depth-size", f"size-{rname}-300M", argv, names, setup=_put(path, _sparse(big)),
                             timeout=30))
    cases.append(SecCase("depth-size", "size-triage-300M", ["triage", "{root}/engine.log"], expect="any",
                         setup=_put("{root}/engine.log", _sparse(big)), timeout=30))
    fifo = os.mkfifo
    for rname in ("target-check", "target-preflight", "breakeven", "drafter-check", "choose", "baseline", "e-file",
                  "group-vars", "candidates", "state", "routing-trace"):
        argv, path, _, names = READERS[rname]
        cases.append(SecCase("depth-size", f"fifo-{rname}", argv, names, setup=_put(path, fifo), timeout=15))
    cases.append(SecCase("depth-size", "fifo-shard-check", READERS["target-check"][0], ("safetensors",),
                         setup=_put("{models}/target/model-00001-of-00001.safetensors", fifo), expect="any",
                         timeout=15))
    cases.append(SecCase("depth-size", "fifo-triage", ["triage", "{root}/engine.log"], ("engine.log",),
                         setup=_put("{root}/engine.log", fifo), timeout=15))
    for key, values in (("num_hidden_layers", (10**5, 10**9, 2**63)), ("hidden_size", (10**9, 2**63)),
                        ("vocab_size", (10**12,)), ("num_attention_heads", (10**9,))):
        for v in values:
            for rname in ("target-check", "target-preflight", "breakeven"):
                cases.append(SecCase("depth-size", f"absurd-{key}-{v}-{rname}", READERS[rname][0], (key, "config"),
                                     setup=_config_with(**{key: v}), timeout=30))
    for jname, tmpl in JINJA.items():
        for where in ("e", "group-vars"):
            argv = ["plan", "-i", "{inv}"] + (["-e", json.dumps({"specdeploy_served_model_name": tmpl})]
                                              if where == "e" else [])
            setup = None if where == "e" else (lambda ctx, t=tmpl: rc.set_var(ctx, "specdeploy_served_model_name", t))
            cases.append(SecCase("depth-size", f"jinja-{jname}-{where}", argv, ("specdeploy_served_model_name",),
                                 setup=setup, patch=_budget(1.0), timeout=20))
    return cases


def _budget(seconds: float):
    def patch(ctx, mp):
        import specdeploy.hostvars.inventory_ansible as ia
        import specdeploy.hostvars.jinja_guard as jg
        mp.setattr(jg, "BUDGET_S", seconds)
        mp.setattr(ia, "VAULT_SCRIPT_S", seconds)
    return patch


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
                                 ("--state",), patch=_both(_hold_lock, with_peer(_alerts("")))))
    for action in ("deploy", "rollback", "verify"):
        cases.append(SecCase("concurrency", f"events-again-{action}", [action, "-i", "{inv}", "--skip-preflight",
                                                                      "--events", "{out}/events.jsonl"]
                             if action == "deploy" else [action, "-i", "{inv}", "--events", "{out}/events.jsonl"],
                             ("--events",), setup=_earlier_events, patch=_no_network))
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
    env = dict(os.environ, PYTHONPATH=str(rc.REPO / "src"), HOME=str(tmp / "home"), COLUMNS="200")
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
    env = dict(os.environ, PYTHONPATH=str(rc.REPO / "src"), COLUMNS="200", HOME=str(tmp))
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


# --- all of them ------------------------------------------------------------------------------------------------

def all_cases() -> list[SecCase]:
    return (output_target_cases() + hostile_name_cases() + terminal_cases() + secret_cases() + depth_size_cases()
            + concurrency_cases())


def sample(cases: list[SecCase], per_class: dict[str, int]) -> list[SecCase]:
    """A deterministic sample: every k-th case of each class so that about ``per_class[cls]`` remain, spread over
    the whole product (each generator's outer and inner parts)."""
    out = []
    for cls in CLASSES:
        mine = [c for c in cases if c.cls == cls]
        want = per_class.get(cls, len(mine))
        step = max(1, len(mine) // max(1, want))
        out += mine[::step][:want]
    return out
