"""The ablations: the planner choosing workers only, and its round-0 plan held static."""

from smlt.runtime.planner import decide
from smlt.runtime.planner.candidates import Hold, tiers_usable
from smlt.sim.ablations import static_plan, workers_only

from .conftest import TIERS, make_history, make_job, make_round


def _job(deadline=4000):
    return make_job(
        constraints={"deadline_seconds": deadline, "budget_usd": 20.0},
        training={"target_value": 0.9, "max_rounds": 500, "local_steps": 20},
    )


def _slow_history():
    """Workers 20x slower than the priors: the full planner moves memory and local steps."""
    rounds = [make_round(i, n=4, m=1769, k=50, step_s=0.2, acc=a) for i, a in enumerate([0.1, 0.3, 0.45, 0.55])]
    return make_history(rounds, params=1_000_000, rows=50_000, flops=6e6)


def test_workers_only_holds_the_smallest_fitting_tier_and_the_jobs_steps(prices):
    # a tight deadline: choosing freely, even with the job's local steps, a bigger tier is faster
    job, hist = _job(deadline=300), _slow_history()
    full = decide(job, hist, TIERS, prices)
    assert (full.memory_mb, full.local_steps) != (min(TIERS), 20)  # the test can tell the difference
    assert decide(job, hist, TIERS, prices, hold=Hold(local_steps=20)).memory_mb != min(TIERS)
    for h in (make_history([], params=1_000_000, rows=50_000), hist):
        d = workers_only(job, h, TIERS, prices)
        assert d.action == "train"
        assert d.memory_mb == tiers_usable(job, h, TIERS)[0] == min(TIERS)
        assert d.local_steps == 20


def test_workers_only_moves_up_after_out_of_memory(prices):
    r = make_round(0, n=2, m=1024, k=20, acc=0.1)
    for t in r.timings:
        t.error = "OutOfMemory"
    d = workers_only(_job(), make_history([r], params=1_000_000, rows=50_000), TIERS, prices)
    assert d.action == "train" and d.memory_mb == 1769


def test_static_plan_repeats_round_0(prices):
    job = _job()
    d0 = static_plan(job, make_history([], params=1_000_000, rows=50_000), TIERS, prices)
    assert d0 == decide(job, make_history([], params=1_000_000, rows=50_000), TIERS, prices)
    hist = _slow_history()
    first = hist.rounds[0]
    full = decide(job, hist, TIERS, prices)
    assert (full.workers, full.memory_mb, full.local_steps) != (first.workers, first.memory_mb, first.local_steps)
    d = static_plan(job, hist, TIERS, prices)
    assert d.action == "train"
    assert (d.workers, d.memory_mb, d.local_steps) == (first.workers, first.memory_mb, first.local_steps)


def test_ablations_keep_the_stop_rules(prices):
    job = make_job(constraints={"budget_usd": 1.0}, training={"target_value": 0.9, "max_rounds": 500})
    hist = make_history([make_round(i, acc=0.3 + 0.01 * i) for i in range(5)], cost=0.99995)
    for planner in (workers_only, static_plan):
        d = planner(job, hist, TIERS, prices)
        assert d.action == "stop" and d.bound == "budget"
