"""Failure handling in the handlers: quorum retry, divergence, lost shards, fatal worker errors,
access, corrupt data, triggers and chaining. On moto, with the real digits data."""

import json

import boto3
import numpy as np
import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.data.shards import load_manifest
from smlt.runtime.errors import AccessDenied, Diverged, InvalidDataset, ModelTooLarge, QuorumNotReached
from tests.functional.handlers.conftest import job, run_keys


def plan(j, execution):
    return planner({"op": "plan", "job": j, "execution": execution}, None)


def spec_of(run_id, rnd):
    """The round spec the planner stored (the PLAN item), as the workers read it."""
    from smlt.runtime.records import RunTable

    plan = RunTable("smlt-runs", run_id).plan(rnd)
    assert plan is not None and plan.spec is not None
    return plan.spec


def set_spec(spec):
    from smlt.runtime import keys
    from smlt.runtime.items import PlanItem
    from smlt.runtime.records import RunTable

    RunTable("smlt-runs", spec.run_id).update(keys.plan_sk(spec.round), PlanItem, spec=spec)


def test_quorum_retry_then_round_counts_late_arrivals(digits, aws):
    p = plan(job(digits), "q")
    train_step({"run_id": "q", "round": 0, "worker": 0}, None)  # 1 of 4: below the quorum of 2
    first = aggregate({"run_id": "q", "round": 0}, None)
    assert first["retry"] is True and first["stop"] is False
    # Plan returns the same round again; the finished worker answers from its record.
    assert plan(job(digits), "q") == p
    for w in p["workers"]:
        train_step({"run_id": "q", "round": 0, "worker": w}, None)
    second = aggregate({"run_id": "q", "round": 0}, None)
    assert "retry" not in second and second["round"] == 0


def test_quorum_failing_three_times_fails_with_a_named_error(digits, aws):
    plan(job(digits), "q3")
    aggregate({"run_id": "q3", "round": 0}, None)
    plan(job(digits), "q3")  # the state machine's Continue: Plan hands the round out again
    aggregate({"run_id": "q3", "round": 0}, None)
    plan(job(digits), "q3")
    with pytest.raises(QuorumNotReached, match="fewer than 2 of 4"):
        aggregate({"run_id": "q3", "round": 0}, None)


def test_lost_workers_shards_go_to_the_next_round(digits, aws):
    p = plan(job(digits), "lost")
    for w in p["workers"][:3]:  # worker 3 is lost
        train_step({"run_id": "lost", "round": 0, "worker": w}, None)
    aggregate({"run_id": "lost", "round": 0}, None)
    plan(job(digits), "lost")
    owned = sorted(s for a in spec_of("lost", 1).assignments for s in a)
    # 8 shards round-robin over 4 workers, plus worker 3's two shards (3 and 7) handed out again.
    assert owned == sorted(list(range(8)) + [3, 7])


def test_divergence_falls_back_halves_lr_then_fails(digits, aws):
    j = job(digits, learning_rate=1e6, target_value=None)  # explodes at once
    p = plan(j, "nan")
    for w in p["workers"]:
        train_step({"run_id": "nan", "round": 0, "worker": w}, None)
    a = aggregate({"run_id": "nan", "round": 0}, None)
    assert "diverged" in a["reason"] and a["stop"] is False
    m0 = aws.get_object(Bucket="smlt-artifacts", Key="runs/nan/rounds/000000/model.safetensors")["Body"].read()
    m1 = aws.get_object(Bucket="smlt-artifacts", Key="runs/nan/rounds/000001/model.safetensors")["Body"].read()
    assert m0 == m1  # back to the last good model
    plan(j, "nan")
    assert spec_of("nan", 1).learning_rate == pytest.approx(5e5)
    for w in p["workers"]:
        train_step({"run_id": "nan", "round": 1, "worker": w}, None)
    with pytest.raises(Diverged, match="again after halving"):
        aggregate({"run_id": "nan", "round": 1}, None)


def test_model_too_large_for_the_tier_is_named(digits, aws):
    j = job(digits)
    j["model"] = {"name": "mlp", "params": {"hidden": [8000, 8000]}}  # 64M parameters
    plan(j, "big")
    with pytest.raises(ModelTooLarge, match="1769 MB memory tier"):
        train_step({"run_id": "big", "round": 0, "worker": 0}, None)
    assert run_keys(aws, "big") == ["runs/big/job.json"]  # no 250 MB upload
    # The other workers fail alike; the aggregator reports the workers' own error, not a quorum.
    with pytest.raises(ModelTooLarge, match="worker 0: .*1769 MB"):
        aggregate({"run_id": "big", "round": 0}, None)


def test_dataset_outside_the_stack_is_access_denied(digits, aws):
    aws.create_bucket(Bucket="someone-elses")
    with pytest.raises(AccessDenied, match="may read only s3://smlt-data/"):
        plan(job("s3://someone-elses/data/"), "acl")
    assert run_keys(aws, "acl") == []


def test_a_dataset_in_a_bucket_or_folder_the_stack_was_given_passes_and_one_outside_names_data_buckets(
    digits, aws, monkeypatch
):
    """SMLT_DATA_BUCKETS: cdk context `data_buckets`, the user's buckets the roles may read."""
    monkeypatch.setenv("SMLT_DATA_BUCKETS", json.dumps(["team-data", "shared/team-a/"]))
    with pytest.raises(AccessDenied) as denied:
        plan(job("s3://shared/team-b/ds/"), "outside")
    said = str(denied.value)
    assert "not s3://shared/team-b/ds/" in said and "s3://team-data, s3://shared/team-a/" in said
    assert '"data_buckets": ["shared"]' in said and "deploy again" in said
    with pytest.raises(AccessDenied, match="warm_start: .* own buckets only"):
        plan(job("s3://team-data/ds/") | {"warm_start": "s3://team-data/m/model.safetensors"}, "warm")
    # a granted bucket and folder pass the check (the manifest is then read: none there yet)
    for uri in ("s3://team-data/ds/", "s3://shared/team-a/ds/"):
        with pytest.raises(Exception) as other:
            plan(job(uri), "inside")
        assert "may read only" not in str(other.value) and "manifest.json" in str(other.value), (uri, other.value)


def test_a_dataset_bucket_in_another_region_is_refused_when_the_workers_are_in_the_vpc(digits, aws, monkeypatch):
    """SMLT_WORKERS_IN_VPC (redis_reducer): the workers' S3 gateway endpoint serves this region's
    buckets only, so the planner refuses another region's bucket by name before any worker waits
    on it; without the VPC (S3's redirect is followed) and for a bucket here, the check passes."""
    from smlt.runtime.errors import DataError

    aws.create_bucket(Bucket="eu-data", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    aws.create_bucket(Bucket="us-data")
    monkeypatch.setenv("SMLT_DATA_BUCKETS", json.dumps(["eu-data", "us-data"]))
    monkeypatch.setenv("SMLT_WORKERS_IN_VPC", "true")
    with pytest.raises(DataError) as e:
        plan(job("s3://eu-data/ds/"), "eu")
    assert str(e.value).startswith("dataset.uri: s3://eu-data is in eu-west-1, not us-east-1: this stack's workers")
    assert run_keys(aws, "eu") == []
    for uri, vpc in (("s3://us-data/ds/", "true"), ("s3://eu-data/ds/", "false")):
        monkeypatch.setenv("SMLT_WORKERS_IN_VPC", vpc)
        with pytest.raises(Exception) as other:  # past the check: no manifest there
            plan(job(uri), "past")
        assert "manifest.json" in str(other.value), (uri, other.value)


def test_corrupt_shard_is_named_and_kept_out(digits, aws, tmp_path, monkeypatch):
    monkeypatch.setenv("SMLT_CACHE_DIR", str(tmp_path / "fresh-cache"))
    aws.put_object(Bucket="smlt-data", Key="datasets/digits/train-00000.safetensors", Body=b"garbage")
    plan(job(digits), "corrupt")
    with pytest.raises(InvalidDataset, match="train-00000.safetensors is corrupt"):
        train_step({"run_id": "corrupt", "round": 0, "worker": 0}, None)


def test_features_that_do_not_match_the_manifest(digits, aws, tmp_path, monkeypatch):
    import hashlib

    from safetensors.numpy import save

    monkeypatch.setenv("SMLT_CACHE_DIR", str(tmp_path / "fresh-cache2"))
    from smlt.runtime.data.shards import read_manifest

    read_manifest.cache_clear()
    man = json.loads(aws.get_object(Bucket="smlt-data", Key="datasets/digits/manifest.json")["Body"].read())
    blob = save({"x": np.zeros((10, 7), np.float32), "y": np.zeros(10, np.int64)})
    for s in man["train"]["shards"]:
        aws.put_object(Bucket="smlt-data", Key="datasets/digits/" + s["key"], Body=blob)
        s.update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    aws.put_object(Bucket="smlt-data", Key="datasets/digits/manifest.json", Body=json.dumps(man))
    plan(job(digits), "feat")
    with pytest.raises(InvalidDataset, match="7 features, the manifest says 64"):
        train_step({"run_id": "feat", "round": 0, "worker": 0}, None)


def _upload_version(s3, version, like=None):
    """Digits prepared as a version; `like`: an earlier version's manifest, whose features this one
    keeps, on another split (other rows: a version of the same rows is refused)."""
    from smlt.runtime.data.manifest import feature_spec
    from smlt.runtime.data.prepare import prepare_dataset

    uri = f"s3://smlt-data/incoming/digits/{version}/"
    if like is None:
        prepare_dataset("sklearn:digits", uri, shards=4)
    else:
        prepare_dataset("sklearn:digits", uri, shards=4, seed=1, features=feature_spec(like))
    return {"trigger": {"bucket": "smlt-data", "key": f"incoming/digits/{version}/manifest.json", "etag": version}}


def test_trigger_dedups_events_and_warm_starts_from_the_pipeline(digits, aws):
    aws.put_object(
        Bucket="smlt-data",
        Key="incoming/digits/job.json",
        Body=json.dumps(job("s3://ignored/", max_rounds=2, target_value=None)),
    )
    event = _upload_version(aws, "v1")
    v1 = load_manifest("s3://smlt-data/incoming/digits/v1/")
    first = plan(event, "exec-a")
    assert first["action"] == "train"
    dup = plan(event, "exec-b")  # the same event, delivered again
    assert dup["action"] == "duplicate"
    from tests.functional.handlers.test_handlers import drive

    final = drive(event, execution="exec-a")
    latest = json.loads(aws.get_object(Bucket="smlt-artifacts", Key="pipelines/digits/latest.json")["Body"].read())
    assert latest["run_id"] == final["run_id"]
    second = plan(_upload_version(aws, "v2", like=v1), "exec-c")
    meta_job = json.loads(
        aws.get_object(Bucket="smlt-artifacts", Key=f"runs/{second['run_id']}/job.json")["Body"].read()
    )
    assert meta_job["warm_start"] == latest["model"]
    m_prev = aws.get_object(Bucket="smlt-artifacts", Key=f"runs/{final['run_id']}/final/model.safetensors")[
        "Body"
    ].read()
    m_new = aws.get_object(Bucket="smlt-artifacts", Key=f"runs/{second['run_id']}/rounds/000000/model.safetensors")[
        "Body"
    ].read()
    assert m_prev == m_new


def test_chain_hands_over_after_rounds_per_execution(digits, aws):
    sfn = boto3.client("stepfunctions")
    arn = sfn.create_state_machine(
        name="sm",
        definition=json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/r",
    )["stateMachineArn"]
    j = {**job(digits, target_value=None), "rounds_per_execution": 1}
    p = plan(j, "e1")
    for w in p["workers"]:
        train_step({"run_id": "e1", "round": 0, "worker": w}, None)
    aggregate({"run_id": "e1", "round": 0}, None)
    nxt = plan(j, "e1")
    assert nxt["action"] == "chain" and nxt["round"] == 1
    out = planner({"op": "chain", "job": j, "run_id": "e1", "round": 1, "state_machine": arn}, None)
    again = planner({"op": "chain", "job": j, "run_id": "e1", "round": 1, "state_machine": arn}, None)
    assert out["execution_arn"] == again["execution_arn"]
    started = json.loads(sfn.describe_execution(executionArn=out["execution_arn"])["input"])
    assert started["run_id"] == "e1"
    # The new execution continues the same run at round 1.
    assert plan(started, "e1-r000001")["round"] == 1


def test_updates_are_tagged_for_the_lifecycle_rule(digits, aws):
    p = plan(job(digits), "tags")
    train_step({"run_id": "tags", "round": 0, "worker": 0}, None)
    tags = aws.get_object_tagging(Bucket="smlt-artifacts", Key="runs/tags/rounds/000000/updates/00000.safetensors")
    assert {"Key": "smlt-kind", "Value": "update"} in tags["TagSet"]
    assert p["round"] == 0


def test_a_triggered_run_chains_with_its_job_not_the_event(digits, aws):
    sfn = boto3.client("stepfunctions")
    arn = sfn.create_state_machine(
        name="sm2",
        definition=json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/r",
    )["stateMachineArn"]
    aws.put_object(
        Bucket="smlt-data",
        Key="incoming/digits/job.json",
        Body=json.dumps({**job("s3://ignored/", target_value=None), "rounds_per_execution": 1}),
    )
    event = _upload_version(aws, "v9")
    p = plan(event, "trig-1")
    for w in p["workers"]:
        train_step({"run_id": p["run_id"], "round": 0, "worker": w}, None)
    aggregate({"run_id": p["run_id"], "round": 0}, None)
    assert plan(event, "trig-1")["action"] == "chain"
    out = planner({"op": "chain", "job": event, "run_id": p["run_id"], "round": 1, "state_machine": arn}, None)
    started = json.loads(sfn.describe_execution(executionArn=out["execution_arn"])["input"])
    assert "trigger" not in started and started["run_id"] == p["run_id"]
    nxt = plan(started, out["name"])
    assert nxt["action"] == "train" and nxt["round"] == 1


def test_worker_keeps_to_its_time_limit_and_reports_what_it_stored(digits, aws):
    """A worker stops its steps at the planner's limit (Step Functions abandoning it would not
    stop the bill); a second invocation that finds the update stored reports that update."""
    p = plan(job(digits, local_steps=200000), "slow")  # far more steps than the limit allows
    spec = spec_of("slow", 0)
    spec.compute_limit_s = 1.0
    set_spec(spec)
    out = train_step({"run_id": "slow", "round": 0, "worker": 0}, None)
    assert 0 < out["samples"] < 200000 * 32
    import boto3

    ddb, item_key = boto3.client("dynamodb"), {"pk": {"S": "RUN#slow"}, "sk": {"S": "WORKER#000000#00000"}}
    assert int(ddb.get_item(TableName="smlt-runs", Key=item_key)["Item"]["samples"]["N"]) == out["samples"]
    # The first invocation "crashed" after storing its update but before its record; the retry
    # runs longer (a different number of steps) yet records what the stored update carries.
    ddb.delete_item(TableName="smlt-runs", Key=item_key)
    spec.compute_limit_s = 3.0
    set_spec(spec)
    train_step({"run_id": "slow", "round": 0, "worker": 0}, None)
    assert int(ddb.get_item(TableName="smlt-runs", Key=item_key)["Item"]["samples"]["N"]) == out["samples"]
    assert p["round"] == 0


def test_round_0_has_the_planner_s_compute_limit_and_a_task_timeout_that_allows_the_cold_start(digits, aws):
    """A hung round-0 worker must not hold the round for the function's timeout: its Map task
    waits the planner's limit (per wave of local handlers) plus twice Lambda's 10 s init cap (an
    init past the cap is retried in the first invocation)."""
    from smlt.runtime.config import Settings
    from smlt.runtime.roundspec import COLD_START_ALLOWANCE_S

    p = plan(job(digits), "r0")
    spec = spec_of("r0", 0)
    assert spec.compute_limit_s is not None and spec.compute_limit_s > 0
    slots = Settings.from_env().local_concurrency or spec.workers
    waves = -(-spec.workers // slots)
    assert spec.time_limit_s == max(spec.compute_limit_s * waves + COLD_START_ALLOWANCE_S, 10.0)
    assert p["worker_timeout_s"] == int(-(-spec.time_limit_s // 1)) < Settings.from_env().worker_timeout_s
