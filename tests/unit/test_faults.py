"""`--faults`: the conflict kinds and the fault seed."""

import json

import pytest

from smlt.faults import CRASH_WRITES, FaultInjector, parse_fault_spec, parse_faults
from smlt.local import conflicts


def pattern(injector, n=200):
    return [injector("w", {}) for _ in range(n)]


def test_conflict_kinds_and_seed_parse_next_to_the_invocation_faults():
    spec = parse_fault_spec("fail=0.2, duplicate=0.05, s3_conflict=0.1, ddb_conflict=0.3, seed=7")
    assert spec.rates == {"fail": 0.2, "duplicate": 0.05, "s3_conflict": 0.1, "ddb_conflict": 0.3}
    assert spec.seed == 7
    assert parse_fault_spec("fail=0.2").seed is None
    assert parse_faults("fail=0.2,seed=3") == {"fail": 0.2}
    # conflicts are drawn per request, not per invocation: they do not share the invocation's 100 %
    assert parse_faults("fail=0.9,s3_conflict=0.5")["s3_conflict"] == 0.5
    for bad in ("fail=0.6,duplicate=0.6", "seed=x", "seed=-1", "seed=1.5", "s3_conflict=2", "db_conflict=0.1"):
        with pytest.raises(ValueError, match="--faults"):
            parse_fault_spec(bad)


def test_without_a_seed_the_fault_pattern_follows_the_jobs_seed():
    one, two, one_again = (FaultInjector.from_spec("fail=0.3,duplicate=0.2") for _ in range(3))
    one.execution_started({"seed": 1})
    two.execution_started({"seed": 2})
    one_again.execution_started({"seed": 1})
    first = pattern(one)
    assert first != pattern(two)  # different job seeds, different faults
    assert first == pattern(one_again)  # the same job seed replays them
    zero = FaultInjector.from_spec("fail=0.3,duplicate=0.2")
    zero.execution_started({"seed": 0})
    assert pattern(zero) != pattern(FaultInjector({"fail": 0.3, "duplicate": 0.2}, seed=0))  # not a fixed 0


def test_an_explicit_seed_wins_over_the_jobs():
    a, b = FaultInjector.from_spec("fail=0.3,seed=4"), FaultInjector.from_spec("fail=0.3,seed=4")
    a.execution_started({"seed": 1})
    b.execution_started({"seed": 2})
    assert pattern(a) == pattern(b)
    c = FaultInjector.from_spec("fail=0.3,seed=5")
    assert pattern(c) != pattern(FaultInjector.from_spec("fail=0.3,seed=4"))


def test_conflict_settings_reach_the_handler_process_with_a_seed_per_invocation(monkeypatch):
    assert FaultInjector.from_spec("fail=0.2").handler_env() == {}
    injector = FaultInjector.from_spec("fail=0.2,s3_conflict=0.25,seed=1")
    first, second = injector.handler_env(), injector.handler_env()
    spec = json.loads(first[conflicts.ENV])
    assert spec["rates"] == {"s3_conflict": 0.25} and spec["seed"] != json.loads(second[conflicts.ENV])["seed"]
    monkeypatch.setattr(conflicts, "_plan", None)
    conflicts.arm_from_env(first)
    assert conflicts._plan is not None and conflicts._plan.rates == {"s3_conflict": 0.25}
    conflicts.arm_from_env({})
    assert conflicts._plan is None


def test_crash_kills_a_control_step_after_one_of_its_first_writes_and_never_a_worker():
    assert parse_faults("kill=0.2,crash=0.3") == {"kill": 0.2, "crash": 0.3}
    with pytest.raises(ValueError, match="kill, crash add up to more than 1"):
        parse_fault_spec("kill=0.6,crash=0.5")
    injector = FaultInjector.from_spec("crash=0.5,seed=2")
    fates = [injector("planner", {"op": "plan"}) for _ in range(200)]
    crashes = [f for f in fates if f != "ok"]
    assert 60 < len(crashes) < 140 and injector.counts["crash"] == len(crashes)
    assert {int(f.removeprefix("crash:")) for f in crashes} == set(range(1, CRASH_WRITES + 1))
    assert {injector("train", {"run_id": "r", "round": 0, "worker": 1}) for _ in range(50)} == {"ok"}
    # `kill` strikes the same invocations as without `crash` (one draw each, the same seed)
    alone, both = FaultInjector.from_spec("kill=0.3,seed=2"), FaultInjector.from_spec("kill=0.3,crash=0.4,seed=2")
    plan = {"op": "plan"}
    assert [alone("p", plan) == "kill" for _ in range(100)] == [both("p", plan) == "kill" for _ in range(100)]


def test_throttling_answers_as_aws_does_and_botocore_reads_it(monkeypatch):
    """`s3_slowdown` and `ddb_throttle`: S3's 503 SlowDown and DynamoDB's
    ProvisionedThroughputExceededException, on any request of the service, from the handler
    registered on the session (nothing reaches a server: the endpoint below does not exist)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    assert parse_fault_spec("s3_slowdown=0.1,ddb_throttle=0.2").rates == {"s3_slowdown": 0.1, "ddb_throttle": 0.2}
    session = boto3.Session(aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1")
    conflicts.install(session)
    monkeypatch.setattr(conflicts, "_plan", conflicts.Plan({"s3_slowdown": 1.0, "ddb_throttle": 1.0}))
    once = Config(retries={"max_attempts": 1, "mode": "standard"})
    s3 = session.client("s3", endpoint_url="http://127.0.0.1:9", config=once)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="b", Key="k")
    assert e.value.response["Error"]["Code"] == "SlowDown"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    ddb = session.client("dynamodb", endpoint_url="http://127.0.0.1:9", config=once)
    with pytest.raises(ClientError) as e:
        ddb.get_item(TableName="t", Key={"pk": {"S": "x"}})
    assert e.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"


def test_sfn_throttle_answers_step_functions_requests_as_aws_does(monkeypatch):
    """`sfn_throttle`: Step Functions' HTTP 400 ThrottlingException ("Rate exceeded") on any of
    its requests, which botocore reads as such and retries (standard mode); S3 is left alone."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    assert parse_fault_spec("sfn_throttle=0.3").rates == {"sfn_throttle": 0.3}
    session = boto3.Session(aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1")
    conflicts.install(session)
    monkeypatch.setattr(conflicts, "_plan", conflicts.Plan({"sfn_throttle": 1.0}))
    sfn = session.client(
        "stepfunctions",
        endpoint_url="http://127.0.0.1:9",
        config=Config(retries={"max_attempts": 2, "mode": "standard"}),
    )
    monkeypatch.setattr("time.sleep", lambda s: None)  # botocore's backoff between its retries
    for call in (
        lambda: sfn.start_execution(stateMachineArn="arn:aws:states:us-east-1:1:stateMachine:m", name="n"),
        lambda: sfn.describe_execution(executionArn="arn:aws:states:us-east-1:1:execution:m:n"),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == "ThrottlingException"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert e.value.response["ResponseMetadata"]["RetryAttempts"] == 2  # botocore took it for a throttle
