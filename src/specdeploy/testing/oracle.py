"""The acceptance oracle: the real engine's own speculative-decoding counters as the judge of whether it feeds a
drafter what the drafter was trained on (tests and benchmarks only).

``oraclegen.py`` builds a tiny target whose every layer rotates the token's embedding its own way, and EAGLE-3
heads that name the target's token after next only when fed exactly the taps, norms, head and vocabulary map they
were trained with; ``oracle_variants.py`` says what an exporter may change; ``oracle_run.py`` serves each variant
with the real vLLM of a release (one process for many variants) and reads the accepted tokens per draft position.

A variant's measured verdict: ``holds`` (position 0 accepted at least ``HOLDS`` of the time), ``collapses`` (at
most ``COLLAPSES``), ``refused`` (the engine did not start or serve with it) or ``partial``. The doctor agrees
when it finds no error exactly where acceptance holds. ``EXCLUDED`` records a difference with both sides and why;
an exclusion that stops holding is a failure.

    python -m specdeploy.testing.oracle 0.32.0 [--only NAME ...]    # measures, prints the agreement
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specdeploy.testing import cache, realengine, tinymodels
from specdeploy.testing.oracle_variants import (
    TARGET_CONFIG,
    Variant,
    generator_spec,
    variants,
)
from specdeploy.values.errors import Finding, SpecdeployError

GENERATOR = Path(__file__).with_name("oraclegen.py")
DRIVER = Path(__file__).with_name("oracle_run.py")
RECORDS = Path(__file__).resolve().parents[3] / "tests" / "data" / "drafters" / "oracle"
MARK = "SPECDEPLOY-ORACLE "
K = 2                  # draft tokens per step: position 0 is predicted, position 1 is not (oraclegen)
HOLDS, COLLAPSES = 0.8, 0.2
PROMPTS = [[40 + 37 * i, 41 + 53 * i, 300 - 11 * i] for i in range(4)]
MAX_TOKENS = 24
RUNNER = "v1"          # the CPU builds' model runner (V2 needs a Triton with a CPU backend)


def _gen_env() -> dict:
    return {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}


def _generate(spec: dict, out: Path, progress=None, generator: Path = GENERATOR):
    py = tinymodels.python(progress)
    p = subprocess.run([str(py), str(generator), str(out)], input=json.dumps(spec), capture_output=True, text=True,
                       env=_gen_env(), timeout=1800)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise SpecdeployError([Finding("error", "oracle", f"the oracle generator failed (exit {p.returncode}):\n"
                                       f"{tail}", f"run {py} {generator} by hand to see why")])


def target_spec() -> dict:
    tok = tinymodels._target_spec("llama")["tokenizer"]
    return {"what": "target", "config": TARGET_CONFIG, "seed": 4242, "tokenizer": tok,
            "generation": {"bos_token_id": 0, "eos_token_id": [2, 1], "do_sample": False}}


def _key(*parts) -> str:
    return cache.inputs_key(*[json.dumps(p, sort_keys=True) if not isinstance(p, (str, Path)) else p
                              for p in parts], GENERATOR, realengine.key(tinymodels.VENV_VERSION))


def target(progress=None) -> Path:
    spec = target_spec()
    k = _key(spec)
    final = tinymodels.CACHE / f"oracle-target-{k[:16]}"
    return cache.build_entry(final, k, lambda tmp: _generate(spec, tmp, progress), tinymodels.LOCK,
                             "oracle target build", progress)


def drafters(vs: list[Variant], progress=None) -> tuple[Path, dict[str, Path]]:
    """(target, {variant name: drafter dir}), built once per set of variants."""
    t = target(progress)
    spec = {"what": "drafters", "target": str(t), "variants": generator_spec(vs)}
    k = _key(spec, str(t))
    final = tinymodels.CACHE / f"oracle-drafters-{k[:16]}"
    root = cache.build_entry(final, k, lambda tmp: _generate(spec, tmp, progress), tinymodels.LOCK,
                             f"oracle drafters build ({len(vs)})", progress)
    return t, {v.name: root / v.name for v in vs}


# --- measuring ----------------------------------------------------------------------------------------------
def _driver_env(version: str) -> dict:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "LANG")}
    return {**keep, **realengine.env(version), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONHASHSEED": "0"}


def measure(version: str, target_dir: Path, cases: dict[str, Path], timeout: float = 3600,
            progress=None, on_batch=None, max_rss_mib: int = 6144,
            dtype: str = TARGET_CONFIG["torch_dtype"]) -> dict[str, dict]:
    """Each case served by the real vLLM ``version``: {name: the driver's answer}. The driver ends after a case
    the engine refuses, or once its resident memory passes ``max_rss_mib`` (0.16.0 keeps about 1 GB per engine
    start); a new one takes the cases left."""
    py = realengine.venv(version) / "bin" / "python"
    left = list(cases)
    if not left:
        return {}
    out: dict[str, dict] = {}
    end = time.time() + timeout
    while left:
        job = {"target": str(target_dir), "dtype": dtype, "k": K, "prompts": PROMPTS,
               "max_tokens": MAX_TOKENS, "max_rss_mib": max_rss_mib,
               "cases": [{"id": n, "drafter": str(cases[n])} for n in left]}
        try:
            p = subprocess.run([str(py), str(DRIVER)], input=json.dumps(job), capture_output=True, text=True,
                               env=_driver_env(version), timeout=max(60.0, end - time.time()),
                               cwd=str(target_dir.parent))
        except subprocess.TimeoutExpired:
            raise SpecdeployError([Finding("error", "oracle", f"vLLM {version}: the oracle did not finish "
                                           f"within {timeout:.0f} s ({len(out)} of {len(cases)} cases)",
                                           "run fewer variants (--only), or on a less loaded machine")]) from None
        got = [json.loads(x[len(MARK):]) for x in p.stdout.splitlines() if x.startswith(MARK)]
        for r in got:
            out[r["id"]] = r
            if progress:
                progress(f"vLLM {version} {r['id']}: {verdict(r)} {rate(r)}")
        done = {r["id"] for r in got}
        if not done:
            tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-12:])
            raise SpecdeployError([Finding("error", "oracle", f"vLLM {version}: the oracle driver answered no case "
                                           f"(exit {p.returncode}):\n{tail}", "run it by hand to see why")])
        left = [n for n in left if n not in done]
        if on_batch:
            on_batch(out)
    return out


def rate(r: dict) -> float | None:
    """Position 0's acceptance rate (accepted at position 0 / drafts)."""
    if not r.get("ok") or not r.get("drafts"):
        return None
    return round(r["per_pos"][0] / r["drafts"], 3) if r.get("per_pos") else 0.0


def verdict(r: dict) -> str:
    a = rate(r)
    if a is None:
        return "refused"
    return "holds" if a >= HOLDS else "collapses" if a <= COLLAPSES else "partial"


# --- the doctor ---------------------------------------------------------------------------------------------
def doctor(drafter_dir: Path, target_dir: Path, version: str, runner: str | None = RUNNER) -> dict:
    """The doctor's verdict: its error subjects (empty: ok) and the milliseconds the check took."""
    from specdeploy.drafter import check
    t0 = time.perf_counter()
    rep = check(drafter_dir, target_dir, realengine.ENGINE, version, runner=runner)
    ms = (time.perf_counter() - t0) * 1000
    return {"errors": sorted({f.subject for f in rep.errors}), "ms": round(ms, 1),
            "messages": [f"{f.subject}: {f.message}" for f in rep.errors][:4]}


@dataclass(frozen=True)
class Exclusion:
    """A recorded difference: the doctor's error subjects and the oracle's verdict as they were, and why."""
    doctor: tuple
    oracle: str
    why: str


def _exclusions() -> dict[tuple[str, str], Exclusion]:
    """tests/data/drafters/oracle/exclusions.json: each recorded difference with both sides and why."""
    p = RECORDS / "exclusions.json"
    if not p.is_file():
        return {}
    data = json.loads(p.read_text())
    whys = data["why"]
    return {(x["name"], x["release"]): Exclusion(tuple(sorted(x["doctor"])), x["oracle"], whys[x["why"]])
            for x in data["exclusions"]}


EXCLUDED: dict[tuple[str, str], Exclusion] = _exclusions()


def agrees(doctor_errors, oracle_verdict: str) -> bool:
    if oracle_verdict == "holds":
        return not doctor_errors
    if oracle_verdict in ("collapses", "refused"):
        return bool(doctor_errors)
    return False  # partial acceptance: neither verdict is right


def judge(name: str, release: str, doctor_errors, oracle_verdict: str) -> str:
    """'agree', 'excluded' (as recorded) or 'differ'."""
    x = EXCLUDED.get((name, release))
    if x is None:
        return "agree" if agrees(doctor_errors, oracle_verdict) else "differ"
    same = tuple(sorted(doctor_errors)) == tuple(sorted(x.doctor)) and oracle_verdict == x.oracle
    return "excluded" if same and not agrees(doctor_errors, oracle_verdict) else "differ"


def convert_and_measure(version: str, target_dir: Path, dirs: dict[str, Path], vs: list[Variant], tmp: Path,
                        progress=None, measure_fn=None, **measure_args) -> dict[str, dict]:
    """The variants whose doctor errors are all ones `drafter convert` repairs: converted for ``version`` and
    served again; {name: {"verdict", "rate0", "actions"} or {"verdict": "not converted", "why"}}."""
    from specdeploy.drafter import check, convert, is_convertible
    out: dict[str, dict] = {}
    todo: dict[str, Path] = {}
    for v in vs:
        rep = check(dirs[v.name], target_dir, realengine.ENGINE, version, runner=RUNNER)  # the runner measured
        if not rep.errors or not all(is_convertible(f) for f in rep.errors):
            continue
        dst = tmp / v.name
        try:
            meta = convert(dirs[v.name], target_dir, realengine.ENGINE, dst, version)
        except SpecdeployError as exc:
            out[v.name] = {"verdict": "not converted", "why": str(exc)[:300]}
            continue
        out[v.name] = {"actions": meta["actions"]}
        todo[v.name] = dst
    if todo:
        got = (measure_fn or measure)(version, target_dir, todo, progress=progress, **measure_args)
        for name, r in got.items():
            out[name].update(verdict=verdict(r), rate0=rate(r))
    return out


# --- the record ---------------------------------------------------------------------------------------------
def record_path(release: str, which: str | None = None) -> Path:
    return RECORDS / (f"vllm-{release}.json" if not which else f"vllm-{release}-{which}.json")


def load_record(release: str, which: str | None = None) -> dict:
    p = record_path(release, which)
    if not p.is_file():
        raise SpecdeployError([Finding("error", "oracle record", f"no measured record {p}",
                                       f"run python bench/drafter_oracle.py {release}"
                                       + (f" --set {which}" if which else ""))])
    return json.loads(p.read_text())


def make_record(release: str, vs: list[Variant], measured: dict[str, dict], seconds: float,
                which: str | None = None, every: set[str] | None = None) -> dict:
    """The record of measured rows; ``every``: the names of the whole variant set (complete when all are in)."""
    rows = {}
    for v in vs:
        if v.name not in measured:
            continue
        r = measured[v.name]
        rows[v.name] = {"fingerprint": v.fingerprint(), "verdict": verdict(r), "rate0": rate(r),
                        "drafts": r.get("drafts"), "accepted_per_pos": r.get("per_pos"),
                        "error": r.get("error", "")[:300] or None}
    rec = {"engine": realengine.ENGINE, "release": release, "runner": RUNNER,
            "runner_note": "the CPU build's V1 model runner (0.16.0: its GPU runner's EAGLE code enabled on the "
                           "CPU by oracle_run.enable_016; 0.32.0: as shipped)",
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpus": os.cpu_count(),
            "k": K, "prompts": len(PROMPTS), "max_tokens": MAX_TOKENS, "seconds": round(seconds, 1),
            "thresholds": {"holds": HOLDS, "collapses": COLLAPSES},
            "complete": set(rows) == (every if every is not None else {v.name for v in variants()}),
            "variants": rows}
    if which:
        rec["set"] = which
    return rec


def sample(names: list[str], release: str, n: int, day: int | None = None) -> list[str]:
    """A deterministic rotating sample: ``n`` names spread over the list, the offset moving with the day."""
    names = sorted(names)
    day = int(time.time() // 86400) if day is None else day
    step = max(1, len(names) // n)
    off = (day * 7 + sum(map(ord, release))) % step
    return [names[(off + i * step) % len(names)] for i in range(min(n, len(names)))]


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m specdeploy.testing.oracle")
    ap.add_argument("version", choices=sorted(realengine.RECIPES))
    ap.add_argument("--only", nargs="*", help="variant names (default: every variant)")
    a = ap.parse_args(argv)
    vs = [v for v in variants() if not a.only or v.name in a.only]
    say = lambda m: print(f"[oracle] {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        t, dirs = drafters(vs, say)
        got = measure(a.version, t, dirs, progress=say)
    except SpecdeployError as exc:
        print(exc, file=sys.stderr)
        return 2
    for v in vs:
        d = doctor(dirs[v.name], t, a.version)
        o = verdict(got[v.name])
        print(f"{judge(v.name, a.version, d['errors'], o):8} {v.name}: oracle {o} {rate(got[v.name])} "
              f"doctor {d['errors'] or 'ok'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
