"""`smlt start` with an s3:// dataset: the client's pre-check (smlt.precheck) reads the dataset's
manifest and one small validation shard with the user's own credentials (moto's S3, its IAM
enforced where a test says so) and refuses a model that cannot train before any execution starts."""

import json
import textwrap

import boto3
import pytest
from moto import mock_aws
from moto.core.authorization import enable_iam_authentication

from smlt.datasets import upload_dataset
from smlt.precheck import check_s3_model
from smlt.runtime import clients
from smlt.runtime.data.prepare import prepare_dataset, read_local_manifest
from smlt.runtime.errors import AccessDenied, InvalidDataset, InvalidJob, ModelTooLarge
from smlt.runtime.job import parse_job

NETS = """
from torch import nn

def wide(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, output_dim + 2))

def ok(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, output_dim))

def big(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 12000), nn.Linear(12000, 12000), nn.Linear(12000, output_dim))

def broken(input_shape, output_dim):
    return nn.Linear(input_shape[0] + "x", output_dim)
"""
OUTPUTS = {
    "StateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:smlt",
    "ArtifactsBucketName": "art",
    "DataBucketName": "dat",
    "TableName": "runs",
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("s3digits") / "digits"
    prepare_dataset("sklearn:digits", str(folder), shards=3)
    return folder


@pytest.fixture
def code(tmp_path):
    pkg = tmp_path / "code" / "s3nets"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(textwrap.dedent(NETS))
    return pkg


@pytest.fixture
def aws(monkeypatch, digits):
    """moto's S3 and Step Functions, the prepared digits uploaded to the data bucket: its URI."""
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    clients.reset()
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="dat")
        boto3.client("s3").create_bucket(Bucket="art")
        yield upload_dataset(digits, "dat", client=boto3.client("s3"))
    clients.reset()


def job(model, **training):
    return parse_job({"dataset": {"uri": "unused"}, "model": {"name": model}, "training": training})


def counted_s3():
    """An S3 client that records the keys it GETs."""
    s3 = boto3.client("s3")
    got: list[str] = []
    s3.meta.events.register("provide-client-params.s3.GetObject", lambda params, **_: got.append(params["Key"]))
    return s3, got


def test_too_many_outputs_refused_reading_the_manifest_and_one_shard(aws, code, digits):
    s3, got = counted_s3()
    with pytest.raises(InvalidJob, match=r"gives 12 outputs per sample, but digits has 10 classes: too many"):
        check_s3_model(job("s3nets.nets:wide"), aws, code, client=s3)
    smallest = min(read_local_manifest(digits).validation.shards, key=lambda sh: sh.bytes)
    assert got == ["datasets/digits/manifest.json", f"datasets/digits/{smallest.key}"]


def test_a_good_model_passes_and_no_shard_is_read_when_none_is_small(aws, code, monkeypatch):
    import smlt.precheck

    check_s3_model(job("s3nets.nets:ok"), aws, code)
    monkeypatch.setattr(smlt.precheck, "SHARD_MAX_BYTES", 10)
    s3, got = counted_s3()
    check_s3_model(job("s3nets.nets:ok"), aws, code, client=s3)  # zeros of the manifest's shape
    assert got == ["datasets/digits/manifest.json"]
    with pytest.raises(InvalidJob, match="gives 12 outputs per sample"):
        check_s3_model(job("s3nets.nets:wide"), aws, code, client=s3)


def test_memory_and_the_dataset_are_checked_as_for_a_local_one(aws, code):
    with pytest.raises(ModelTooLarge, match=r"more than the deployed memory tiers \(1769, 3008 MB\)"):
        check_s3_model(job("s3nets.nets:big"), aws, code)
    with pytest.raises(InvalidJob, match="lenet"):
        check_s3_model(job("lenet"), aws)  # a built-in that does not take 64 features
    with pytest.raises(InvalidDataset, match=r"dataset.uri: no s3://dat/datasets/none/manifest.json"):
        check_s3_model(job("mlp"), "s3://dat/datasets/none/")
    with pytest.raises(InvalidDataset, match=r"no bucket 'nobucket'"):
        check_s3_model(job("mlp"), "s3://nobucket/x/")


def test_credentials_that_may_not_read_the_manifest_are_named_with_the_object(aws):
    iam = boto3.client("iam")
    iam.create_user(UserName="reader")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"}]}
    iam.put_user_policy(UserName="reader", PolicyName="list-only", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    s3 = boto3.client("s3", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    with enable_iam_authentication(), pytest.raises(AccessDenied) as e:
        check_s3_model(job("mlp"), aws, client=s3)
    assert str(e.value) == (
        "dataset.uri: your AWS credentials may not read s3://dat/datasets/digits/manifest.json (S3 answered 403 "
        "AccessDenied): allow s3:GetObject on it for your user or role, or use a profile that may (AWS_PROFILE)"
    )


@pytest.fixture
def stack(aws):
    template = {
        "Resources": {"Q": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {k: {"Value": v} for k, v in OUTPUTS.items()},
    }
    boto3.client("cloudformation").create_stack(StackName="Smlt", TemplateBody=json.dumps(template))
    sfn = boto3.client("stepfunctions")
    definition = {"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}
    role = "arn:aws:iam::123456789012:role/smlt"
    sfn.create_state_machine(name="smlt", definition=json.dumps(definition), roleArn=role)
    return sfn


@pytest.mark.parametrize(
    "model, shown",
    [
        ("s3nets.nets:wide", "error: InvalidJob: model.name: 's3nets.nets:wide' gives 12 outputs per sample"),
        ("s3nets.nets:broken", "error: UserCodeError: building model.name 's3nets.nets:broken': your code raised"),
    ],
)
def test_smlt_start_refuses_before_any_execution(aws, stack, code, tmp_path, capsys, model, shown):
    from smlt.cli import main

    path = tmp_path / "job.json"
    path.write_text(json.dumps({"name": "s3", "dataset": {"uri": aws}, "model": {"name": model}}))
    assert main(["start", str(path), "--code", str(code)]) == 2
    assert capsys.readouterr().err.startswith(shown)
    assert stack.list_executions(stateMachineArn=OUTPUTS["StateMachineArn"])["executions"] == []

    path.write_text(json.dumps({"name": "s3", "dataset": {"uri": aws}, "model": {"name": "s3nets.nets:ok"}}))
    assert main(["start", str(path), "--code", str(code)]) == 0  # the same job with a good model starts
    assert len(stack.list_executions(stateMachineArn=OUTPUTS["StateMachineArn"])["executions"]) == 1


def test_smlt_start_names_the_manifest_it_may_not_read(aws, stack, tmp_path, capsys, monkeypatch):
    iam = boto3.client("iam")
    iam.create_user(UserName="nobody")
    key = iam.create_access_key(UserName="nobody")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a new process: the credentials read afresh
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"name": "s3", "dataset": {"uri": aws}}))
    from smlt.cli import main

    with enable_iam_authentication():
        rc = main(["start", str(path)])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "your AWS credentials may not read s3://dat/datasets/digits/manifest.json" in err, err

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREVOKED000000000")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    with enable_iam_authentication():
        assert main(["start", str(path)]) != 0
    err = capsys.readouterr().err
    assert "S3 refused your AWS credentials reading s3://dat/datasets/digits/manifest.json (InvalidAccessKeyId)" in err
