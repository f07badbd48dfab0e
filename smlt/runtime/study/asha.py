"""The ASHA rule (asynchronous successive halving, Li et al. 2020), pure: a trial that reaches a
rung goes on only if its value there is in the best 1/eta of the values recorded at that rung by
the trials that reached it before; the first trial at a rung always goes on. Asynchronous: no
trial waits for a rung to fill, so a study never idles its concurrency.

The values are the trials' recorded curves: the study's metric of model r in ROUND r (the model
after r training rounds), read by the controller (`smlt.runtime.study.controller`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    rung: int  # the rung (training rounds) the value was taken at
    value: float
    keep: bool
    cutoff: float | None  # the value it had to reach (None: first at its rung)

    def reason(self, metric: str, eta: int) -> str:
        if self.keep:
            return f"rung {self.rung}: {metric} {self.value:.4f} goes on"
        return (
            f"stopped at rung {self.rung} ({self.rung} rounds): {metric} {self.value:.4f} is not in the best "
            f"1/{eta} of the trials there (cutoff {self.cutoff:.4f})"
        )


def cutoff(recorded: Sequence[float], eta: int, higher_is_better: bool) -> float | None:
    """The value a trial must reach at a rung where `recorded` were seen before it."""
    if not recorded:
        return None
    q = (1 - 1 / eta) * 100
    values = np.asarray(recorded, dtype=float)
    return float(np.percentile(values, q) if higher_is_better else np.percentile(values, 100 - q))


def judge(value: float, rung: int, recorded: Sequence[float], eta: int, higher_is_better: bool) -> Verdict:
    """Keep or stop a trial whose value at `rung` is `value`."""
    c = cutoff(recorded, eta, higher_is_better)
    keep = c is None or (value >= c if higher_is_better else value <= c)
    return Verdict(rung, value, keep, c)


def value_at(curve: Mapping[int, float | None], rung: int) -> float | None:
    """The metric after `rung` training rounds: ROUND `rung`'s, or the first later round's with a
    whole-split metric (a partial evaluation has none); None while the trial is not there yet."""
    for r in sorted(k for k in curve if k >= rung):
        v = curve[r]
        if v is not None:
            return v
    return None


def next_rungs(curve: Mapping[int, float | None], rungs: Sequence[int], passed: int) -> list[tuple[int, float]]:
    """The rungs above `passed` (the highest rung the trial has been judged at; 0: none) that its
    curve has reached, with its value at each, lowest first."""
    out = []
    for rung in rungs:
        if rung <= passed:
            continue
        v = value_at(curve, rung)
        if v is None:
            break
        out.append((rung, v))
    return out
