"""A control step whose S3 or DynamoDB request stays throttled through botocore's attempts fails
with `Throttled`, naming the service, the request and the object or table (the state machine
retries it: infra/stacks/workflow.py); the step run again once the throttling lets up succeeds.
The throttling is the local engine's (`--faults s3_slowdown=R,ddb_throttle=R`,
smlt.local.conflicts), on moto with the real digits data."""

import pytest

from lambdas.aggregate.handler import handler as aggregate
from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.local import conflicts
from smlt.runtime import clients
from smlt.runtime.errors import Throttled
from tests.functional.handlers.conftest import job


@pytest.fixture
def throttle(aws, monkeypatch):
    """`throttle(kind)`: every request of the kind's service answered throttled from now on
    (`throttle(None)`: none); botocore retries twice, not 7 times (its backoff kept short)."""
    for service in ("s3", "dynamodb"):
        monkeypatch.setitem(clients.CONFIGS, service, {"retries": {"max_attempts": 2, "mode": "standard"}})
    clients.reset()
    conflicts.install()

    def arm(kind):
        conflicts.arm(conflicts.Plan({kind: 1.0}) if kind else None)

    yield arm
    conflicts.arm(None)


def plan(j, execution):
    return planner({"op": "plan", "job": j, "execution": execution}, None)


def test_a_plan_throttled_out_is_named_and_its_retry_succeeds(digits, throttle):
    throttle("ddb_throttle")
    with pytest.raises(Throttled) as e:
        plan(job(digits), "thr")
    said = str(e.value)
    assert said.startswith("DynamoDB ") and "of table smlt-runs stayed throttled" in said, said
    assert "(ProvisionedThroughputExceededException) after botocore's 2 retries" in said, said
    assert "resume it a little later" in said, said
    throttle(None)
    p = plan(job(digits), "thr")  # the state machine's retry: the same step again
    assert p["action"] == "train" and p["round"] == 0


def test_an_aggregate_throttled_out_on_s3_names_the_object_and_its_retry_succeeds(digits, throttle):
    p = plan(job(digits, max_rounds=2), "thr-s3")
    for w in p["workers"]:
        train_step({"run_id": "thr-s3", "round": 0, "worker": w}, None)
    throttle("s3_slowdown")
    with pytest.raises(Throttled) as e:
        aggregate({"run_id": "thr-s3", "round": 0}, None)
    said = str(e.value)
    assert said.startswith("S3 ") and " of s3://smlt-" in said and "(SlowDown) after botocore's 2 retries" in said, said
    throttle(None)
    agg = aggregate({"run_id": "thr-s3", "round": 0}, None)
    assert agg["round"] == 0 and "retry" not in agg
