"""One bill of a round (smlt.runtime.bill): for the same round shape the planner's forecast and both
simulators count the same requests (the ledger's own count, from the engine's served requests, is
tests/e2e/test_ledger.py's)."""

from __future__ import annotations

import numpy as np
import pytest

from smlt.runtime import bill
from smlt.runtime.config import FunctionSizes, Settings
from smlt.runtime.planner.timing import JobShape, TimingModel
from smlt.runtime.prices import Prices
from smlt.sim import analytic
from smlt.sim.cloud import Cloud
from smlt.sim.run import history_of
from smlt.sim.workloads import WORKLOADS

WORKLOAD = WORKLOADS["digits-mlp"]  # small: one aggregator everywhere
N, M = 6, 1769


def _rounds():
    """A cold first round (every worker reads its shards), a warm one, an evaluation round."""
    cloud = Cloud(WORKLOAD, Prices(), seed=4, faults=False)  # the ledger of a round without injected faults
    for k in (5, 5, 0):
        rec = cloud.run_round(N, M, k, time_limit_s=None, plan=(0.3, 0.0))
        assert rec.workers_ok == N  # no failures: the analytic model assumes every worker reports
        yield cloud.last_bill, rec  # the simulator's bill of that round


@pytest.mark.parametrize("which", [0, 1, 2], ids=["cold", "warm", "eval"])
def test_the_planner_and_both_simulators_count_the_same_requests(which):
    sim_bill, rec = list(_rounds())[which]
    misses = sum(t.cache_miss for t in rec.timings)
    eval_only = rec.local_steps == 0
    tm = TimingModel(JobShape.of(history_of(WORKLOAD), WORKLOAD.batch), Prices())
    forecast = tm.round_requests(N, eval_only=eval_only, shard_reads=misses)
    sim = sim_bill.requests
    sizes = FunctionSizes()
    static = analytic.static_round_bill(N, M, 1.0, 1.0, 0.3, misses, 1, Prices(), "x86_64", sizes).requests
    assert forecast.as_dict() == sim.as_dict()
    if not eval_only:  # the analytic model prices training rounds only
        assert static.as_dict() == sim.as_dict()
    assert sim.transitions == 7 + N and sim.lambda_invocations == N + 2
    assert sim.s3_puts == (1 if eval_only else N + 1)
    assert sim.s3_gets == (N + 1 if eval_only else 2 * N + 1) + misses


def test_the_ledgers_round_shape_is_the_deployed_map_and_aggregation():
    settings = Settings(artifacts_bucket="a", table="t")
    shape = bill.ledger_round(settings, 6, 0, eval_only=False)
    assert (shape.workers, shape.aggregators, shape.worker_gb_s) == (6, 1, 0.0)
    assert shape.fanout == settings.fanout and shape.planner_memory_mb == settings.planner_memory_mb


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
    from smlt.runtime.planner.stops import finalize_cost

    sizes, prices = FunctionSizes(), Prices()
    seconds, cost = Cloud(WORKLOAD, prices, seed=1).finalize()
    assert cost == pytest.approx(bill.finalize_usd(prices, "x86_64", sizes.planner_memory_mb, seconds), rel=1e-12)
    expected = bill.finalize_usd(prices, "x86_64", sizes.planner_memory_mb, priors.FINALIZE_S)
    assert finalize_cost(prices, "x86_64") == pytest.approx(expected, rel=1e-12)
    assert bill.FINALIZE_TRANSITIONS == 4  # Plan, ShouldTrain, Finalize, Done


def test_a_round_in_plain_numbers_is_priced_as_in_arrays_bit_for_bit():
    """Plain numbers are counted and priced in Python floats (`bill._num`), arrays in numpy: every
    count and amount of a round is the same float either way, and with only some of its numbers
    arrays (the planner's forecast: the candidates' workers, the job's one aggregator)."""
    rng = np.random.default_rng(7)
    prices, fanout = Prices(), FunctionSizes().fanout
    for _ in range(500):
        n = int(rng.integers(1, 90))
        plain = dict(
            workers=n,
            worker_gb_s=float(rng.uniform(0, 500)),
            planner_memory_mb=int(rng.choice([512, 1024, 1769])),
            aggregate_memory_mb=int(rng.choice([1769, 3008])),
            plan_s=float(rng.choice([0.0, 0.0005, rng.uniform(0, 3)])),
            aggregate_s=float(rng.choice([0.0, rng.uniform(0, 30)])),
            reported=None if rng.random() < 0.5 else int(rng.integers(0, n + 1)),
            aggregators=int(rng.choice([1, 1, 3, 7])),
            eval_only=bool(rng.random() < 0.3),
            shard_reads=int(rng.integers(0, n + 1)),
            retries=int(rng.choice([0, 0, rng.integers(1, 20)])),
            exchange_steps=int(rng.choice([0, 0, rng.integers(1, 50)])),
        )
        arrays = {k: v if v is None else np.array([v], dtype=float) for k, v in plain.items()}
        some = {k: arrays[k] if rng.random() < 0.5 else v for k, v in plain.items()}
        bills = [bill.price(bill.RoundShape(fanout=fanout, **f), prices, "x86_64") for f in (plain, arrays, some)]
        assert isinstance(bills[0].usd, float)  # the plain path
        amounts = [(*b.requests.__dict__.values(), b.worker_usd, b.control_usd, b.services_usd) for b in bills]
        for x, y, z in zip(*amounts, strict=True):
            assert np.shape(x) == () and np.float64(x).tobytes() == np.asarray(y, float)[0].tobytes()
            assert np.asarray(z, float).ravel()[0].tobytes() == np.float64(x).tobytes()
