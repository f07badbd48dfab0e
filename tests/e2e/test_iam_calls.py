"""The stack's IAM policies against the calls its handlers really make (smlt/local/iam_record.py).

Every e2e test on the session engine is checked (tests/e2e/conftest.py: `iam_checked`); these
tests show the check sees the calls of every role and fails when a grant is taken away.
"""

import json
from pathlib import Path

from smlt.datasets import stage_dataset
from smlt.local import iam_record
from smlt.runner import execute

ROOT = Path(__file__).resolve().parents[2]


def short_job(names, engine):
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job["training"]["max_rounds"] = 2
    job["workers"].update(initial=2, max=2)
    job["dataset"] = {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}
    return job


def _names(policies, prefix):
    return [fn for fn in policies.statements if prefix in fn]


def test_a_run_calls_only_what_its_roles_allow_and_a_removed_grant_is_denied(local, iam_log, role_policies, tmp_path):
    engine, names = local
    _, start = iam_record.read(iam_log, iam_log.stat().st_size if iam_log.exists() else 0)
    execute(engine, names, "iam-run", short_job(names, engine), tmp_path / "out")
    calls, _ = iam_record.read(iam_log, start)

    report = iam_record.check(calls, role_policies)
    assert report.denied == [], report.summary()
    # every function of a run made calls, and they were checked
    for part in ("Planner", "Aggregate", "TrainStep"):
        assert any(part in fn and n > 0 for fn, n in report.by_function.items()), (part, report.by_function)
    assert report.requests >= report.calls > 20

    # without the aggregator's PutObject on runs/*/*, its writes (the next round's model) are denied
    (aggregate,) = _names(role_policies, "Aggregate")
    cut = role_policies.without(aggregate, "s3:PutObject", "/runs/")
    denied = iam_record.check(calls, cut).denied
    assert denied and {d.function for d in denied} == {aggregate}
    assert all(d.request.action == "s3:PutObject" and "/runs/" in d.request.resource for d in denied)

    # without the planner's DynamoDB PutItem, its META and PLAN writes are denied
    (planner,) = _names(role_policies, "Planner")
    cut = role_policies.without(planner, "dynamodb:PutItem", "")
    assert any(d.operation == "dynamodb:PutItem" for d in iam_record.check(calls, cut).denied)


def test_a_raw_upload_prepares_with_only_what_the_prepare_role_allows(local, iam_log, role_policies, tmp_path):
    """The Prepare function reads the raw upload under incoming/ and writes only prepared/ and the
    pipeline's features; without its PutObject on prepared/ the shards it writes are denied."""
    from smlt.local.eventbridge import UploadTrigger
    from tests.e2e.test_pipeline import _houses

    engine, names = local
    s3 = engine.client("s3")
    _, start = iam_record.read(iam_log, iam_log.stat().st_size if iam_log.exists() else 0)
    job = {"name": "iamraw", "dataset": {"uri": "x"}, "training": {"max_rounds": 1, "local_steps": 2}}
    s3.put_object(Bucket=names.data_bucket, Key="incoming/iamraw/job.json", Body=json.dumps(job).encode())
    trigger = UploadTrigger(engine, names.data_bucket)
    trigger.prime()
    s3.put_object(
        Bucket=names.data_bucket, Key="incoming/iamraw/v1/h.csv", Body=Path(_houses(tmp_path / "h.csv", 1)).read_bytes()
    )
    s3.put_object(Bucket=names.data_bucket, Key="incoming/iamraw/v1/_SUCCESS", Body=b"")
    (arn,) = trigger.poll()
    assert engine.wait(arn, interval=0.1)["status"] == "SUCCEEDED"
    calls, _ = iam_record.read(iam_log, start)

    report = iam_record.check(calls, role_policies)
    assert report.denied == [], report.summary()
    (prepare,) = _names(role_policies, "Prepare")
    ops = {c["operation"] for c in calls if c["function"] == prepare}
    assert {"s3:HeadObject", "s3:GetObject", "s3:PutObject", "s3:ListObjectsV2", "dynamodb:PutItem"} <= ops, ops

    cut = role_policies.without(prepare, "s3:PutObject", "/prepared/")
    denied = iam_record.check(calls, cut).denied
    assert denied and {d.function for d in denied} == {prepare}
    assert all(d.request.action == "s3:PutObject" and "/prepared/iamraw/v1/" in d.request.resource for d in denied)
