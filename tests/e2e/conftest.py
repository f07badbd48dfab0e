"""End-to-end: the synthesized state machine on the local engine, one engine per session.

Every AWS call the engine's handlers make is recorded and checked against the synthesized
policies of the calling function's role (smlt/local/iam_record.py): a test whose handlers made
a call their role may not make fails, naming the call."""

import os

import pytest

NOTIFY_TOPIC = "arn:aws:sns:us-east-1:123456789012:smlt-e2e-decisions"  # the local engine's account and region
# A bucket of the user's own and a customer-managed KMS key the stack is given read access to
# (cdk.json `data_buckets`, `data_kms_keys`: tests/e2e/test_foreign_bucket.py).
DATA_BUCKET_OF_USER = "team-datasets-e2e"
USER_KMS_KEY = "arn:aws:kms:us-east-1:123456789012:key/0e2e0000-0000-4000-8000-00000000da7a"


@pytest.fixture(scope="session")
def iam_log(tmp_path_factory):
    return tmp_path_factory.mktemp("iam") / "calls.jsonl"


@pytest.fixture(scope="session")
def iam_enforce_file(tmp_path_factory):
    """Where `iam_enforced` writes the policies the handlers then enforce (none: not enforced)."""
    return tmp_path_factory.mktemp("iam") / "enforce.json"


@pytest.fixture(scope="session")
def local(tmp_path_factory, iam_log, iam_enforce_file):
    os.environ.setdefault("SMLT_HOME", str(tmp_path_factory.mktemp("smlt-home")))
    from smlt.local import iam_record
    from smlt.runner import start_engine

    # before the engine: its handlers inherit it
    os.environ.update(iam_record.enable(iam_log, enforce=iam_enforce_file))
    # The team's SNS topic for the gate's decisions (tests/e2e/test_notify.py): the stack is
    # synthesized with it, as cdk.json `notify_topic_arn`, and the topic made on moto, as a team
    # makes its own before deploying.
    engine, names, injector = start_engine(
        None,
        context={
            "notify_topic_arn": NOTIFY_TOPIC,
            "data_buckets": [DATA_BUCKET_OF_USER],
            "data_kms_keys": [USER_KMS_KEY],
        },
    )
    engine.client("sns").create_topic(Name=NOTIFY_TOPIC.rsplit(":", 1)[1])
    yield engine, names
    engine.stop()


@pytest.fixture(scope="session")
def role_policies(local):
    from smlt.local.iam_record import RolePolicies

    engine, _ = local
    return RolePolicies(engine.synthesized.template, engine.resolver)


@pytest.fixture
def iam_enforced(role_policies, iam_enforce_file):
    """The handlers refuse, as AWS does, each call their role's policies deny (for this test)."""
    role_policies.write(iam_enforce_file)
    yield role_policies
    iam_enforce_file.unlink()


@pytest.fixture(autouse=True)
def iam_checked(request, iam_log):
    """Fails a test on the local engine whose handlers made a call their role may not make (a test
    of what a denied call does, `iam_enforced`, checks its denials itself)."""
    if "local" not in request.fixturenames or "iam_enforced" in request.fixturenames:
        yield
        return
    from smlt.local import iam_record

    policies = request.getfixturevalue("role_policies")
    _, start = iam_record.read(iam_log, iam_log.stat().st_size if iam_log.exists() else 0)
    yield
    calls, _ = iam_record.read(iam_log, start)
    ours = [c for c in calls if c["function"] in policies.statements]  # another engine's: not this stack
    report = iam_record.check(ours, policies)
    assert not report.denied, "calls the stack's IAM policies deny:\n" + report.summary()


@pytest.fixture
def engine_as_aws(local, monkeypatch):
    """boto3 in this process pointed at the local engine as if it were AWS (endpoint, test
    credentials, region), with the cached clients made again on both sides of the test."""
    from smlt.runtime import clients

    engine, names = local
    for k, v in {
        "AWS_ENDPOINT_URL": engine.endpoint_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    clients.reset()
    yield engine, names
    clients.reset()
