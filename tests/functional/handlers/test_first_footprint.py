"""The first plan knows a built-in model's size and FLOPs before round 0 (computed from the job's
model and the manifest's sample shape), and they are what round 0's workers then measure."""

import pytest

import smlt.runtime.steps.plan as plan_step
from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.records import RunTable
from tests.functional.handlers.conftest import job

IMAGES = "s3://smlt-data/datasets/digits-images/"


@pytest.fixture
def digit_images(aws):
    prepare_dataset("sklearn:digits?shape=1x8x8", IMAGES, shards=4)
    return IMAGES


def test_the_first_plan_reads_what_round_0_measures(digit_images, monkeypatch):
    seen = []

    def decide(job, history, *a, **kw):
        seen.append(history)
        return real(job, history, *a, **kw)

    real = plan_step.decide
    monkeypatch.setattr(plan_step, "decide", decide)
    run, j = "fp", {**job(digit_images, local_steps=2), "model": {"name": "lenet"}}
    p = planner({"op": "plan", "job": j, "execution": run}, None)
    assert p["action"] == "train" and p["round"] == 0
    for w in p["workers"]:
        train_step({"run_id": run, "round": 0, "worker": w}, None)
    aggregate({"run_id": run, "round": 0}, None)
    (first,) = seen
    measured = RunTable("smlt-runs", run).rounds()[0]
    assert first.param_count == measured.param_count > 0
    assert first.flops_per_sample == measured.flops_per_sample > 0
    planner({"op": "plan", "job": j, "execution": run}, None)
    assert seen[1].flops_per_sample == measured.flops_per_sample  # from the round, as before


def test_a_users_model_is_planned_without_one(digits, monkeypatch):
    seen = []
    real = plan_step.decide
    monkeypatch.setattr(
        plan_step, "decide", lambda job, history, *a, **kw: seen.append(history) or real(job, history, *a, **kw)
    )
    planner({"op": "plan", "job": {**job(digits), "model": {"name": "mypkg.net:build"}}, "execution": "u"}, None)
    assert seen[0].param_count == 0 and seen[0].flops_per_sample is None
