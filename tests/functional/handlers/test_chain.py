"""Chain: the planner starts the execution that continues a run, by a name derived from the round.
An execution of that name that exists already is the run going on only while it is alive."""

import json

import boto3
import pytest

from lambdas.planner.handler import handler as planner
from smlt.runtime.errors import ChainedExecutionFailed


@pytest.fixture(autouse=True)
def recorded_executions(monkeypatch):
    """moto records executions without running them (RUNNING until stopped), also after a local
    engine in this process switched execution on for its moto server (a process-wide setting)."""
    from moto.core.config import default_user_config

    monkeypatch.setitem(default_user_config, "stepfunctions", {"execute_state_machine": False})


def _state_machine(name: str) -> str:
    return boto3.client("stepfunctions").create_state_machine(
        name=name,
        definition=json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/r",
    )["stateMachineArn"]


def _chain(arn: str, run_id: str, rnd: int = 3) -> dict:
    return planner({"op": "chain", "job": {"name": "t"}, "run_id": run_id, "round": rnd, "state_machine": arn}, None)


def test_a_running_continuation_is_the_run_going_on(aws):
    arn = _state_machine("sm-running")
    first = _chain(arn, "c-run")
    sfn = boto3.client("stepfunctions")
    assert sfn.describe_execution(executionArn=first["execution_arn"])["status"] == "RUNNING"
    assert _chain(arn, "c-run") == first  # a repeated Chain starts nothing new and succeeds


def test_an_aborted_continuation_fails_the_chain_with_a_named_error(aws):
    arn = _state_machine("sm-aborted")
    first = _chain(arn, "c-abort")
    sfn = boto3.client("stepfunctions")
    sfn.stop_execution(executionArn=first["execution_arn"])
    with pytest.raises(ChainedExecutionFailed, match=r"c-abort-r000003 .* is ABORTED"):
        _chain(arn, "c-abort")


def test_a_failed_continuation_fails_the_chain_with_a_named_error(aws, monkeypatch):
    arn = _state_machine("sm-failed")
    monkeypatch.setenv("SF_EXECUTION_HISTORY_TYPE", "FAILURE")  # moto: new executions are FAILED
    first = _chain(arn, "c-fail")
    sfn = boto3.client("stepfunctions")
    assert sfn.describe_execution(executionArn=first["execution_arn"])["status"] == "FAILED"
    with pytest.raises(ChainedExecutionFailed, match="FAILED") as raised:
        _chain(arn, "c-fail")
    assert "smlt resume c-fail" in str(raised.value)


def test_a_chain_whose_start_stays_throttled_is_named_throttled_and_its_retry_continues_the_run(aws, monkeypatch):
    """Step Functions' StartExecution bucket ran dry (`--faults sfn_throttle=1`): after botocore's
    attempts Chain raises `Throttled` naming the request (the state machine retries Chain on it:
    infra/stacks/workflow.py), not a bare ClientError; the retry starts the continuation once."""
    from smlt.local import conflicts
    from smlt.runtime import clients
    from smlt.runtime.errors import Throttled

    arn = _state_machine("sm-throttled")
    monkeypatch.setitem(clients.CONFIGS, "stepfunctions", {"retries": {"max_attempts": 2, "mode": "standard"}})
    clients.reset()
    conflicts.install()
    conflicts.arm(conflicts.Plan({"sfn_throttle": 1.0}))
    try:
        with pytest.raises(Throttled) as raised:
            _chain(arn, "c-thr")
    finally:
        conflicts.arm(None)
    said = str(raised.value)
    assert said.startswith("Step Functions StartExecution of execution c-thr-r000003 of " + arn), said
    assert "(ThrottlingException) after botocore's 2 retries" in said and "token bucket" in said, said
    assert "fewer runs and studies at once" in said, said
    sfn = boto3.client("stepfunctions")
    out = _chain(arn, "c-thr")  # the state machine's retry of Chain
    assert sfn.describe_execution(executionArn=out["execution_arn"])["status"] == "RUNNING"
