"""What more workers buy, learned from the run: a stall on averaged workers caps n at one."""

from __future__ import annotations

from smlt.runtime.planner import decide
from smlt.runtime.planner.candidates import candidates
from smlt.runtime.planner.stall import stalled_averaging

from .conftest import TIERS, make_history, make_job, make_round

CLIMB = [0.1, 0.3, 0.45, 0.55, 0.6]
# one evaluation no better than the best before it beyond the split's noise (2,000 rows: sd ~0.011)
FLAT = [0.601]


def _job():
    return make_job(
        training={"target_value": 0.9, "max_rounds": 200, "local_steps": 20},
        constraints={"deadline_seconds": 3600, "budget_usd": 5.0},
    )


def _history(accs, n):
    return make_history([make_round(i, n=n, k=80, acc=a) for i, a in enumerate(accs)])


def test_one_evaluation_without_a_rise_on_averaged_workers_caps_the_next_plan_at_one_worker(prices):
    job, hist = _job(), _history(CLIMB + FLAT, n=4)
    assert not stalled_averaging(job, _history(CLIMB, n=4), hist.val_rows)
    assert stalled_averaging(job, hist, hist.val_rows)
    cand = candidates(job, hist, TIERS, val_rows=hist.val_rows)
    assert cand.n[cand.reach].max() == 1
    assert cand.n.max() > 1  # admission and giving up still judge every plan
    d = decide(job, hist, TIERS, prices)
    assert d.action == "train" and d.workers == 1, d.reason
    assert "averaging_stalled" in d.notes, d.reason


def test_a_climbing_run_on_averaged_workers_keeps_its_reach():
    job, hist = _job(), _history(CLIMB + [0.65, 0.7, 0.75, 0.8, 0.85], n=4)
    assert not stalled_averaging(job, hist, hist.val_rows)
    cand = candidates(job, hist, TIERS, val_rows=hist.val_rows)
    assert cand.n[cand.reach].max() == 16  # 4 x the 4 workers tried


def test_a_stall_on_one_worker_says_nothing_about_averaging():
    job, hist = _job(), _history(CLIMB + FLAT + [0.6] * 4, n=1)
    assert not stalled_averaging(job, hist, hist.val_rows)
    cand = candidates(job, hist, TIERS, val_rows=hist.val_rows)
    assert cand.n[cand.reach].max() == 16  # 4 x the job's initial 4


def test_the_stall_is_judged_on_the_rounds_that_trained_the_evaluated_models():
    """Evaluation i is of the model round i - 1 trained: a run that switched from 4 workers to 1
    at the last round still shows a stall of averaged models (only the last window is flat)."""
    job = _job()
    rounds = [make_round(i, n=4, k=80, acc=a) for i, a in enumerate(CLIMB + FLAT[:-1])]
    rounds.append(make_round(len(rounds), n=1, k=80, acc=FLAT[-1]))
    hist = make_history(rounds)
    assert stalled_averaging(job, hist, hist.val_rows)
