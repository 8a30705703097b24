"""The synthetic rejection method: an engine runs its whole draft-and-verify path with any drafter of the right shape
and accepts draft tokens at calibrated rates instead of comparing them with the target's, so the price of
speculation (the step time at k draft tokens and a given acceptance length) is measured before any drafter is
trained (``specdeploy breakeven --measure``, docs/speculation.md).

Each adapter describes how its releases take it in a :class:`SyntheticFacts` table (``synthetic_facts``): the
speculative-config keys (vLLM) or the engine's environment (SGLang), the releases that take it, how the release
turns an acceptance length into per-position rates, and the platforms whose builds refuse it with the text they
print. :func:`plan` turns (AL, k) into the inventory variables that make a host's engine run it; :func:`refusal`
finds a platform's refusal in an engine log. The contract tests hold every table to the release sources.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specdeploy.engines.base import EngineAdapter, Span


@dataclass(frozen=True)
class Refusal:
    platform: str  # the build that refuses (e.g. "cpu")
    span: Span     # the releases whose build prints it
    text: str      # what the engine prints (an assertion, an error) when a step first uses the method
    where: str     # the source that prints it


@dataclass(frozen=True)
class SyntheticFacts:
    span: Span                     # the releases that take the method with an acceptance length
    via: str                       # "spec_config": speculative-config keys; "env": the engine's environment
    settings: tuple = ()           # (span, {name: value or "{al}"}) per release range: what switches it on
    schedule: str = "min-variance"  # how an AL becomes per-position unconditional rates (see rates())
    refusals: tuple[Refusal, ...] = ()
    notes: str = ""                # what else the release does (one line, for reports)
    read: tuple[str, ...] = ()     # releases whose sources were read for this table


@dataclass
class SyntheticRun:
    overrides: dict                # inventory variables (spec config extras or engine environment)
    rates: list[float]             # per-position unconditional acceptance rates the release runs
    how: str                       # one line naming the keys or variables


def rates(al: float, k: int) -> list[float]:
    """Per-position *unconditional* acceptance rates of the minimum-variance schedule for a mean acceptance length
    ``al`` (bonus token included) at ``k`` draft tokens: every step accepts floor(al - 1) or one more draft token,
    so the rates are 1 up to floor(al - 1), then the fraction, then 0. vLLM resolves
    ``synthetic_acceptance_length`` so; SGLang's ``match-expected`` draws floor(al) or ceil(al) tokens per step
    with the same expectation."""
    if not 1.0 <= al <= k + 1 or not math.isfinite(al):
        raise ValueError(f"acceptance length {al!r} is outside [1, k + 1 = {k + 1}]")
    drafts = al - 1
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k]


def facts(a: EngineAdapter) -> SyntheticFacts | None:
    return getattr(a, "synthetic_facts", None)


def unavailable(a: EngineAdapter) -> str:
    """Why this release cannot run the method ('' when it can)."""
    f = facts(a)
    if f is None:
        return f"{a.label} has no synthetic acceptance method that specdeploy knows of"
    if not f.span.contains(a.version):
        since = f" (it takes one from {a.label} {f.span.since})" if f.span.since else ""
        return f"{a.label} {a.version} has no synthetic acceptance method{since}"
    return ""


def plan(a: EngineAdapter, al: float, k: int) -> SyntheticRun:
    """The inventory variables that make ``a``'s release accept draft tokens at mean acceptance length ``al`` with
    ``k`` draft tokens; a ValueError says why it cannot (no method in this release, AL out of range)."""
    why = unavailable(a)
    if why:
        raise ValueError(why)
    f = facts(a)
    r = rates(al, k)
    settings = next((s for span, s in f.settings if span.contains(a.version)), None)
    if settings is None:
        raise ValueError(f"how {a.label} {a.version} switches the synthetic method on was not read")
    values = {name: (_num(al) if v == "{al}" else v) for name, v in settings.items()}
    if f.via == "spec_config":
        over = {"specdeploy_spec_config_extra": values}
    else:
        over = {"specdeploy_engine_env": {n: str(v) for n, v in values.items()}}
    how = ", ".join(f"{n}={v}" for n, v in values.items())
    return SyntheticRun(over, r, f"{'speculative config' if f.via == 'spec_config' else 'environment'}: {how}")


def refusal(a: EngineAdapter, log_text: str) -> Refusal | None:
    """The refusal a platform's build of this release printed in ``log_text``, if any."""
    f = facts(a)
    for r in (f.refusals if f else ()):
        if r.text in log_text:
            return r
    return None


def _num(x: float):
    return int(x) if float(x).is_integer() else round(float(x), 6)


