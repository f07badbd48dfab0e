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
