"""Whether speculation pays: speedup = AL x T_base / T_spec; it pays only when AL exceeds the step-time ratio."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Breakeven:
    acceptance_length: float
    step_ratio: float
    speedup: float
    breakeven_al: float
    verdict: str
    margin: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def breakeven(acceptance_length: float, step_ratio: float, margin: float = 0.10) -> Breakeven:
    """``keep`` when the predicted speedup clears 1 + margin, ``disable`` when it is below 1, and ``marginal``
    in between (kept, but flagged)."""
    if acceptance_length < 1:
        raise ValueError("acceptance length counts the bonus token, so it is at least 1")
    if step_ratio <= 0:
        raise ValueError("the step-time ratio T_spec / T_base must be positive")
    speedup = acceptance_length / step_ratio
    if speedup >= 1 + margin:
        verdict = "keep"
    elif speedup < 1:
        verdict = "disable"
    else:
        verdict = "marginal"
    return Breakeven(acceptance_length, step_ratio, speedup, step_ratio * (1 + margin), verdict, margin)
