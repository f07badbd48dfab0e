"""The study file, the sampler, the ASHA rule and the budget rule (pure)."""

import json
from pathlib import Path

import pytest

from smlt.runtime.errors import InvalidJob
from smlt.runtime.study import asha, budget
from smlt.runtime.study.sampler import sample
from smlt.runtime.study.spec import parse_study, trial_job

ROOT = Path(__file__).resolve().parents[2]


def study(**changes):
    raw = json.loads((ROOT / "examples/digits-study.json").read_text())
    raw.update(changes)
    return raw


def test_the_example_is_a_study_of_at_least_12_trials_over_lr_batch_and_width_with_asha():
    s = parse_study(study())
    assert s.trials >= 12 and s.search.kind == "asha"
    assert set(s.space) == {"training.learning_rate", "training.batch_size", "model.params.hidden"}
    assert s.direction == "max" and s.asha_rungs() == [1, 3, 9]


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"trials": 0}, "study.trials"),
        ({"budget_usd": -1}, "study.budget_usd"),
        ({"space": {"constraints.budget_usd": {"range": [0.1, 1]}}}, "study.space"),
        ({"space": {"training.learning_rate": {"log_range": [0.1, 0.01]}}}, "study.space.training.learning_rate"),
        ({"space": {"training.batch_size": {"choices": [16, -1]}}}, "training.batch_size"),
        ({"search": {"kind": "asha", "min_rounds": 50}}, "study.search.min_rounds"),
        ({"search": {"kind": "bayes"}}, "study.search"),
        ({"metric": "val_f1"}, "study.metric"),
        ({"deadline_seconds": 86400, "poll_seconds": 1}, "study.poll_seconds"),
    ],
)
def test_a_bad_study_names_the_field(changes, field):
    with pytest.raises(InvalidJob, match=field.replace(".", r"\.")):
        parse_study(study(**changes))


def test_a_job_given_as_a_study_is_named_as_a_job():
    job = json.loads((ROOT / "examples/digits.json").read_text())
    with pytest.raises(
        InvalidJob, match=r"^study: this is a job \(it has `dataset`\), not a study: run it with `smlt run`"
    ):
        parse_study(job)


def test_random_samples_are_seeded_within_the_space_and_make_valid_jobs():
    s = parse_study(study())
    a, b = sample(s), sample(s)
    assert a == b and len(a) == s.trials
    assert a != sample(parse_study(study(seed=1)))
    for p in a:
        assert 0.001 <= p["training.learning_rate"] <= 0.3
        assert p["training.batch_size"] in (16, 32, 64)
        job = trial_job(s, p)
        assert job["model"]["params"]["hidden"] == p["model.params.hidden"]
    assert len({p["training.learning_rate"] for p in a}) == s.trials


def test_grid_runs_the_combinations_in_order():
    s = parse_study(
        study(
            trials=6,
            search={"kind": "grid"},
            space={
                "training.learning_rate": {"log_range": [0.01, 1.0], "points": 3},
                "training.batch_size": {"choices": [16, 32]},
            },
        )
    )
    assert [(p["training.learning_rate"], p["training.batch_size"]) for p in sample(s)] == [
        (0.01, 16),
        (0.01, 32),
        (0.1, 16),
        (0.1, 32),
        (1.0, 16),
        (1.0, 32),
    ]


def test_asha_keeps_the_first_and_the_top_third_only():
    up = True
    assert asha.judge(0.5, 1, [], 3, up).keep  # first at its rung
    recorded = [0.9, 0.8, 0.7]
    assert asha.judge(0.95, 1, recorded, 3, up).keep
    stop = asha.judge(0.75, 1, recorded, 3, up)
    assert not stop.keep and stop.cutoff == pytest.approx(0.8333, abs=1e-3)
    assert "rung 1" in stop.reason("val_accuracy", 3)
    # lower is better: the same rule mirrored
    assert asha.judge(0.1, 1, [0.3, 0.4, 0.5], 3, False).keep
    assert not asha.judge(0.45, 1, [0.3, 0.4, 0.5], 3, False).keep


def test_asha_reads_the_rungs_a_curve_reached():
    curve = {0: 0.1, 1: None, 2: 0.8, 3: 0.9}
    assert asha.value_at(curve, 1) == 0.8  # round 1 was a partial evaluation: the next whole one
    assert asha.next_rungs(curve, [1, 3, 9], passed=0) == [(1, 0.8), (3, 0.9)]
    assert asha.next_rungs(curve, [1, 3, 9], passed=1) == [(3, 0.9)]
    assert asha.next_rungs(curve, [1, 3, 9], passed=3) == []


def test_budget_shares_never_shrink_and_never_sum_past_the_budget():
    b, n = 1.0, 5
    reserved, shares = 0.0, []
    for i in range(n):
        s = budget.share(b, reserved, n - i)
        shares.append(s)
        reserved += s
        if i % 2 == 0:  # every other trial stopped early, spending a tenth of its share
            reserved = budget.settle(reserved, s, s / 10)
    assert shares == sorted(shares) and shares[0] == pytest.approx(b / n)
    assert reserved <= b + 1e-12
    with pytest.raises(ValueError):
        budget.share(b, 0.0, 0)


def test_no_trial_starts_that_cannot_finish_before_the_deadline():
    assert budget.trial_deadline(1000.0, 900.0, 30.0) == pytest.approx(100 - budget.DEADLINE_MARGIN_S)
    assert budget.trial_deadline(1000.0, 975.0, 30.0) is None


def test_smlt_tune_refuses_a_bad_study_file_before_anything_starts(tmp_path, capsys):
    from smlt.cli import main

    path = tmp_path / "study.json"
    path.write_text(json.dumps(study(concurrency=0)))
    assert main(["tune", str(path), "--local"]) == 2
    err = capsys.readouterr().err
    assert "InvalidJob" in err and "study.concurrency" in err
    assert main(["tune", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_study_wide_error_keeps_its_own_words():
    # its words hold "; ": only the error's start gets the study's prefix
    job = {**study()["job"], "run_id": "mine"}
    with pytest.raises(InvalidJob) as e:
        parse_study(study(job=job))
    assert str(e.value) == "study.job.run_id: leave it out; every trial gets its own run id (<study id>-t<n>)"
