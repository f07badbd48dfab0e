"""A control step whose process died after some of its writes, then retried (Step Functions
retries `Runtime.ExitError` / `Lambda.Unknown` on Plan, Aggregate and Finalize): the retry must
finish what the first attempt began, not build on its half. On moto, with the real digits data."""

from types import SimpleNamespace

import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.cloud import Stack, fetch
from smlt.runtime import keys
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.shards import read_manifest
from smlt.runtime.errors import DataError, PartialData, QuorumNotReached, RunNotFinished
from smlt.runtime.items import PlanItem, RoundItem
from smlt.runtime.job import parse_job
from smlt.runtime.pipeline import Champion, VersionRecord, _version, champion, champions_stack, conclude
from smlt.runtime.records import RunTable
from smlt.runtime.store import S3Store
from smlt.runtime.tensors.torch_state import state_to_bytes
from smlt.runtime.train.models import build_model
from tests.functional.handlers.conftest import job


class Died(BaseException):
    """The handler process died here (a BaseException: nothing in the step catches it)."""


def die_at_put(monkeypatch, key_part: str) -> None:
    """The process dies as it starts the S3 PUT of a key containing `key_part` (once)."""
    real = S3Store.put

    def put(self, key, *a, **kw):
        if key_part in key:
            monkeypatch.setattr(S3Store, "put", real)
            raise Died(key)
        return real(self, key, *a, **kw)

    monkeypatch.setattr(S3Store, "put", put)


def plan(j, execution):
    return planner({"op": "plan", "job": j, "execution": execution}, None)


def test_plan_dying_after_meta_still_starts_from_the_warm_start(digits, aws, monkeypatch):
    warm = build_model(parse_job(job(digits)).model, (64,), 10, seed=123)  # not the run's own init
    blob = state_to_bytes(warm.state_dict())
    aws.put_object(Bucket="smlt-data", Key="warm/model.safetensors", Body=blob)
    j = {**job(digits), "warm_start": "s3://smlt-data/warm/model.safetensors"}
    die_at_put(monkeypatch, "rounds/000000/model.safetensors")
    with pytest.raises(Died):
        plan(j, "ws")
    p = plan(j, "ws")  # the retry
    for w in p["workers"]:
        train_step({"run_id": "ws", "round": 0, "worker": w}, None)
    m0 = aws.get_object(Bucket="smlt-artifacts", Key="runs/ws/rounds/000000/model.safetensors")["Body"].read()
    assert m0 == blob, "round 0 started from a fresh initialisation, not the warm start"


def _version_with_champion(artifacts: S3Store) -> None:
    """Pipeline fraud: champion v1; version v2's run fraud-v2-r warm-started from it."""
    latest = Champion(run_id="fraud-v1-r", model="s3://a/runs/fraud-v1-r/final/model.safetensors", version="v1")
    artifacts.put(keys.pipeline_latest_key("fraud"), latest.model_dump_json().encode())
    record = VersionRecord(
        pipeline="fraud",
        version="v2",
        data="s3://smlt-data/incoming/fraud/v2/",
        run_id="fraud-v2-r",
        features="f",
        generation=1,
        champion_run="fraud-v1-r",
        champion_version="v1",
    )
    artifacts.put(keys.pipeline_version_key("fraud", "v2"), record.model_dump_json().encode())


def _gate(artifacts: S3Store) -> VersionRecord | None:
    """Finalize's call of the gate: the challenger 0.96 against the champion's 0.9 on its rows."""
    model = "s3://smlt-artifacts/runs/fraud-v2-r/final/model.safetensors"
    return conclude(
        artifacts, "s3://smlt-data/incoming/fraud/v2/", "fraud-v2-r", model, "val_accuracy", 0.0, 0.96, 0.9, 0.01, "ab"
    )


def test_finalize_retried_after_the_gate_keeps_its_decision(aws):
    artifacts = S3Store("smlt-artifacts")
    _version_with_champion(artifacts)
    first = _gate(artifacts)
    assert first is not None and first.status == "promoted"
    assert champion(artifacts, "fraud").run_id == "fraud-v2-r"  # type: ignore[union-attr]
    # Finalize died after the gate (before it answered) and runs again: the same decision.
    again = _gate(artifacts)
    stored = _version(artifacts, "fraud", "v2")
    assert stored.status == "promoted" and stored.promoted, stored.reason
    assert again is not None and again.status == "promoted"
    assert champion(artifacts, "fraud").run_id == "fraud-v2-r"  # type: ignore[union-attr]
    assert [entry[0] for entry in champions_stack(artifacts, "fraud")] == ["v2"]  # one promotion, not two


def test_finalize_dying_between_the_gates_writes_finishes_the_promotion(aws, monkeypatch):
    artifacts = S3Store("smlt-artifacts")
    _version_with_champion(artifacts)
    die_at_put(monkeypatch, keys.pipeline_latest_key("fraud"))  # the record says promoted; latest.json not yet
    with pytest.raises(Died):
        _gate(artifacts)
    assert champion(artifacts, "fraud").run_id == "fraud-v1-r"  # type: ignore[union-attr]
    again = _gate(artifacts)
    assert again is not None and again.status == "promoted"
    assert champion(artifacts, "fraud").run_id == "fraud-v2-r"  # type: ignore[union-attr]
    # one promotion entry, the retry's written over the first attempt's (it used to add a second)
    assert len(artifacts.list(keys.pipeline_promotions_prefix("fraud"))) == 1


def test_aggregate_dying_after_a_divergence_halved_the_rate_is_not_a_second_divergence(digits, aws, monkeypatch):
    j = job(digits, learning_rate=1e6, target_value=None)  # explodes at once
    p = plan(j, "nan")
    for w in p["workers"]:
        train_step({"run_id": "nan", "round": 0, "worker": w}, None)
    die_at_put(monkeypatch, "rounds/000001/model.safetensors")  # META's rate halved; model 1 and ROUND not yet
    with pytest.raises(Died):
        aggregate({"run_id": "nan", "round": 0}, None)
    a = aggregate({"run_id": "nan", "round": 0}, None)  # the retry: the same round's divergence, once
    assert "diverged" in a["reason"] and a["stop"] is False
    assert RunTable("smlt-runs", "nan").meta().lr_scale == 0.5  # type: ignore[union-attr]
    m0, m1 = (
        aws.get_object(Bucket="smlt-artifacts", Key=f"runs/nan/rounds/{r:06d}/model.safetensors")["Body"].read()
        for r in (0, 1)
    )
    assert m0 == m1


class _NoExecutions:
    """The Step Functions client `smlt fetch` lists the run's executions with (none here)."""

    def get_paginator(self, _name):
        return SimpleNamespace(paginate=lambda **_: [{"executions": []}])


def test_fetch_refuses_a_run_whose_finalize_failed(digits, aws, tmp_path):
    p = plan(job(digits, max_rounds=1), "part")
    for w in p["workers"]:
        train_step({"run_id": "part", "round": 0, "worker": w}, None)
    aggregate({"run_id": "part", "round": 0}, None)
    table = RunTable("smlt-runs", "part")  # as if worker 3's update had been refused: shards 3, 7 never trained
    accepted = [a for a in table.get(keys.round_sk(0), RoundItem).accepted if a.worker != 3]  # type: ignore[union-attr]
    table.update(keys.round_sk(0), RoundItem, accepted=accepted)
    p = plan(job(digits, max_rounds=1), "part")  # the final evaluation of model 1
    for w in p["workers"]:
        train_step({"run_id": "part", "round": 1, "worker": w}, None)
    assert aggregate({"run_id": "part", "round": 1}, None)["stop"]
    with pytest.raises(PartialData):  # metrics.json and the model are written; META stays RUNNING
        planner({"op": "finalize", "run_id": "part"}, None)
    stack = Stack("arn:aws:states:us-east-1:123456789012:stateMachine:t", "smlt-artifacts", "smlt-data", "smlt-runs")
    with pytest.raises(RunNotFinished, match="run part did not succeed"):
        fetch("part", stack, tmp_path / "out", sfn=_NoExecutions())
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_dataset_prepared_again_under_a_running_run_ends_it_with_a_data_error(digits, aws):
    p = plan(job(digits), "moved")
    assert RunTable("smlt-runs", "moved").meta().manifest_sha256 is not None  # type: ignore[union-attr]
    for w in p["workers"]:
        train_step({"run_id": "moved", "round": 0, "worker": w}, None)
    aggregate({"run_id": "moved", "round": 0}, None)
    p = plan(job(digits), "moved")
    # The same folder prepared again (another split: 4 shards, another seed), read by a cold worker.
    prepare_dataset("sklearn:digits", digits, shards=4, seed=1, replace=True)
    read_manifest.cache_clear()
    with pytest.raises(DataError, match="manifest.json changed during the run"):
        train_step({"run_id": "moved", "round": 1, "worker": 0}, None)
    with pytest.raises(DataError, match="changed during the run"):  # whatever the quorum
        aggregate({"run_id": "moved", "round": 1}, None)


def test_aggregate_dying_after_counting_a_failed_quorum_attempt_counts_it_once(digits, aws, monkeypatch):
    j = job(digits, target_value=None)
    plan(j, "q")  # round 0's plan; no worker reports: every quorum attempt fails
    real = RunTable.update

    def update(self, sk, *a, **kw):  # the process dies right after its count is stored
        done = real(self, sk, *a, **kw)
        if sk == keys.plan_sk(0) and "attempts" in kw:
            monkeypatch.setattr(RunTable, "update", real)
            raise Died(sk)
        return done

    monkeypatch.setattr(RunTable, "update", update)
    with pytest.raises(Died):
        aggregate({"run_id": "q", "round": 0}, None)
    answers = [aggregate({"run_id": "q", "round": 0}, None)]  # its retry: attempt 1 again, not 2
    assert answers[0]["retry"] and "attempt 1" in answers[0]["reason"], answers[0]
    plan(j, "q")  # the Map runs attempt 2
    answers.append(aggregate({"run_id": "q", "round": 0}, None))
    assert answers[1]["retry"] and "attempt 2" in answers[1]["reason"], answers[1]
    plan(j, "q")  # attempt 3, the last
    with pytest.raises(QuorumNotReached, match="3 times"):
        aggregate({"run_id": "q", "round": 0}, None)
    assert RunTable("smlt-runs", "q").get(keys.plan_sk(0), PlanItem).attempts == 3  # type: ignore[union-attr]
