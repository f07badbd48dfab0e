"""A control step whose process died after some of its writes, then retried (Step Functions
retries `Runtime.ExitError` / `Lambda.Unknown` on Plan, Aggregate and Finalize): the retry must
finish what the first attempt began, not build on its half. On moto, with the real digits data."""

import pytest

from lambdas.planner.handler import handler as planner
from lambdas.train_step.handler import handler as train_step
from smlt.runtime.job import parse_job
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
