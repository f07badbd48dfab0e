"""Admission control: at the first plan the job is refused only when even the optimistic (p10)
forecast misses, and the refusal names the constraint and the number to change it to."""

import re

from smlt.planner import decide

from .conftest import TIERS, make_history, make_job


def _job(deadline, budget):
    return make_job(
        constraints={"deadline_seconds": deadline, "budget_usd": budget},
        training={"target_value": 0.9, "max_rounds": 500, "local_steps": 20},
    )


def _round0():
    """A ResNet-50-sized job before anything is measured (no FLOPs, no timings)."""
    return make_history([], params=25_000_000, rows=50_000, flops=None)


def _advised(reason: str, field: str) -> float:
    m = re.search(rf"set constraints\.{field} to at least ([\d,.]+) \(now ", reason)
    assert m, (field, reason)
    return float(m.group(1).replace(",", ""))


def test_a_too_short_deadline_is_refused_with_the_deadline_that_works(prices):
    d = decide(_job(10.0, 50.0), _round0(), TIERS, prices)
    assert d.action == "stop" and d.infeasible and d.bound == "deadline"
    assert "p10 of the rounds needed" in d.reason
    advised = _advised(d.reason, "deadline_seconds")
    assert d.earliest_deadline_s is not None and advised >= d.earliest_deadline_s > 10.0
    assert "constraints.budget_usd" not in d.reason  # the budget is not what binds
    again = decide(_job(advised, 50.0), _round0(), TIERS, prices)
    assert again.action == "train" and not again.infeasible, again.reason


def test_a_too_small_budget_is_refused_with_the_budget_that_works(prices):
    d = decide(_job(1e6, 0.001), _round0(), TIERS, prices)
    assert d.action == "stop" and d.infeasible and d.bound == "budget"
    advised = _advised(d.reason, "budget_usd")
    assert d.min_budget_usd is not None and advised >= d.min_budget_usd > 0.001
    assert "constraints.deadline_seconds" not in d.reason
    again = decide(_job(1e6, advised), _round0(), TIERS, prices)
    assert again.action == "train" and not again.infeasible, again.reason


def test_only_what_the_optimistic_forecast_rules_out_is_refused(prices):
    """Half the median forecast's earliest deadline (or smallest budget) may still be met (the
    prior's p10 is far below its median): the job is admitted. A tenth of it is refused."""
    earliest = decide(_job(10.0, 50.0), _round0(), TIERS, prices).earliest_deadline_s
    cheapest = decide(_job(1e6, 0.001), _round0(), TIERS, prices).min_budget_usd
    assert earliest and cheapest
    assert not decide(_job(0.5 * earliest, 50.0), _round0(), TIERS, prices).infeasible
    assert not decide(_job(1e6, 0.5 * cheapest), _round0(), TIERS, prices).infeasible
    assert decide(_job(0.1 * earliest, 50.0), _round0(), TIERS, prices).infeasible
    assert decide(_job(1e6, 0.1 * cheapest), _round0(), TIERS, prices).infeasible
