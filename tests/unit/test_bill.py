"""One bill of a round (smlt.runtime.bill): for the same round shape the ledger, the planner's forecast and
both simulators count the same requests, and the ledger prices a simulated round as the simulator does."""

from __future__ import annotations

import time

import pytest

from smlt.runtime import bill
from smlt.runtime.config import FunctionSizes, Settings
from smlt.runtime.items import WorkerItem
from smlt.runtime.job import parse_job
from smlt.runtime.planner.timing import JobShape, TimingModel
from smlt.runtime.prices import Prices
from smlt.runtime.roundspec import RoundSpec
from smlt.sim import analytic
from smlt.sim.cloud import Cloud
from smlt.sim.run import history_of
from smlt.sim.workloads import WORKLOADS

WORKLOAD = WORKLOADS["digits-mlp"]  # small: one aggregator everywhere
N, M = 6, 1769


def _ledger(rec, plan_s: float, aggregators: int = 1):
    """The ledger's shape of a simulated round: its records as the workers write them."""
    settings = Settings(artifacts_bucket="a", table="t")
    job = parse_job({"dataset": {"uri": "s3://b/d/"}, "training": {"local_steps": max(rec.local_steps, 1)}})
    spec = RoundSpec(
        run_id="r",
        round=rec.round,
        workers=rec.workers,
        memory_mb=rec.memory_mb,
        local_steps=rec.local_steps,
        function_name="f",
        planned_at=time.time(),
        learning_rate=0.05,
        job=job,
    )
    records = [
        WorkerItem(worker=i, samples=0, memory_mb=t.memory_mb, total_s=t.init_s + t.total_s, cache_miss=t.cache_miss)
        for i, t in enumerate(rec.timings)
        if t.error is None
    ]
    failed = rec.workers - len(records)
    return settings, spec, records, failed, plan_s, rec.aggregate_s, aggregators


def _rounds():
    """A cold first round (every worker reads its shards), a warm one, an evaluation round."""
    cloud = Cloud(WORKLOAD, Prices(), seed=4, faults=False)  # the ledger of a round without injected faults
    for k in (5, 5, 0):
        rec = cloud.run_round(N, M, k, time_limit_s=None, plan=(0.3, 0.0))
        assert rec.workers_ok == N  # no failures: the analytic model assumes every worker reports
        yield cloud.last_bill, rec  # the simulator's bill of that round


@pytest.mark.parametrize("which", [0, 1, 2], ids=["cold", "warm", "eval"])
def test_ledger_planner_and_simulators_count_the_same_requests(which):
    sim_bill, rec = list(_rounds())[which]
    misses = sum(t.cache_miss for t in rec.timings)
    eval_only = rec.local_steps == 0
    ledger = bill.requests(bill.ledger_shape(*_ledger(rec, 0.3)))
    tm = TimingModel(JobShape.of(history_of(WORKLOAD), WORKLOAD.batch), Prices())
    forecast = tm.round_requests(N, eval_only=eval_only, shard_reads=misses)
    sim = sim_bill.requests
    sizes = FunctionSizes()
    static = analytic.static_round_bill(N, M, 1.0, 1.0, 0.3, misses, 1, Prices(), "x86_64", sizes).requests
    assert sim.as_dict() == ledger.as_dict()
    assert forecast.as_dict() == ledger.as_dict()
    if not eval_only:  # the analytic model prices training rounds only
        assert static.as_dict() == ledger.as_dict()
    assert ledger.transitions == 7 + N and ledger.lambda_invocations == N + 2
    assert ledger.s3_puts == (1 if eval_only else N + 1)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["cold", "warm", "eval"])
def test_the_ledger_prices_a_simulated_round_as_the_simulator(which):
    sim_bill, rec = list(_rounds())[which]
    settings, *rest = _ledger(rec, 0.3)
    assert bill.ledger_cost(settings, *rest) == pytest.approx(rec.cost_usd, rel=1e-12)


def test_sharded_aggregation_adds_its_states_and_invocations():
    one = bill.requests(bill.RoundShape(8, 0.0, 1024, 3008))
    four = bill.requests(bill.RoundShape(8, 0.0, 1024, 3008, aggregators=4))
    assert four.transitions - one.transitions == 6 + 3 * 4
    assert four.lambda_invocations - one.lambda_invocations == 4 + 2 - 1
    assert four.s3_gets - one.s3_gets == 4 * (8 + 1)


def test_counts_work_on_candidate_arrays():
    import numpy as np

    n = np.array([1.0, 4.0, 16.0])
    req = bill.requests(bill.RoundShape(n, 0.0, 1024, 3008))
    assert list(req.transitions) == [7 + x for x in n]  # inline Map: one task per worker


def test_the_map_kind_decides_the_transitions_per_worker():
    """An inline Map bills each worker's task; a Distributed Map also each child's start and end."""
    from smlt.runtime.fanout import Fanout

    inline = bill.requests(bill.RoundShape(40, 0.0, 1024, 3008))
    distributed = bill.requests(bill.RoundShape(41, 0.0, 1024, 3008))
    assert inline.transitions == 7 + 40 and distributed.transitions == 7 + 3 * 41
    # The switch is the deployed setting's: with it at 0 every round is a Distributed Map.
    always = bill.requests(bill.RoundShape(8, 0.0, 1024, 3008, fanout=Fanout(inline_max_workers=0)))
    assert always.transitions == 7 + 3 * 8


def test_the_end_of_a_run_is_billed_alike():
    """Finalize: the simulator's bill, the planner's reserve and the analytic model's use one count."""
    from smlt.runtime.planner import priors
    from smlt.runtime.planner.core import finalize_cost

    sizes, prices = FunctionSizes(), Prices()
    seconds, cost = Cloud(WORKLOAD, prices, seed=1).finalize()
    assert cost == pytest.approx(bill.finalize_usd(prices, "x86_64", sizes.planner_memory_mb, seconds), rel=1e-12)
    expected = bill.finalize_usd(prices, "x86_64", sizes.planner_memory_mb, priors.FINALIZE_S)
    assert finalize_cost(prices, "x86_64") == pytest.approx(expected, rel=1e-12)
    assert bill.FINALIZE_TRANSITIONS == 4  # Plan, ShouldTrain, Finalize, Done
