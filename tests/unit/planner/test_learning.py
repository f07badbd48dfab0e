"""The planner learns what the workers record: the steps they actually took, cut rounds included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smlt.runtime.planner import decide
from smlt.runtime.planner.progress import ProgressModel, round_progress
from smlt.runtime.planner.timing import JobShape, TimingModel
from smlt.runtime.planner.types import Decision, RoundRecord, RunHistory, WorkerTiming

from .conftest import TIERS, make_history, make_job, make_round

LOAD_S, EVAL_S, UPLOAD_S = 0.3, 0.05, 0.2


def _round(i: int, d: Decision, step_s: float, acc: float) -> RoundRecord:
    """What the real workers record: each stops its steps at 0.8 x the plan's compute limit
    (smlt.runtime.steps.train) and reports the steps it took; its partial update counts."""
    limit = d.worker_time_limit_s or math.inf
    budget = 0.8 * limit - LOAD_S - EVAL_S
    steps = max(1, min(d.local_steps, int(budget // step_s)))
    cut = steps < d.local_steps
    timings = [
        WorkerTiming(
            worker=w,
            memory_mb=d.memory_mb,
            samples=steps * 32,
            load_s=LOAD_S,
            eval_s=EVAL_S,
            compute_s=steps * step_s,
            upload_s=UPLOAD_S,
            total_s=LOAD_S + EVAL_S + steps * step_s + UPLOAD_S + 0.04,
            steps=steps,
            cut=cut,
        )
        for w in range(d.workers)
    ]
    span = max(t.total_s for t in timings)
    return RoundRecord(
        round=i,
        workers=d.workers,
        memory_mb=d.memory_mb,
        local_steps=d.local_steps,
        batch_size=32,
        workers_ok=d.workers,
        timings=timings,
        aggregate_s=0.5,
        round_s=1.0 + 0.2 * d.workers + span + 0.5,
        val_accuracy=acc,
    )


def _run(hist: RunHistory, slowdown: float, rounds: int, prices) -> list[tuple[Decision, RoundRecord]]:
    job = make_job(
        constraints={"deadline_seconds": 20_000, "budget_usd": 50.0},
        # local_steps 200: round 0 may plan up to C.step_up_x x the job's k, enough for its cut
        training={"target_value": 0.95, "max_rounds": 500, "local_steps": 200},
        # one tier: these records have no cold starts, which a move to a new tier would predict
        workers={"planner": "adaptive", "initial": 4, "min": 1, "max": 64, "memory_mb": 1769},
    )
    prior = TimingModel(JobShape.of(hist, 32), prices)
    out = []
    for i in range(rounds):
        d = decide(job, hist, TIERS, prices)
        assert d.action == "train", d.reason
        true_step = slowdown * float(prior.step_seconds(d.memory_mb)[0])
        rec = _round(i, d, true_step, acc=min(0.9, 0.1 + 0.05 * i))
        hist.rounds.append(rec)
        hist.elapsed_s += rec.round_s
        hist.cost_total_usd += 0.001
        out.append((d, rec))
    return out


@pytest.mark.parametrize("slowdown", [4.0, 10.0])
def test_an_under_predicting_planner_corrects_itself_from_cut_rounds(prices, slowdown):
    """The true step time is 4x (10x) the prior's, and the FLOPs per sample are not known. Round 0
    is planned on the prior and its workers are cut at the compute limit; from the steps they took
    the planner must predict the round time within 10 % from round 1 on and stop planning rounds
    that get cut. (Per-step time from the planned steps under-predicts again and again.)"""
    hist = make_history([], params=5_000_000, rows=50_000, flops=None)
    run = _run(hist, slowdown, 5, prices)
    d0, r0 = run[0]
    assert r0.cut, "round 0 must be cut for this test to say anything"
    assert d0.predicted_round_s is not None and d0.predicted_round_s < 0.7 * r0.round_s
    step0 = r0.timings[0].compute_s / r0.timings[0].steps
    said = f"since round 0: step time measured {1e3 * step0:.1f} ms at {r0.memory_mb} MB vs "
    assert said in run[1][0].reason and "(workers cut at the limit)" in run[1][0].reason, run[1][0].reason
    for d, r in run[1:]:
        assert d.predicted_round_s is not None
        assert abs(d.predicted_round_s - r.round_s) <= 0.1 * r.round_s, (d.predicted_round_s, r.round_s)
        assert not r.cut, d.reason


def test_progress_is_credited_for_the_steps_taken():
    full = RoundRecord(round=0, workers=2, memory_mb=1769, local_steps=100, batch_size=32, workers_ok=2)
    timings = [WorkerTiming(worker=w, memory_mb=1769, samples=25 * 32, steps=25, cut=True) for w in range(2)]
    cut = full.model_copy(update={"timings": timings})
    assert full.steps_applied() == 100
    assert cut.steps_applied() == 25
    old = [WorkerTiming(worker=w, memory_mb=1769, samples=40 * 32) for w in range(2)]  # no steps recorded
    assert full.model_copy(update={"timings": old}).steps_applied() == 40


def test_progress_model_credits_cut_rounds_with_the_steps_taken():
    """Two histories of 3 rounds x 4 workers x 100 planned steps; in one the workers were cut
    after 25 steps. The progress so far must be the steps taken, and more rounds remain."""

    def fitted(steps):
        rounds = []
        for i in range(3):
            r = make_round(i, n=4, k=100, acc=0.1 + 0.02 * i)
            for t in r.timings:
                t.steps, t.cut, t.samples = steps, steps < 100, steps * 32
            rounds.append(r)
        pm = ProgressModel(
            metric="val_accuracy",
            target=0.9,
            momentum=0.9,
            batch=32,
            train_rows=50_000,
            val_rows=5000,
            quorum=0.5,
            max_rounds=1000,
            initial_workers=4,
            initial_steps=100,
        )
        return pm.fit(make_history(rounds, rows=50_000))

    full, cut = fitted(100), fitted(25)
    # without drift (large K) 25 steps are a quarter of 100; with a short K long rounds are worth less
    no_drift = cut.drifts >= 1000
    assert np.all(cut.tau_now[no_drift] < 0.4 * full.tau_now[no_drift]) and np.all(cut.tau_now < full.tau_now)
    assert np.allclose(cut.tau_now, 3 * round_progress(4, 25, cut.mu_e, cut.betas, cut.drifts))
