"""PlannerConfig: the decision rule's constants in one typed object; a variant is passed, never patched."""

import json

import pytest

from smlt.runtime.planner import decide
from smlt.runtime.planner.config import DEFAULT, PlannerConfig, PlannerConfigError, active, using

from .conftest import TIERS, make_history, make_job

pytestmark = pytest.mark.unit


def test_every_field_says_what_it_means_and_which_decision_set_it():
    for name, field in PlannerConfig.model_fields.items():
        assert field.description, name
        extra = field.json_schema_extra
        assert isinstance(extra, dict) and "decision" in extra, name


def test_the_defaults_are_the_deployed_values():
    """The values the decision records (docs/decisions/) and the benchmark's results were measured with."""
    c = PlannerConfig()
    assert (c.step_up_x, c.first_steps_up_x, c.time_for_cost) == (4, 16, 0.1)
    assert (c.admit_q, c.advise_q, c.p_never_give_up, c.midrun_optimism) == (0.1, 0.5, 0.99, 0.5)
    assert (c.stall_rounds, c.plateau_rounds, c.stall_z, c.averaging_stall_rounds) == (4, 8, 2.0, 1)
    assert c.feasible_qs == (0.9, 0.7, 0.5, 0.2) and c.backup_qs == (0.9, 0.7) and c.budget_q == 0.5
    assert c.speed_backup_qs == (0.5,)
    assert (c.overhead_x, c.cost_overhead_x) == (2.0, 1.0)
    assert (c.short_round_every, c.short_round_x, c.short_round_min_k, c.short_round_min_left) == (2, 4, 120, 8.0)


def test_a_variant_file_is_read_and_a_bad_one_named(tmp_path):
    good = tmp_path / "v.json"
    good.write_text(json.dumps({"step_up_x": 8}))
    assert PlannerConfig.from_file(good).step_up_x == 8
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"step_upx": 8}))
    with pytest.raises(PlannerConfigError, match="bad.json: step_upx"):
        PlannerConfig.from_file(bad)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"admit_q": "low"}))
    with pytest.raises(PlannerConfigError, match="admit_q"):
        PlannerConfig.from_file(typo)


def test_decide_plans_with_the_variant_it_is_given_and_leaves_the_default_active(prices):
    """Round 0's k bound is the config's: a variant with no first-round widening keeps k at
    step_up_x times the job's; the default allows first_steps_up_x times."""
    job = make_job(
        training={"target_value": 0.97, "max_rounds": 200, "local_steps": 20},
        workers={"planner": "adaptive", "initial": 1, "min": 1, "max": 8},
        constraints={"deadline_seconds": 600.0, "budget_usd": 1.0},
    )
    hist = make_history([], params=100_000, rows=11_500, flops=None)
    wide = decide(job, hist, TIERS, prices)
    assert wide.action == "train" and wide.local_steps > 20, wide.reason  # k up to 16x the job's
    narrow = decide(job, hist, TIERS, prices, config=PlannerConfig(first_steps_up_x=1, step_up_x=1))
    assert narrow.action == "train" and narrow.local_steps <= 20 and narrow.workers <= 1, narrow.reason
    assert active() is DEFAULT
    with using(PlannerConfig(step_up_x=1, first_steps_up_x=1)):
        assert decide(job, hist, TIERS, prices).local_steps <= 20
    assert active() is DEFAULT
    assert decide(job, hist, TIERS, prices) == decide(job, hist, TIERS, prices, config=PlannerConfig())
