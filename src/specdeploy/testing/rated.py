"""Drafters of controlled acceptance for the tiny targets (tests and benchmarks only): where the engine cannot run the
synthetic rejection method (the vLLM CPU build refuses it), a drafter that knows the target's token after next for a
chosen fraction of its draft positions stands in for it, and the engine's own counters measure the acceptance.

    from specdeploy.testing import rated
    rated.drafter("kimi_k2", 0.5)     # -> Path: accepts half its first draft tokens (AL 1.5 at any k)
    rated.meta(path)                  # -> the known tokens, the walk, the acceptance by request length

Built from the tiny target's "good" drafter (tinymodels) by ``ratedgen.py`` in the real-engine venv's Python, once
per (target kind, rate) into ``$SPECDEPLOY_CACHE/rated-<kind>-<rate>-<key16>``, keyed by the spec, the generator's
source and the good drafter's key; built beside its place and renamed in, under the tiny models' lock.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.testing import cache, tinymodels

GENERATOR = Path(__file__).with_name("ratedgen.py")
START = "<|im_middle|>"  # the chat template's last token (tinymodels.CHAT_TEMPLATE): every answer starts after it
TOKENS = 400  # the longest request the acceptance is designed for (the cycle has 504 regular tokens)


def _spec(kind: str, rate: float) -> dict:
    if not 0.0 <= rate <= 1.0:
        raise SpecdeployError([Finding("error", "rate", f"{rate!r} is not a fraction from 0 to 1",
                                       "give the share of draft positions the drafter should get right")])
    return {"target": str(tinymodels.target(kind)), "good": str(tinymodels.drafter(kind, "good")),
            "rate": round(float(rate), 4), "start": START, "tokens": TOKENS}


def drafter(kind: str, rate: float, progress=None) -> Path:
    """The drafter for tiny target ``kind`` that accepts ``rate`` of its first draft tokens (built on first use)."""
    spec = _spec(kind, rate)
    good = Path(spec["good"])
    key = cache.inputs_key(json.dumps(spec, sort_keys=True), GENERATOR, tinymodels.GENERATOR,
                           cache.key_of(good) or "", tinymodels.target_key(kind))
    final = tinymodels.CACHE / f"rated-{kind}-{int(round(rate * 100)):03d}-{key[:16]}"

    def build(tmp: Path):
        py = tinymodels.python(progress)
        p = subprocess.run([str(py), str(GENERATOR), str(tmp)], input=json.dumps(spec), capture_output=True,
                           text=True, env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"})
        if p.returncode != 0:
            tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
            raise SpecdeployError([Finding("error", "rated drafter", f"the generator failed (exit {p.returncode}):"
                                           f"\n{tail}", f"run {py} {GENERATOR} by hand to see why")])
    out = cache.build_entry(final, key, build, tinymodels.LOCK, f"rated drafter {kind} {rate:g} build", progress)
    with cache.locked(tinymodels.LOCK, "rated drafter prune"):
        cache.prune(tinymodels.CACHE, f"rated-{kind}-{int(round(rate * 100)):03d}-{'?' * 16}", keep=out)
    for f in out.iterdir():  # an engine's service user reads it
        if f.is_file() and not f.is_symlink():
            f.chmod(0o644)
    return out


def meta(path: Path) -> dict:
    return json.loads((Path(path) / "specdeploy-tiny.json").read_text())


def expected_al(path: Path, max_tokens: int) -> float:
    """The acceptance length a chat request of ``max_tokens`` tokens gets from this drafter, by construction."""
    by = meta(path)["acceptance_by_max_tokens"]
    m = min((int(x) for x in by), key=lambda x: abs(x - max_tokens))
    return 1.0 + by[str(m)]
