"""Admission control: at the first plan the job is refused only when even the optimistic (p10)
forecast misses, and the refusal names the constraint and the number to change it to."""

import math
import re

from smlt.runtime.job import ModelSpec
from smlt.runtime.planner import decide
from smlt.runtime.planner.footprint import model_cost

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
    assert (d.action, d.rule, d.bound) == ("stop", "infeasible", "deadline") and d.infeasible
    assert "p10 of the rounds needed" in d.reason
    advised = _advised(d.reason, "deadline_seconds")
    assert d.earliest_deadline_s is not None and advised >= d.earliest_deadline_s > 10.0
    assert "constraints.budget_usd" not in d.reason  # the budget is not what binds
    again = decide(_job(advised, 50.0), _round0(), TIERS, prices)
    assert again.action == "train" and not again.infeasible, again.reason


def test_a_too_small_budget_is_refused_with_the_budget_that_works(prices):
    d = decide(_job(1e6, 0.001), _round0(), TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "infeasible", "budget") and d.infeasible
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


def _resnet18_job(deadline, budget):
    """The benchmark's ResNet-18 on 1,600 8x8 images: its first plan, with and without the footprint
    the Plan step computes for a built-in model."""
    return make_job(
        constraints={"deadline_seconds": deadline, "budget_usd": budget},
        training={"target_value": 0.55, "max_rounds": 4000, "local_steps": 20, "batch_size": 32},
    )


def _first(model: str, shape, outputs, known: bool, rows=1600):
    cost = model_cost(ModelSpec(name=model), shape, outputs)
    assert cost is not None
    return make_history(
        [],
        params=cost.params if known else 0,
        rows=rows,
        val_rows=rows // 4,
        flops=cost.flops_per_sample if known else None,
    )


def test_a_deadline_a_resnet_cannot_meet_is_refused_once_its_size_is_known(prices):
    """Two rounds of the smallest ResNet-18 plan (a cold start, a warm round, finalisation) take
    longer than 12.5 s; unknown, the model was priced as a 100k-parameter dense one and admitted.
    (14.5 s, refused while the network was a flat 67.5 MB/s, is within reach at p10 with its
    ~1.2 GiB/s burst: the 45 MB model's load and upload take ~0.1 s a round, not ~1.3 s.)"""
    job = _resnet18_job(12.5, 0.0137)
    d = decide(job, _first("resnet18", (3, 8, 8), 10, known=True), TIERS, prices)
    assert (d.action, d.rule, d.bound) == ("stop", "infeasible", "deadline") and d.infeasible, d.reason
    assert d.earliest_deadline_s is not None and d.earliest_deadline_s > 12.5
    assert "(now 12.5)" in d.reason  # the deadline as set, not rounded to 12 or 13
    assert not decide(job, _first("resnet18", (3, 8, 8), 10, known=False), TIERS, prices).infeasible
    # the deadline it advises is admitted
    assert not decide(
        _resnet18_job(math.ceil(d.earliest_deadline_s), 0.0137), _first("resnet18", (3, 8, 8), 10, True), TIERS, prices
    ).infeasible


def test_the_same_deadline_is_admitted_for_a_small_model(prices):
    """The digits jobs the oracle finishes in 13.7-17.1 s: their footprint keeps them admitted."""
    for model, shape in (("mlp", (64,)), ("lenet", (1, 8, 8))):
        d = decide(_resnet18_job(13.7, 0.0017), _first(model, shape, 10, known=True, rows=1438), TIERS, prices)
        assert d.action == "train" and not d.infeasible, (model, d.reason)


def test_an_admitted_job_s_round_0_is_the_probe_of_an_unmeasured_model(prices):
    """The footprint decides admission; round 0 is planned as if the model were unmeasured (long,
    cut by its limit where the model is slow), not as the footprint's slow model would be."""
    from smlt.runtime.config import FunctionSizes
    from smlt.runtime.planner.adaptive import decide_adaptive

    job = _resnet18_job(180.0, 0.0137)  # the benchmark's loose ResNet-18 job: admitted
    known, unknown = _first("resnet18", (3, 8, 8), 10, True), _first("resnet18", (3, 8, 8), 10, False)
    d = decide(job, known, TIERS, prices)
    assert d.action == "train" and not d.infeasible, d.reason
    probe = decide(job, unknown, TIERS, prices)
    assert (d.workers, d.memory_mb, d.local_steps) == (probe.workers, probe.memory_mb, probe.local_steps)
    on_footprint = decide_adaptive(job, known, list(TIERS), prices, "x86_64", FunctionSizes(), None)
    assert (on_footprint.workers, on_footprint.memory_mb, on_footprint.local_steps) != (
        d.workers,
        d.memory_mb,
        d.local_steps,
    )
