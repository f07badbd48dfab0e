"""The speed objective's decision rule (issue #12): when the budget binds, best effort buys its
progress fast, not only cheaply."""

from types import SimpleNamespace

import numpy as np

from smlt.runtime.planner import decide
from smlt.runtime.planner.candidates import Hold, candidates
from smlt.runtime.planner.config import DEFAULT as C
from smlt.runtime.planner.levels import candidate_levels
from smlt.runtime.planner.pick import Pick, _cheap_then_fast
from smlt.runtime.planner.types import RunHistory

from .conftest import TIERS, make_job


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
    p = Pick(np.array(chosen), 0.5, None, "cost", "best effort: ...")
    return _cheap_then_fast(x, p, -np.array(progress, float))  # type: ignore[arg-type]  # the fields it reads


def test_speed_best_effort_takes_the_fastest_plan_near_the_most_progress():
    """The budget-bound ResNet-18 x8 speed runs: 1,024 MB buys the most progress with the money
    left (10 units, 48 s rounds), 1,769 MB 9.5 (31 s), 10,240 MB 5 (10 s). Within C.time_for_cost of
    the most progress the fastest is 1,769 MB; far beyond it, 10,240 MB is not taken."""
    assert C.time_for_cost == 0.1
    progress, round_s = [10.0, 9.5, 8.0, 5.0], [48.0, 31.0, 20.0, 10.0]
    assert _best_effort_pick("speed", progress, round_s) == 1
    assert _best_effort_pick("cost", progress, round_s) == 0  # the cost objective: the most progress
    # only the plans best effort may use count: with plan 1 out, plan 0 (plan 2 is 20 % short)
    assert _best_effort_pick("speed", progress, round_s, (True, False, True, True)) == 0


def _levels_of_three_plans(objective: str):
    """Three plans of a budget-bound speed run with $0.04 left: 0 cheap and slow (pays its way),
    1 fast (does not pay its own way at the median; after its worst round, plan 0 still could),
    2 faster still (its worst round leaves plan 0 short)."""
    qs = (0.9, 0.7, 0.5, 0.2)
    yes = np.ones(3, bool)
    cost = np.array([0.01, 0.05, 0.08])
    ev = SimpleNamespace(
        ok_rounds={q: yes for q in qs},
        ok_deadline={q: yes for q in qs},
        ok_budget={q: cost <= 0.04 for q in qs},
        C={q: cost for q in qs},
        T={q: np.array([100.0, 40.0, 30.0]) for q in qs},
        f=SimpleNamespace(cost_ub=np.array([0.002, 0.01, 0.035])),
    )
    job = make_job(constraints={"budget_usd": 0.05, "objective": objective})
    x = SimpleNamespace(job=job, ev=ev, spendable=0.04)
    return candidate_levels(x, yes, True)  # type: ignore[arg-type]  # the fields it reads


def test_speed_goes_fast_while_the_cheapest_plan_could_still_pay_its_way():
    """The budget-bound ResNet-18 x8 speed runs: a 10,240 MB plan whose whole way to the target
    did not fit at the median was refused although, after its worst round, the cheapest plan could
    still finish; the runs went to 1,769 MB and ended with a fifth of the budget unspent."""
    chosen, level, backup = _levels_of_three_plans("speed")[0]
    assert (level, backup) == (0.5, 0)
    assert chosen.tolist() == [True, True, False]
    # the cost objective (no deadline here) keeps its plain levels: a plan pays its own way
    chosen, _, backup = _levels_of_three_plans("cost")[0]
    assert backup is None and chosen.tolist() == [True, False, False]


def test_the_speed_objective_trains_on_one_worker_from_round_0(prices):
    speed = make_job(constraints={"budget_usd": 5.0, "objective": "speed"})
    cand = candidates(speed, RunHistory(), TIERS)
    assert cand.speed_one_worker and cand.n[cand.reach].max() == 1
    assert cand.n.max() > 1  # admission and giving up still judge every plan
    d = decide(speed, RunHistory(), TIERS, prices)
    assert d.action == "train" and d.workers == 1, d.reason
    assert d.notes == ["speed_one_worker"], d.reason
    # the cost objective keeps 4x the job's initial workers; workers.min and a held n are honoured
    cost = make_job(constraints={"budget_usd": 5.0, "deadline_seconds": 3600})
    assert candidates(cost, RunHistory(), TIERS).n[candidates(cost, RunHistory(), TIERS).reach].max() == 16
    at_least_2 = make_job(constraints={"budget_usd": 5.0, "objective": "speed"}, workers__min=2)
    assert candidates(at_least_2, RunHistory(), TIERS).n[candidates(at_least_2, RunHistory(), TIERS).reach].max() == 2
    held = candidates(speed, RunHistory(), TIERS, Hold(workers=4))
    assert not held.speed_one_worker and set(held.n[held.reach]) == {4}
    # an ablation that holds the tier and k (`workers_only`) chooses n itself
    n_only = candidates(speed, RunHistory(), TIERS, Hold(memory_mb=1769, local_steps=20))
    assert not n_only.speed_one_worker and n_only.n[n_only.reach].max() == 16
