from smlt.runtime.planner import decide
from smlt.runtime.planner.fixed import default_tier

from .conftest import TIERS, make_history, make_job, make_round


def test_fixed_keeps_the_jobs_plan(prices):
    job = make_job(workers={"planner": "fixed", "initial": 3}, training={"local_steps": 7, "target_value": 0.9})
    d = decide(job, make_history([]), TIERS, prices)
    assert (d.action, d.workers, d.memory_mb, d.local_steps) == ("train", 3, 1769, 7)
    assert d.worker_time_limit_s and d.worker_time_limit_s > 0
    assert d.rule == "fixed"


def test_fixed_memory_default_and_pin(prices):
    assert default_tier([1024, 2048, 3008]) == 2048
    assert default_tier([512, 1024]) == 1024  # nothing >= 1769 MB: the largest
    job = make_job(workers={"planner": "fixed", "memory_mb": 3008})
    assert decide(job, make_history([]), [1024, 3008], prices).memory_mb == 3008


def test_fixed_stops_on_target_and_max_rounds(prices):
    job = make_job(workers={"planner": "fixed"}, training={"target_value": 0.9, "max_rounds": 5})
    hist = make_history([make_round(i, acc=0.5 + 0.1 * i) for i in range(5)])
    d = decide(job, hist, TIERS, prices)  # last val 0.9 >= 0.9
    assert (d.action, d.rule, d.bound) == ("stop", "target_reached", "target")
    hist = make_history([make_round(i, acc=0.5) for i in range(5)])
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "max_rounds", "max_rounds")


def test_fixed_loss_target_is_lower_is_better(prices):
    job = make_job(workers={"planner": "fixed"}, training={"target_metric": "val_loss", "target_value": 0.5})
    r = make_round(0, acc=0.5)
    r.val_loss = 0.6
    assert decide(job, make_history([r]), TIERS, prices).action == "train"
    r.val_loss = 0.5
    assert decide(job, make_history([r]), TIERS, prices).bound == "target"


def test_fixed_never_exceeds_budget(prices):
    job = make_job(workers={"planner": "fixed"}, constraints={"budget_usd": 0.01})
    hist = make_history([make_round(i) for i in range(3)], cost=0.0099)
    d = decide(job, hist, TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "budget_guard", "budget")
