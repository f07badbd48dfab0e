"""The speed objective's decision rule (issue #12): when the budget binds, best effort buys its
progress fast, not only cheaply."""

from types import SimpleNamespace

import numpy as np

from smlt.planner.core import TIME_FOR_COST, _cheap_then_fast, _Pick

from .conftest import make_job


def _best_effort_pick(objective: str, progress, round_s, chosen=(True, True, True, True)) -> int:
    """Four plans, one worker each, equal progress per round: `progress` is what the money left buys
    (the best-effort objective is minus it), `round_s` a warm round's seconds."""
    job = make_job(constraints={"budget_usd": 0.05, "objective": objective})
    n = len(progress)
    x = SimpleNamespace(
        job=job,
        cand=SimpleNamespace(n=np.ones(n), k=np.full(n, 200.0)),
        f=SimpleNamespace(round_s_warm=np.array(round_s, float)),
        pm=SimpleNamespace(mean_round_progress=lambda n, k: np.ones(len(n))),
    )
    p = _Pick(np.array(chosen), 0.5, None, "cost", "best effort: ...")
    return _cheap_then_fast(x, p, -np.array(progress, float))  # type: ignore[arg-type]  # the fields it reads


def test_speed_best_effort_takes_the_fastest_plan_near_the_most_progress():
    """The budget-bound ResNet-18 x8 speed runs: 1,024 MB buys the most progress with the money
    left (10 units, 48 s rounds), 1,769 MB 9.5 (31 s), 10,240 MB 5 (10 s). Within TIME_FOR_COST of
    the most progress the fastest is 1,769 MB; far beyond it, 10,240 MB is not taken."""
    assert TIME_FOR_COST == 0.1
    progress, round_s = [10.0, 9.5, 8.0, 5.0], [48.0, 31.0, 20.0, 10.0]
    assert _best_effort_pick("speed", progress, round_s) == 1
    assert _best_effort_pick("cost", progress, round_s) == 0  # the cost objective: the most progress
    # only the plans best effort may use count: with plan 1 out, plan 0 (plan 2 is 20 % short)
    assert _best_effort_pick("speed", progress, round_s, (True, False, True, True)) == 0
