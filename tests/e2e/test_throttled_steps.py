"""A control step whose DynamoDB requests stay throttled through botocore's retries fails
with `Throttled` naming the table, and the state machine runs it again after a pause (its Retry
on `Throttled`, infra/stacks/workflow.py): the run goes on and succeeds. On the session's engine,
the throttling the engine's `--faults ddb_throttle=R` injects (smlt.local.conflicts), here at
rate 1 in the first Plan's handler process alone, whose clients make 2 attempts (AWS_MAX_ATTEMPTS:
botocore's backoff over its default 8 would be most of the test's time)."""

from __future__ import annotations

import json
import threading

from smlt.datasets import stage_dataset
from smlt.local import conflicts
from smlt.runtime import clients
from tests.e2e.test_local_run import digits_job


class FirstPlanThrottled:
    """An invoke filter: the first Plan's handler process answers every DynamoDB request with
    ProvisionedThroughputExceededException; every other invocation runs as it is."""

    def __init__(self) -> None:
        self.plans = 0
        self._op = threading.local()  # the engine asks handler_env() in the invoking thread

    def __call__(self, function_name: str, payload: object) -> str:
        event = payload if isinstance(payload, dict) else {}
        self._op.throttled = event.get("op") == "plan" and self.plans == 0
        self.plans += event.get("op") == "plan"
        return "ok"

    def handler_env(self) -> dict[str, str]:
        if getattr(self._op, "throttled", False):
            return {**conflicts.Plan({"ddb_throttle": 1.0}).env(), clients.MAX_ATTEMPTS_ENV: "2"}
        return {}


def test_a_plan_throttled_out_is_retried_after_a_pause_and_the_run_succeeds(local):
    engine, names = local
    job = digits_job(max_rounds=1, target_value=None, local_steps=5)
    job["dataset"] = {"uri": stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))}
    engine.invoke_filter = FirstPlanThrottled()
    try:
        desc = engine.wait(engine.start_execution(job, name="throttled-plan"), interval=0.5, timeout=600)
    finally:
        engine.invoke_filter = None
    assert desc["status"] == "SUCCEEDED", desc
    events = engine.client("stepfunctions").get_execution_history(executionArn=desc["executionArn"], maxResults=1000)[
        "events"
    ]
    failed = [e["taskFailedEventDetails"] for e in events if e["type"] == "TaskFailed"]
    failed += [e["lambdaFunctionFailedEventDetails"] for e in events if e["type"] == "LambdaFunctionFailed"]
    (throttled,) = failed  # the first Plan, once
    assert throttled["error"] == "Throttled", throttled
    said = json.loads(throttled["cause"])["errorMessage"]
    assert said.startswith("DynamoDB ") and f"of table {names.table} stayed throttled" in said, said
    assert "(ProvisionedThroughputExceededException) after botocore's 1 retry" in said, said
    entered = [e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e]
    assert entered.count("Plan") >= 2 and "Finalize" in entered, entered
