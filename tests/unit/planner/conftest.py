"""Shared helpers for the planner tests: jobs, synthetic histories."""

from __future__ import annotations

import pytest

from smlt.runtime.bill import RoundShape, requests, services_usd
from smlt.runtime.config import FunctionSizes
from smlt.runtime.job import parse_job
from smlt.runtime.planner.types import RoundRecord, RunHistory, WorkerTiming
from smlt.runtime.prices import Prices

TIERS = [1024, 1769, 3008, 5120, 10240]


def make_job(**over):
    raw = {
        "dataset": {"uri": "s3://bucket/data/"},
        "training": {"target_value": 0.9, "max_rounds": 200, "local_steps": 20, "batch_size": 32},
        "constraints": {},
        "workers": {"planner": "adaptive", "initial": 4, "min": 1, "max": 64},
    }
    for key, val in over.items():
        section, _, field = key.partition("__")
        if field:
            raw.setdefault(section, {})[field] = val
        else:
            raw[section] = val
    return parse_job(raw)


def make_round(
    i,
    n=4,
    m=1769,
    k=20,
    step_s=0.02,
    load_s=0.3,
    upload_s=0.2,
    acc=None,
    cold=False,
    cost=None,
    round_s=None,
    prices=None,
):
    timings = []
    for w in range(n):
        comp = k * step_s
        total = load_s + 0.05 + comp + upload_s + 0.04
        timings.append(
            WorkerTiming(
                worker=w,
                memory_mb=m,
                samples=k * 32,
                load_s=load_s,
                eval_s=0.05,
                compute_s=comp,
                upload_s=upload_s,
                total_s=total,
                cold=cold,
                init_s=3.0 if cold else 0.0,
                cache_miss=cold,
            )
        )
    span = max(t.total_s + t.init_s for t in timings)
    prices = prices or Prices()
    if cost is None:
        sizes = FunctionSizes()
        shape = RoundShape(n, 0.0, sizes.planner_memory_mb, sizes.aggregate_memory_mb)
        services = services_usd(requests(shape), prices)  # the workers' bill is all the planner fits
        cost = sum(prices.lambda_cost(m, t.total_s + t.init_s) for t in timings) + services
    return RoundRecord(
        round=i,
        workers=n,
        memory_mb=m,
        local_steps=k,
        batch_size=32,
        workers_ok=n,
        timings=timings,
        aggregate_s=0.5,
        round_s=round_s or (1.0 + 0.2 * n + span + 0.5),
        val_accuracy=acc,
        val_loss=None if acc is None else 2.3 * (1 - acc),
        cost_usd=cost,
    )


def make_history(rounds, params=100_000, rows=20_000, **kw):
    elapsed = sum(r.round_s for r in rounds)
    cost = sum(r.cost_usd for r in rounds)
    return RunHistory(
        rounds=rounds,
        elapsed_s=kw.pop("elapsed_s", elapsed),
        cost_total_usd=kw.pop("cost", cost),
        param_count=params,
        train_rows=rows,
        val_rows=kw.pop("val_rows", 2000),
        dataset_bytes=rows * 200,
        flops_per_sample=kw.pop("flops", 6.0 * params),
        **kw,
    )


@pytest.fixture
def prices():
    return Prices()
