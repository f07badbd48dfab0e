"""Round 0's step bound (issue #12): k may take two steps of the bound at once, so a short job
does not spend one of its few rounds climbing; later rounds step C.step_up_x at a time."""

from smlt.runtime.planner import decide
from smlt.runtime.planner.candidates import step_reach
from smlt.runtime.planner.config import DEFAULT as C
from smlt.runtime.planner.types import RunHistory

from .conftest import make_history, make_job, make_round

TIERS = [1024, 1769, 3008, 5120, 7168, 10240]


def _digits_x8_job():
    """The bench's digits MLP on 8x the rows, tight deadline and budget: its oracle trains
    ~4 rounds of 500 steps on one worker."""
    return make_job(
        constraints={"deadline_seconds": 21.0, "budget_usd": 0.00256},
        training={"target_value": 0.97, "max_rounds": 4000, "local_steps": 20},
    )


def test_a_short_job_s_round_0_plans_past_the_later_bound_and_within_the_probe(prices):
    """With k at most 4 x 20 in round 0 nothing fits even at p20 (best effort: 80-step rounds);
    with C.first_steps_up_x a plan of more than 80 steps fits at a safety level. The probe's limit
    still caps the round: at most 3 x the predicted handler + 10 s."""
    hist = RunHistory(train_rows=11_504, val_rows=359, dataset_bytes=2_945_024)
    d = decide(_digits_x8_job(), hist, TIERS, prices)
    assert d.action == "train" and d.local_steps > C.step_up_x * 20, d.reason
    assert d.local_steps <= C.first_steps_up_x * 20 and d.rule == "feasible", d.reason
    assert d.worker_time_limit_s is not None and d.predicted_round_s is not None
    assert d.worker_time_limit_s <= 3 * d.predicted_round_s + 10.0, d.reason


def test_after_round_0_k_steps_up_x4_from_what_the_workers_took():
    job = _digits_x8_job()
    r0 = make_round(0, n=1, m=1024, k=300, acc=0.3)
    assert step_reach(job, make_history([r0])) == (C.step_up_x * 4, C.step_up_x * 300)
    assert step_reach(job, RunHistory(train_rows=11_504)) == (16, 320)  # round 0: k x 16, n x 4


def test_the_speed_objective_keeps_round_0_s_small_probe():
    job = make_job(
        constraints={"budget_usd": 0.05, "objective": "speed"},
        training={"target_value": 0.97, "max_rounds": 4000, "local_steps": 20},
    )
    assert step_reach(job, RunHistory(train_rows=11_504)) == (16, 80)
