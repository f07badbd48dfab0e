"""One factory for AWS clients (smlt.runtime.clients): each service's retry policy, one client per
process for handlers, and hooks (the ledger's request meter) on every client it makes."""

import pytest

from smlt.runtime import clients


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for k, v in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(clients, "_HOOKS", [])
    clients.reset()
    yield
    clients.reset()


def test_each_service_has_its_retry_policy_and_handlers_share_one_client():
    s3 = clients.client("s3")
    assert clients.client("s3") is s3
    assert s3.meta.config.retries["mode"] == "adaptive" and s3.meta.config.max_pool_connections == 32
    assert clients.make("stepfunctions").meta.config.retries["mode"] == "standard"
    assert clients.make("s3") is not s3  # the CLI's, per command


def test_aws_max_attempts_counts_over_the_defaults_and_keeps_each_services_mode(monkeypatch):
    monkeypatch.delenv(clients.MAX_ATTEMPTS_ENV, raising=False)
    assert clients.make("dynamodb").meta.config.retries == {"total_max_attempts": 9, "mode": "adaptive"}  # 8 retries
    monkeypatch.setenv(clients.MAX_ATTEMPTS_ENV, "2")
    assert clients.make("dynamodb").meta.config.retries == {"total_max_attempts": 2, "mode": "adaptive"}
    assert clients.make("sns").meta.config.retries == {"total_max_attempts": 2, "mode": "standard"}
    assert clients.make("s3").meta.config.max_pool_connections == 32  # the rest of the policy kept


class Seen(Exception):
    pass


def test_a_hook_reaches_the_clients_made_before_and_after_it():
    before = clients.client("s3")
    seen = []

    def hook(event_name, **_):
        seen.append(event_name)
        raise Seen  # stop before any request leaves

    clients.on_every_client("before-parameter-build", hook, "test-hook")
    clients.on_every_client("before-parameter-build", hook, "test-hook")  # once, however often asked
    calls = (before.list_buckets, clients.client("dynamodb").list_tables, clients.make("lambda").list_functions)
    for call in calls:
        with pytest.raises(Seen):
            call()
    assert seen == [
        "before-parameter-build.s3.ListBuckets",
        "before-parameter-build.dynamodb.ListTables",
        "before-parameter-build.lambda.ListFunctions",
    ]


def test_aws_region_names_the_region_as_the_aws_cli_reads_it(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")  # botocore alone reads only AWS_DEFAULT_REGION
    assert clients.make("s3").meta.region_name == "eu-west-3"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-2")  # both: AWS_REGION first (AWS CLI v2, Lambda)
    assert clients.make("s3").meta.region_name == "eu-west-3"
    assert clients.make("s3", region_name="ap-south-1").meta.region_name == "ap-south-1"


def test_doctor_without_a_region_says_what_to_set(monkeypatch, tmp_path, capsys):
    from smlt.cli import main

    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert main(["doctor"]) == 1  # as every AwsNotConfigured
    assert "no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION)" in capsys.readouterr().err


def test_an_unreachable_endpoint_says_network_for_aws_and_console_for_a_local_one():
    from botocore.exceptions import EndpointConnectionError

    from smlt.aws_errors import aws_not_configured

    aws = aws_not_configured(EndpointConnectionError(endpoint_url="https://s3.eu-west-3.amazonaws.com/"))
    assert aws is not None and "cannot reach https://s3.eu-west-3.amazonaws.com: check this machine's network" in str(
        aws
    )
    local = aws_not_configured(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    assert local is not None and "is the local console up (`smlt local up`)?" in str(local)


def _stubbed_s3(*errors):
    """An S3 client whose get_object calls answer these errors, (code, status[, message]) in order
    (botocore's Stubber)."""
    import boto3
    from botocore.stub import Stubber

    s3 = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(s3)
    for code, status, *message in errors:
        stub.add_client_error(
            "get_object", service_error_code=code, http_status_code=status, service_message="".join(message)
        )
    stub.activate()
    return s3


def test_a_model_in_s3_that_the_users_credentials_may_not_read_is_named_for_the_user():
    from smlt.inference import _read_s3
    from smlt.runtime.errors import AccessDenied
    from smlt.runtime.modelcard import InvalidModel
    from smlt.runtime.store import S3Store

    store = S3Store("bkt", client=_stubbed_s3(("AccessDenied", 403)))
    with pytest.raises(AccessDenied) as e:
        _read_s3("s3://bkt/runs/r/model.safetensors", store)
    assert str(e.value) == (
        "model: your AWS credentials may not read s3://bkt/runs/r/model.safetensors (S3 answered 403 AccessDenied): "
        "allow s3:GetObject on it for your user or role, or use a profile that may (AWS_PROFILE)"
    )  # not the Lambda function's wording ("this function's role")
    store = S3Store("bkt", client=_stubbed_s3(("ExpiredToken", 400)))
    with pytest.raises(AccessDenied, match=r"S3 refused your AWS credentials reading s3://bkt/m/model.safetensors"):
        _read_s3("s3://bkt/m/", store)
    with pytest.raises(InvalidModel, match=r"model: no bucket 'bkt'"):
        _read_s3("s3://bkt/m/", S3Store("bkt", client=_stubbed_s3(("NoSuchBucket", 404))))


def test_a_botocore_error_that_reaches_the_command_line_is_one_line_not_a_traceback(monkeypatch, capsys):
    from botocore.exceptions import ClientError, NoCredentialsError

    import smlt.cli.model
    from smlt.cli import main

    def fails(error):
        def predict(args):
            raise error

        return predict

    monkeypatch.setattr(smlt.cli.model, "predict", fails(NoCredentialsError()))
    assert main(["predict", "m", "d.csv", "--out", "p.csv"]) == 1
    assert capsys.readouterr().err == (
        "error: no AWS credentials: run `aws configure` (or `aws sso login`), or set AWS_PROFILE or "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY\n"
    )
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "not yours"}}, "DescribeStacks")
    monkeypatch.setattr(smlt.cli.model, "predict", fails(denied))
    assert main(["predict", "m", "d.csv", "--out", "p.csv"]) == 1
    assert capsys.readouterr().err == (
        "error: AWS refused DescribeStacks (AccessDenied): the credentials in use (`aws sts get-caller-identity` "
        "names them) may not cloudformation:DescribeStacks (AWS: not yours): allow it in that user's or role's IAM "
        'policy, or use a profile that may (AWS_PROFILE) (docs/deploy.md, "What the CLI\'s user needs")\n'
    )
    monkeypatch.setattr(smlt.cli.model, "predict", fails(ValueError("ours")))
    with pytest.raises(ValueError):  # any other error stays a traceback (a bug of smlt's to report)
        main(["predict", "m", "d.csv", "--out", "p.csv"])


def test_a_403_names_the_functions_role_in_a_function_and_the_users_credentials_elsewhere(monkeypatch):
    from smlt.runtime.errors import AccessDenied
    from smlt.runtime.store import S3Store

    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    with pytest.raises(AccessDenied, match=r"s3://b/k: your AWS credentials may not read it \(S3 answered 403"):
        S3Store("b", client=_stubbed_s3(("AccessDenied", 403))).get("k")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "Smlt-TrainStep1769")
    with pytest.raises(
        AccessDenied,
        match=r"s3://b/k: the role of function Smlt-TrainStep1769 may not read it .* infra/stacks/functions",
    ):
        S3Store("b", client=_stubbed_s3(("AccessDenied", 403))).get("k")


def _denied_by_aws(action: str, resource: str) -> str:
    """AWS's 403 message to a Lambda function's role in the same account."""
    return (
        "User: arn:aws:sts::123456789012:assumed-role/Smlt-TrainRole/Smlt-TrainStep1769 is not authorized to "
        f'perform: {action} on resource: "{resource}" because no identity-based policy allows the {action} action'
    )


def test_a_403_in_a_function_names_the_role_and_the_context_key_that_grants_the_bucket_or_the_key(monkeypatch):
    from smlt.runtime.errors import AccessDenied
    from smlt.runtime.store import S3Store

    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "Smlt-TrainStep1769")
    monkeypatch.setenv("SMLT_DATA_BUCKET", "smlt-data")
    monkeypatch.setenv("SMLT_ARTIFACTS_BUCKET", "smlt-artifacts")
    foreign = _denied_by_aws("s3:GetObject", "arn:aws:s3:::team-data/ds/manifest.json")
    with pytest.raises(AccessDenied) as denied:
        S3Store("team-data", "ds/", client=_stubbed_s3(("AccessDenied", 403, foreign))).get("manifest.json")
    assert str(denied.value).startswith(
        "s3://team-data/ds/manifest.json: role Smlt-TrainRole (function Smlt-TrainStep1769) may not read it "
        "(s3:GetObject; S3 answered 403 AccessDenied): s3://team-data is not one of the stack's buckets"
    )
    assert '"data_buckets": ["team-data"]' in str(denied.value)
    key = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    with pytest.raises(AccessDenied) as denied:
        S3Store("smlt-data", client=_stubbed_s3(("AccessDenied", 403, _denied_by_aws("kms:Decrypt", key)))).get_range(
            "prepared/s.bin", 0, 8
        )
    assert f"encrypted with KMS key {key}" in str(denied.value)
    assert f'"data_kms_keys": ["{key}"]' in str(denied.value)
