"""Generative robustness suite: bad values, bad files and bad arguments for every command that runs without a host.

Each case (tests/robust_cases.py) runs in a fresh scratch tree, in-process through typer's CliRunner (a sample
also as a real ``python -m specdeploy.cli`` subprocess), and must: end without a traceback; on bad input exit
non-zero naming the option, field or file; write nothing outside its own ``{out}``; finish within its timeout.
Hypothesis adds random variable values and random file bytes on top of the seed corpus."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import robust_cases as rc
from specdeploy.cli import app
from specdeploy.values.errors import SpecdeployError

REPO = rc.REPO
CASES = rc.all_cases()
TRACEBACK = "Traceback (most recent call last)"


class CaseTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


def snapshot(root: Path, *skip: Path) -> dict[str, tuple]:
    """{path: (mode, size, mtime)} of everything under root but the ``skip`` paths (and what is under them)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if d / n not in skip]
        for n in dirnames + filenames:
            p = d / n
            if p in skip:
                continue
            st_ = os.lstat(p)
            out[str(p.relative_to(root))] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return out


def _fill(s: str, ctx: dict) -> str:
    for k, v in ctx.items():
        s = s.replace("{" + k + "}", v)
    return s


def run_inprocess(argv: list[str], cwd: Path, timeout: float, monkeypatch=None, no_pip: bool = False):
    """(exit code, output, traceback text or None, seconds)."""
    if no_pip:
        import specdeploy.ops.wheelhouse as wh

        class NoPip:
            @staticmethod
            def run(*a, **kw):
                raise AssertionError(f"pip would run: {a[0][:6]}")
        monkeypatch.setattr(wh, "subprocess", NoPip)
    old = os.getcwd()
    os.chdir(cwd)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    t0 = time.perf_counter()
    try:
        res = CliRunner().invoke(app, argv, catch_exceptions=True)
    except CaseTimeout:
        return None, "", None, time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(old)
    secs = time.perf_counter() - t0
    out = res.output
    exc = res.exception
    if isinstance(exc, SpecdeployError):  # main() prints these as findings with exit 2
        return 2, out + str(exc), None, secs
    if exc is not None and not isinstance(exc, SystemExit):
        import traceback
        return 1, out, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), secs
    return res.exit_code, out, None, secs


def run_subprocess(argv: list[str], cwd: Path, timeout: float):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), COLUMNS="200")
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "specdeploy.cli", *argv], cwd=cwd, env=env, capture_output=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, "", None, time.perf_counter() - t0
    out = (p.stdout + p.stderr).decode("utf-8", "replace")
    return p.returncode, out, (out if TRACEBACK in out else None), time.perf_counter() - t0


def check_outcome(case: rc.Case, ctx: dict, code, out: str, tb, secs: float, label: str):
    assert code is not None, f"{label}: no answer within {case.timeout:.0f} s"
    assert tb is None and TRACEBACK not in out, f"{label}: traceback\n{tb or out}"
    assert secs < case.timeout, f"{label}: {secs:.1f} s"
    if case.expect == "error":
        assert code != 0, f"{label}: exit 0 on bad input\n{out[-2000:]}"
        names = [_fill(n, ctx) for n in case.names]
        assert any(n in out for n in names), f"{label}: the error names none of {names}\n{out[-2000:]}"


def _params():
    out = []
    for c in CASES:
        out.append(pytest.param(c, id=c.id))
    return out


@pytest.fixture(scope="module", autouse=True)
def repo_untouched():
    """Nothing the suite runs writes into the repository (inventory, example models, the top level)."""
    watched = [REPO / "inventory" / "example", REPO / "examples"]
    before = [snapshot(p) for p in watched], sorted(os.listdir(REPO))
    yield
    rc.cleanup_template()
    after = [snapshot(p) for p in watched], sorted(os.listdir(REPO))
    assert after == before, "the suite changed files in the repository"


def _prepare(case: rc.Case, tmp_path: Path) -> dict:
    ctx = rc.scratch(tmp_path)
    ctx["bad"] += case.bad_suffix
    if case.kind:
        rc.make_bad(Path(ctx["bad"]), case.kind)
    if case.setup:
        case.setup(ctx)
    return ctx


@pytest.mark.parametrize("case", _params())
def test_case(case: rc.Case, tmp_path, monkeypatch):
    ctx = _prepare(case, tmp_path)
    allowed = [Path(ctx["out"])] + ([Path(_fill(case.writes, ctx))] if case.writes else [])
    before = snapshot(tmp_path, *allowed)
    argv = [_fill(a, ctx) for a in case.argv]
    rc.count("in-process")
    code, out, tb, secs = run_inprocess(argv, tmp_path / "cwd", case.timeout, monkeypatch, case.no_pip)
    check_outcome(case, ctx, code, out, tb, secs, f"{case.id} {argv[:6]}")
    after = snapshot(tmp_path, *allowed)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"{case.id}: wrote outside its output dir: {changed[:10]}"


# a sample as real subprocesses: the installed entry point, stdin closed, a hard timeout
SAMPLE = [c for i, c in enumerate(CASES) if not c.no_pip and "\x00" not in "".join(c.argv)
          and (i % 97 == 0 or c.kind == "fifo" and c.id.startswith(("choose-", "gate-baseline", "report-nccl")))]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SAMPLE])
def test_case_subprocess(case: rc.Case, tmp_path):
    ctx = _prepare(case, tmp_path)
    allowed = [Path(ctx["out"])] + ([Path(_fill(case.writes, ctx))] if case.writes else [])
    before = snapshot(tmp_path, *allowed)
    argv = [_fill(a, ctx) for a in case.argv]
    rc.count("subprocess")
    code, out, tb, secs = run_subprocess(argv, tmp_path / "cwd", case.timeout + 10)
    check_outcome(case, ctx, code, out, tb, secs - 10, f"{case.id} (subprocess)")
    assert snapshot(tmp_path, *allowed) == before


def test_corpus_covers_every_variable_and_command():
    """The seed corpus reaches every HostVars field and every command the brief lists."""
    from specdeploy.hostvars.schema import HostVars
    ids = " ".join(c.id for c in CASES)
    missing = [f for f in HostVars.model_fields if f"gv-{f}-" not in ids or f"ejson-{f}-" not in ids]
    assert not missing
    heads = {" ".join(c.argv[:2]) if c.argv[0] in ("engine", "drafter", "nccl", "patch", "schema") else c.argv[0]
             for c in CASES}
    want = {"plan", "preflight", "engine argv", "engine image", "drafter check", "drafter convert", "patch status",
            "triage", "nccl choose", "nccl topo", "nccl tune", "breakeven", "gate", "report", "schema defaults",
            "schema argspec", "wheelhouse"}
    assert want <= heads, want - heads


# --- hypothesis: random values and random bytes -----------------------------------------------------------------

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=6)
FIELDS = sorted(__import__("specdeploy.hostvars.schema", fromlist=["HostVars"]).HostVars.model_fields)
HSET = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def hyp_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("hyp")
    return root, rc.scratch(root)


@HSET
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_random_variable_values(hyp_tree, field, value):
    root, ctx = hyp_tree
    rc.count("hypothesis")
    before = snapshot(root)
    code, out, tb, _ = run_inprocess(["plan", "--json", "-i", ctx["inv"], "-e", json.dumps({field: value})],
                                     root / "cwd", 10)
    assert code is not None and tb is None and TRACEBACK not in out, tb or out
    if code == 0:
        assert json.loads(out)["hosts"], out
    else:
        assert field in out, out
    assert snapshot(root) == before


FILE_COMMANDS = {
    "choose": (["nccl", "choose", "{f}"], ("{f}",)),
    "baseline": (["gate", "--url", "http://127.0.0.1:9", "--baseline", "{f}", "--out", "{o}"], ("--baseline",)),
    "report": (["report", "--prometheus", "http://127.0.0.1:9", "--nccl", "{f}", "--out", "{o}/r.png"],
               ("--nccl",)),
    "triage": (["triage", "{f}"], ("{f}", "LOGFILE")),
    "target": (["drafter", "check", "{d}", "--target", "{t}", "--engine", "vllm"], ("config.json",)),
    "candidates": (["nccl", "tune", "--candidates", "{f}", "--out", "{o}/t.json"], ("--candidates",)),
    "topo": (["nccl", "topo", "--matrix", "{f}", "--lspci", "{f}", "--cmdline", "{f}"], ("--matrix",)),
}
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                           st.sampled_from(["rounds", "candidates", "name", "status", "graph", "median_us",
                                            "levels_by_concurrency", "levels", "output_tps", "hidden_size", "1",
                                            "gpus", "text_config", "num_attention_heads"]), inner, max_size=4),
                       max_leaves=10)
CONTENTS = st.one_of(st.binary(max_size=300),
                     JSONISH.map(lambda v: json.dumps(v, allow_nan=True).encode()))


@HSET
@given(which=st.sampled_from(sorted(FILE_COMMANDS)), data=CONTENTS)
def test_random_file_contents(hyp_tree, which, data):
    root, ctx = hyp_tree
    rc.count("hypothesis")
    f = root / "random.input"
    t = root / "models" / "target"
    if which == "target":
        (t / "config.json").write_bytes(data)
    else:
        f.write_bytes(data)
    out_dir = root / "hyp-out"
    argv, names = FILE_COMMANDS[which]
    fill = {"f": str(f), "o": str(out_dir), "d": str(root / "models" / "drafter"), "t": str(t)}
    argv = [a.format(**fill) if "{" in a else a for a in argv]
    before = snapshot(root, out_dir)
    try:
        code, out, tb, _ = run_inprocess(argv, root / "cwd", 15)
    finally:
        if which == "target":
            (t / "config.json").write_bytes((REPO / "examples/models/kimi-k2.5-int4/config.json").read_bytes())
    assert code is not None and tb is None and TRACEBACK not in out, tb or out
    if code not in (0, 1) or which in ("choose", "baseline", "candidates") and code:
        assert any(n.format(**fill) in out for n in names), out
    after = snapshot(root, out_dir)
    assert {k: v for k, v in after.items() if "config.json" not in k} == \
        {k: v for k, v in before.items() if "config.json" not in k}
