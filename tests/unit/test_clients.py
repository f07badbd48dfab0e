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

    from smlt.cloud import aws_not_configured

    aws = aws_not_configured(EndpointConnectionError(endpoint_url="https://s3.eu-west-3.amazonaws.com/"))
    assert aws is not None and "cannot reach https://s3.eu-west-3.amazonaws.com: check this machine's network" in str(
        aws
    )
    local = aws_not_configured(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    assert local is not None and "is the local console up (`smlt local up`)?" in str(local)
