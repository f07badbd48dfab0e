"""The trials' parameters: random (seeded) or grid points of a study's search space. Pure: the
same study gives the same trials, wherever it is sampled (the controller Lambda, a test)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from smlt.runtime.study.spec import Choices, Param, Range, Study, as_value, grid_values


def _draw(p: Param, rng: np.random.Generator) -> Any:
    if isinstance(p, Choices):
        return p.choices[int(rng.integers(len(p.choices)))]
    if isinstance(p, Range):
        lo, hi = p.range
        return (
            as_value(p, float(rng.uniform(lo, hi + (1 if p.integer else 0))))
            if not p.integer
            else int(rng.integers(int(math.ceil(lo)), int(math.floor(hi)) + 1))
        )
    lo, hi = p.log_range
    return as_value(p, float(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def sample(study: Study) -> list[dict[str, Any]]:
    """The parameters of every trial, in trial order: grid points for a grid search, seeded
    random draws otherwise (ASHA samples at random too)."""
    names = list(study.space)
    if study.search.kind == "grid":
        grid = itertools.product(*(grid_values(study.space[n]) for n in names))
        return [dict(zip(names, point, strict=True)) for point in itertools.islice(grid, study.trials)]
    rng = np.random.default_rng(study.seed)
    return [{n: _draw(study.space[n], rng) for n in names} for _ in range(study.trials)]
