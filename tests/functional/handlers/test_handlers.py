"""The three handlers driven as the state machine drives them, on moto."""

import json

import boto3
import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.errors import InvalidDataset, InvalidJob, StaleInvocation
from smlt.runtime.tensors.format import views
from tests.functional.handlers.conftest import job, reconciled, run_keys


def drive(job_input, execution="run-1", duplicate=False, max_rounds=50):
    """Plan → workers → aggregate until stop, then finalize. With duplicate, every step runs twice."""
    for _ in range(max_rounds):
        plan = planner({"op": "plan", "job": job_input, "execution": execution}, None)
        if duplicate:
            assert planner({"op": "plan", "job": job_input, "execution": execution}, None) == plan
        if plan["action"] == "stop":
            break
        for w in plan["workers"]:
            out = train_step({"run_id": plan["run_id"], "round": plan["round"], "worker": w}, None)
            if duplicate:
                again = train_step({"run_id": plan["run_id"], "round": plan["round"], "worker": w}, None)
                assert again["samples"] == out["samples"]
        agg = aggregate({"run_id": plan["run_id"], "round": plan["round"], "outcomes": []}, None)
        if duplicate:
            assert aggregate({"run_id": plan["run_id"], "round": plan["round"]}, None) == agg
        if agg["stop"]:
            break
    return planner({"op": "finalize", "run_id": plan["run_id"]}, None)


def test_digits_reaches_target(digits, aws):
    final = drive(job(digits))
    assert final["val_accuracy"] >= 0.95
    metrics = json.loads(aws.get_object(Bucket="smlt-artifacts", Key="runs/run-1/final/metrics.json")["Body"].read())
    assert metrics["final"]["rounds"] == final["rounds"] > 0
    assert reconciled("run-1") == []
    assert metrics["final"]["estimated_cost_usd"] > 0
    assert "runs/run-1/final/model.safetensors" in run_keys(aws, "run-1")


def test_every_step_twice_leaves_the_state_of_one_run(digits, aws):
    once = drive(job(digits, max_rounds=3, target_value=None), execution="once")
    twice = drive(job(digits, max_rounds=3, target_value=None), execution="twice", duplicate=True)
    assert once["val_accuracy"] == twice["val_accuracy"] and once["rounds"] == twice["rounds"] == 3
    a = aws.get_object(Bucket="smlt-artifacts", Key="runs/once/final/model.safetensors")["Body"].read()
    b = aws.get_object(Bucket="smlt-artifacts", Key="runs/twice/final/model.safetensors")["Body"].read()
    # The same weights; the model cards inside differ only by the run id.
    (wa, ma), (wb, mb) = views(a), views(b)
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    assert ma["smlt.model_card"].replace('"once"', '"twice"') == mb["smlt.model_card"]
    assert [k.replace("twice", "once") for k in run_keys(aws, "twice")] == run_keys(aws, "once")


def test_late_worker_is_refused_after_aggregation(digits, aws):
    plan = planner({"op": "plan", "job": job(digits), "execution": "late"}, None)
    for w in plan["workers"][:-1]:
        train_step({"run_id": "late", "round": 0, "worker": w}, None)
    aggregate({"run_id": "late", "round": 0}, None)
    with pytest.raises(StaleInvocation):
        train_step({"run_id": "late", "round": 0, "worker": plan["workers"][-1]}, None)


@pytest.mark.parametrize(
    "mutate, error, field",
    [
        (lambda j: j.pop("dataset"), InvalidJob, "dataset"),
        (lambda j: j.update(constraints={"budget_usd": -1}), InvalidJob, "constraints.budget_usd"),
        (lambda j: j.update(model={"name": "nope"}), InvalidJob, "model.name"),
        (lambda j: j["training"].update(batch_size="x"), InvalidJob, "training.batch_size"),
        (lambda j: j["workers"].update(memory_mb=2048), InvalidJob, "workers.memory_mb"),
        (lambda j: j.update(dataset={"uri": "s3://smlt-data/datasets/missing/"}), InvalidDataset, "no manifest.json"),
    ],
)
def test_bad_job_is_named_and_nothing_written(digits, aws, mutate, error, field):
    bad = job(digits)
    mutate(bad)
    with pytest.raises(error, match=field.replace(".", r"\.")):
        planner({"op": "plan", "job": bad, "execution": "bad"}, None)
    assert run_keys(aws, "bad") == []
    items = boto3.client("dynamodb").scan(TableName="smlt-runs")["Items"]
    assert not [i for i in items if i["pk"]["S"] == "RUN#bad"]


def test_model_that_does_not_fit_the_data(digits, aws, tmp_path):
    # A model whose input layer disagrees with the dataset's features fails with a named error.
    first = job(digits)
    planner({"op": "plan", "job": first, "execution": "shape"}, None)
    # A round-0 model of another shape is stored before any worker starts (as a warm start could).
    import numpy as np
    from safetensors.numpy import save

    aws.put_object(
        Bucket="smlt-artifacts",
        Key="runs/shape/rounds/000000/model.safetensors",
        Body=save({"0.weight": np.zeros((5, 7), np.float32)}),
    )
    with pytest.raises(InvalidDataset, match="does not match"):
        train_step({"run_id": "shape", "round": 0, "worker": 1}, None)


def test_bad_job_for_an_existing_run_changes_nothing(digits, aws):
    drive(job(digits, max_rounds=1, target_value=None), execution="kept")
    before = {k: aws.get_object(Bucket="smlt-artifacts", Key=k)["Body"].read() for k in run_keys(aws, "kept")}
    items_before = boto3.client("dynamodb").scan(TableName="smlt-runs")["Items"]
    bad = job(digits)
    bad.update(run_id="kept", constraints={"budget_usd": "lots"})
    with pytest.raises(InvalidJob, match="constraints.budget_usd"):
        planner({"op": "plan", "job": bad, "execution": "again"}, None)
    after = {k: aws.get_object(Bucket="smlt-artifacts", Key=k)["Body"].read() for k in run_keys(aws, "kept")}
    assert after == before
    assert boto3.client("dynamodb").scan(TableName="smlt-runs")["Items"] == items_before


def test_a_bad_event_fails_naming_the_field(aws):
    from smlt.runtime.steps.events import InvalidEvent

    with pytest.raises(InvalidEvent, match=r"slice\.of: Field required"):
        aggregate({"op": "slice", "run_id": "r", "round": 0, "slice": 1}, None)
    with pytest.raises(InvalidEvent, match="worker: Field required"):
        train_step({"run_id": "r", "round": 0}, None)
    with pytest.raises(InvalidEvent, match="op: Input tag 'plna'"):
        planner({"op": "plna", "job": {}}, None)
    assert boto3.client("dynamodb").scan(TableName="smlt-runs")["Items"] == []


def test_a_stop_request_ends_the_run_with_its_newest_model_evaluated(digits, aws):
    """The dashboard's stop button and a study's early stop: the next Plan stops the run, one
    evaluation-only round measures the newest model, and Finalize publishes it."""
    from smlt.runtime.records import RunTable

    spec = job(digits, max_rounds=50, target_value=None)
    for _ in range(2):
        plan = planner({"op": "plan", "job": spec, "execution": "halt"}, None)
        for w in plan["workers"]:
            train_step({"run_id": "halt", "round": plan["round"], "worker": w}, None)
        aggregate({"run_id": "halt", "round": plan["round"]}, None)
    stored = RunTable("smlt-runs", "halt").request_stop("not promising", by="study:s1")
    assert RunTable("smlt-runs", "halt").request_stop("again").reason == stored.reason == "not promising"
    final = drive(spec, execution="halt")
    assert final["rounds"] == 2
    metrics = json.loads(aws.get_object(Bucket="smlt-artifacts", Key="runs/halt/final/metrics.json")["Body"].read())
    assert metrics["final"]["stop_reason"] == "stopped by study:s1: not promising"
    assert metrics["final"]["val_rows"] == 359 and metrics["final"]["val_accuracy"] > 0.5
    # the PLAN items and metrics.json's rounds carry the planner's rule: the evaluation round's
    # plan keeps the stop's rule next to its own
    evaluation = RunTable("smlt-runs", "halt").plan(2)
    assert evaluation is not None and evaluation.local_steps == 0
    assert (evaluation.rule, evaluation.stop_rule, evaluation.bound) == ("final_evaluation", "stopped", "stopped")
    assert [r["plan"]["rule"] for r in metrics["rounds"]] == ["fixed", "fixed", "final_evaluation"]
