"""The trials' parameters: random (seeded) or grid points of a study's search space. Pure: the
same study gives the same trials, wherever it is sampled (the controller Lambda, a test)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from smlt.study.spec import Choices, LogRange, Param, Range, Study


def _grid_values(p: Param) -> list[Any]:
    if isinstance(p, Choices):
        return list(p.choices)
    if isinstance(p, Range):
        values = np.linspace(p.range[0], p.range[1], p.points)
    else:
        values = np.exp(np.linspace(math.log(p.log_range[0]), math.log(p.log_range[1]), p.points))
    return [_as(p, float(v)) for v in values]


def _as(p: Range | LogRange, v: float) -> float | int:
    return int(round(v)) if p.integer else float(f"{v:.6g}")  # 6 significant digits: readable ids


def _draw(p: Param, rng: np.random.Generator) -> Any:
    if isinstance(p, Choices):
        return p.choices[int(rng.integers(len(p.choices)))]
    if isinstance(p, Range):
        lo, hi = p.range
        return (
            _as(p, float(rng.uniform(lo, hi + (1 if p.integer else 0))))
            if not p.integer
            else int(rng.integers(int(math.ceil(lo)), int(math.floor(hi)) + 1))
        )
    lo, hi = p.log_range
    return _as(p, float(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def sample(study: Study) -> list[dict[str, Any]]:
    """The parameters of every trial, in trial order: grid points for a grid search, seeded
    random draws otherwise (ASHA samples at random too)."""
    names = list(study.space)
    if study.search.kind == "grid":
        grid = itertools.product(*(_grid_values(study.space[n]) for n in names))
        return [dict(zip(names, point, strict=True)) for point in itertools.islice(grid, study.trials)]
    rng = np.random.default_rng(study.seed)
    return [{n: _draw(study.space[n], rng) for n in names} for _ in range(study.trials)]


def corner_points(study: Study) -> list[dict[str, Any]]:
    """A few points that together use every choice and both ends of every range (checks)."""
    names = list(study.space)
    columns = [
        _grid_values(study.space[n]) if isinstance(study.space[n], Choices) else _ends(study.space[n]) for n in names
    ]
    longest = max(len(c) for c in columns)
    return [{n: col[i % len(col)] for n, col in zip(names, columns, strict=True)} for i in range(longest)]


def _ends(p: Param) -> list[Any]:
    assert isinstance(p, Range | LogRange)
    lo, hi = p.range if isinstance(p, Range) else p.log_range
    return [_as(p, lo), _as(p, hi)]
