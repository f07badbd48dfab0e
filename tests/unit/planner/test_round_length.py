"""How long a round may be, and how many workers (issue #12, the long jobs): k stops where a
round's compute reaches C.overhead_x times its fixed overhead, counted in the scarcer limit; a plan on
more workers than the fewest allowed only when none on the fewest meets the constraints."""

from types import SimpleNamespace

import numpy as np

from smlt.runtime.planner import decide
from smlt.runtime.planner.candidates import candidates
from smlt.runtime.planner.config import DEFAULT as C
from smlt.runtime.planner.evaluate import Choice, evaluate, progress_model
from smlt.runtime.planner.levels import round_length_hedge
from smlt.runtime.planner.pick import Pick, fewest_workers
from smlt.runtime.planner.timing import JobShape, TimingModel

from .conftest import TIERS, make_history, make_job, make_round


def _run(step_s, k=300, **constraints):
    """Five rounds of one worker x 1,769 MB x k steps of step_s seconds, climbing slowly (the next
    round is not a shorter-round probe: `_short_round_probe`)."""
    job = make_job(
        training={"target_value": 0.9, "max_rounds": 500, "local_steps": 20},
        constraints=constraints,
    )
    accs = [0.10, 0.20, 0.28, 0.35, 0.41]
    rounds = [make_round(i, n=1, m=1769, k=k, step_s=step_s, acc=a) for i, a in enumerate(accs)]
    return job, make_history(rounds, params=2_000_000, rows=50_000, flops=None)


def test_a_compute_heavy_round_stops_near_twice_its_overhead(prices):
    """100 ms steps against ~2.5 s of fixed overhead a round: no more than ~50-80 steps, where the
    progress model alone (no drift until shown) went on to 4x the 300 steps tried."""
    assert C.overhead_x == 2.0
    job, hist = _run(0.1, deadline_seconds=3600.0, budget_usd=5.0)
    d = decide(job, hist, TIERS, prices)
    assert d.action == "train" and d.local_steps <= 120, d.reason


def test_cheap_steps_keep_long_rounds(prices):
    """1 ms steps (a digits MLP): the overhead dominates any k of the set, so the hedge never binds."""
    job, hist = _run(0.001, deadline_seconds=3600.0, budget_usd=5.0)
    d = decide(job, hist, TIERS, prices)
    assert d.action == "train" and d.local_steps >= 500, d.reason


def _fewest(n, chosen, min_workers=1):
    job = make_job(workers={"planner": "adaptive", "initial": 4, "min": min_workers, "max": 64})
    x = SimpleNamespace(job=job, cand=SimpleNamespace(n=np.array(n, float)))
    p = Pick(np.array(chosen), 0.9, None, "cost", "")
    return fewest_workers(x, p).chosen.tolist()  # type: ignore[arg-type]  # the fields it reads


def test_more_workers_only_when_no_plan_on_the_fewest_meets_the_level():
    assert _fewest([1, 2, 4, 1], [True, True, True, False]) == [True, False, False, False]
    assert _fewest([1, 2, 4, 1], [False, True, True, False]) == [False, True, True, False]  # none on one
    assert _fewest([2, 3, 4], [True, True, True], min_workers=2) == [True, False, False]


def _allowed_k(job, hist, prices, n=1, m=1024):
    """The largest k the hedge allows at (n, m), built as `decide_adaptive` builds its choice."""
    tr = job.training
    shape = JobShape.of(hist, tr.batch_size, tr.compression, tr.mode)
    tm = TimingModel(shape, prices, "x86_64").fit(hist)
    cand = candidates(job, hist, TIERS, None, shape.val_rows)
    pm = progress_model(job, hist, shape)
    x = Choice(job, hist, tm, pm, prices, "x86_64", cand, evaluate(job, hist, cand, tm, pm, prices, "x86_64"))
    ok = round_length_hedge(x) & (cand.n == n) & (cand.m == m)
    return int(cand.k[ok].max())


def test_the_hedge_counts_the_scarcer_limit(prices):
    """At 1,024 MB a 170 ms step is long against the round's seconds of overhead but not against its
    dollars (the per-round charges): a deadline-bound run stops k sooner than a budget-bound one."""
    job, hist = _run(0.1, deadline_seconds=1200.0)
    by_time = _allowed_k(job, hist, prices)
    job, hist = _run(0.1, budget_usd=0.2)
    by_cost = _allowed_k(job, hist, prices)
    assert by_time < by_cost <= 300, (by_time, by_cost)
    job, hist = _run(0.1)
    assert _allowed_k(job, hist, prices) == by_time  # no limit: time (a tie)
    job, _ = _run(0.1, deadline_seconds=1200.0)
    round0 = make_history([], params=2_000_000, rows=50_000, flops=None)
    assert _allowed_k(job, round0, prices) == 1200  # round 0: exempt
