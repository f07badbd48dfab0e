import math

import numpy as np

from smlt.runtime.planner import decide
from smlt.runtime.planner.adaptive import planning_history
from smlt.runtime.planner.stops import finalize_cost_ub
from smlt.runtime.planner.timing import JobShape, TimingModel

from .conftest import TIERS, make_history, make_job, make_round


def _job(**c):
    return make_job(constraints=c, training={"target_value": 0.9, "max_rounds": 500, "local_steps": 20})


def test_round0_uses_priors_and_explains(prices):
    d = decide(_job(deadline_seconds=3600, budget_usd=5.0), make_history([]), TIERS, prices)
    assert (d.action, d.rule) == ("train", "feasible")
    assert d.workers >= 1 and d.memory_mb in TIERS and d.local_steps >= 1
    assert d.predicted_round_s > 0 and d.predicted_round_cost_usd > 0 and d.predicted_rounds_left >= 1
    assert d.worker_time_limit_s and d.worker_time_limit_s <= 900
    for piece in ("workers x", "MB x", "round ~", "worst case", "rounds to val_accuracy", "left"):
        assert piece in d.reason, (piece, d.reason)


def test_infeasible_deadline_names_the_earliest_deadline(prices):
    d = decide(
        _job(deadline_seconds=2.0, budget_usd=50.0),
        make_history([], params=25_000_000, rows=50_000, flops=3.9e9),
        TIERS,
        prices,
    )
    assert (d.action, d.rule) == ("stop", "infeasible") and d.infeasible
    assert d.earliest_deadline_s and d.earliest_deadline_s > 2.0


def test_infeasible_budget_names_the_smallest_budget(prices):
    d = decide(_job(deadline_seconds=1e6, budget_usd=1e-5), make_history([]), TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "infeasible", "budget") and d.infeasible
    assert d.min_budget_usd and d.min_budget_usd > 1e-5


def test_infeasible_both_mentions_both(prices):
    d = decide(
        _job(deadline_seconds=5.0, budget_usd=0.002),
        make_history([], params=25_000_000, rows=50_000, flops=3.9e9),
        TIERS,
        prices,
    )
    assert d.rule == "infeasible" and d.infeasible
    assert d.earliest_deadline_s and d.earliest_deadline_s > 5.0 and d.min_budget_usd and d.min_budget_usd > 0.002


def test_best_effort_trains_anyway(prices):
    job = make_job(
        constraints={"deadline_seconds": 2.0, "budget_usd": 50.0, "best_effort": True}, training={"target_value": 0.9}
    )
    d = decide(job, make_history([], params=25_000_000, rows=50_000, flops=3.9e9), TIERS, prices)
    assert d.action == "train" and not d.infeasible


def test_decision_changes_when_timings_change(prices):
    """Same curve and constraints; in one history the workers' compute was 20x slower than in the
    other. The planner must react (more workers, more memory or fewer steps) and say why."""
    job = _job(deadline_seconds=4000, budget_usd=20.0)
    # five rounds: the next is not a shorter-round probe, whose k / 4 (and a new tier's cold start)
    # would blur the seconds per step compared below
    curve = [0.1, 0.3, 0.45, 0.55, 0.62]

    def hist(step_s):
        rounds = [make_round(i, n=4, m=1769, k=50, step_s=step_s, acc=a) for i, a in enumerate(curve)]
        return make_history(rounds, params=1_000_000, rows=50_000, flops=6e6)

    fast = decide(job, hist(0.01), TIERS, prices)
    slow = decide(job, hist(0.2), TIERS, prices)
    assert fast.action == slow.action == "train"
    assert (fast.workers, fast.memory_mb, fast.local_steps) != (slow.workers, slow.memory_mb, slow.local_steps)
    assert slow.predicted_round_s / slow.local_steps > fast.predicted_round_s / fast.local_steps
    assert fast.reason != slow.reason


def test_budget_guard_stops_with_reason(prices):
    job = _job(budget_usd=1.0)
    hist = make_history([make_round(i, acc=0.3 + 0.01 * i) for i in range(5)], cost=0.99995)
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "budget_guard", "budget")


def test_deadline_stop_with_reason(prices):
    job = _job(deadline_seconds=100.0)
    hist = make_history([make_round(i, acc=0.3 + 0.01 * i) for i in range(5)], elapsed_s=99.5)
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "deadline", "deadline"), d.reason


def test_target_and_max_rounds_stop(prices):
    job = make_job(training={"target_value": 0.9, "max_rounds": 4})
    d = decide(job, make_history([make_round(i, acc=a) for i, a in enumerate([0.2, 0.5, 0.8, 0.95])]), TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "target_reached", "target")
    d = decide(job, make_history([make_round(i, acc=0.3) for i in range(4)]), TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "max_rounds", "max_rounds")


def test_respects_worker_bounds_and_pinned_memory(prices):
    job = make_job(
        workers={"planner": "adaptive", "initial": 3, "min": 2, "max": 5, "memory_mb": 3008},
        constraints={"deadline_seconds": 30.0},
        training={"target_value": 0.9},
    )
    d = decide(job, make_history([]), TIERS, prices)
    if d.action == "train":
        assert 2 <= d.workers <= 5 and d.memory_mb == 3008


def test_budget_never_exceeded_over_random_histories(prices):
    """Property: whatever the history, a 'train' decision's worst case plus finalisation fits the
    budget that is left."""
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(40):
        n_rounds = int(rng.integers(0, 8))
        params = int(10 ** rng.uniform(4, 7.4))
        rows = int(10 ** rng.uniform(3, 5.3))
        rounds = []
        for i in range(n_rounds):
            n = int(rng.integers(1, 17))
            m = int(rng.choice(TIERS))
            k = int(rng.choice([1, 5, 20, 100]))
            rounds.append(
                make_round(
                    i,
                    n=n,
                    m=m,
                    k=k,
                    step_s=float(10 ** rng.uniform(-3.5, 0)),
                    load_s=float(rng.uniform(0.05, 3)),
                    acc=float(min(0.95, 0.1 + 0.1 * i)),
                    cold=bool(rng.random() < 0.3),
                )
            )
        spent = sum(r.cost_usd for r in rounds)
        budget = spent + float(10 ** rng.uniform(-4, 0))
        job = make_job(
            constraints={"budget_usd": budget, "deadline_seconds": float(10 ** rng.uniform(1, 5))},
            training={"target_value": 0.9, "max_rounds": 1000},
        )
        hist = make_history(rounds, params=params, rows=rows, cost=spent)
        d = decide(job, hist, TIERS, prices)
        if d.action != "train":
            assert d.rule in ("budget_guard", "deadline", "infeasible", "give_up", "target_reached"), d.reason
            continue
        planned = planning_history(hist)  # round 0: the probe of an unmeasured model
        tm = TimingModel(JobShape.of(planned, 32), prices).fit(planned)
        f = tm.forecast([d.workers], [d.memory_mb], [d.local_steps], planned)
        worst = float(f.cost_ub[0]) + finalize_cost_ub(prices, "x86_64")
        assert spent + worst <= budget + 1e-12, (trial, spent, worst, budget, d.reason)
        assert math.isclose(d.worker_time_limit_s, round(float(f.time_limit_s[0]), 1))
        checked += 1
    assert checked >= 5
