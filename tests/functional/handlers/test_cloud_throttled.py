"""The CLI against Step Functions' API throttling (`--faults sfn_throttle=R`'s handler,
smlt.local.conflicts, armed in this process): a throttled poll (DescribeExecution,
ListExecutions, GetExecutionHistory) is asked again after a pause and the command goes on; a
throttled StartExecution fails the command with `Throttled`, saying so. On moto (mock_aws)."""

import json

import boto3
import pytest

from smlt import cloud
from smlt.cli.console import console
from smlt.local import conflicts
from smlt.runtime import clients, keys
from smlt.runtime.errors import Throttled
from smlt.runtime.items import MetaItem
from smlt.runtime.job import Job
from smlt.runtime.records import RunTable

SHAPE = dict(train_rows=1000, train_shards=4, val_rows=200, features=64, outputs=10, task="classification")
STACK = dict(artifacts_bucket="smlt-artifacts", data_bucket="smlt-data", table="smlt-runs")


@pytest.fixture(autouse=True)
def recorded_executions(monkeypatch):
    from moto.core.config import default_user_config

    monkeypatch.setitem(default_user_config, "stepfunctions", {"execute_state_machine": False})


@pytest.fixture
def throttle(aws, monkeypatch):
    """`throttle(pauses)`: every Step Functions request answered ThrottlingException until the
    CLI has paused `pauses` times (None: for good); botocore does not retry (its pauses would
    count with the CLI's: both sleep through time.sleep). Returns the pauses."""
    monkeypatch.setitem(clients.CONFIGS, "stepfunctions", {"retries": {"max_attempts": 0, "mode": "standard"}})
    clients.reset()
    conflicts.install()
    paused: list[float] = []

    def arm(pauses):
        def sleep(s):
            paused.append(s)
            if pauses is not None and len(paused) >= pauses:
                conflicts.arm(None)  # the bucket refilled

        monkeypatch.setattr(cloud.time, "sleep", sleep)
        conflicts.arm(conflicts.Plan({"sfn_throttle": 1.0}))
        return paused

    yield arm
    conflicts.arm(None)


def _stack_with_failed_run(monkeypatch, run_id):
    sfn = boto3.client("stepfunctions")
    arn = sfn.create_state_machine(
        name="sm",
        definition=json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/r",
    )["stateMachineArn"]
    monkeypatch.setenv("SF_EXECUTION_HISTORY_TYPE", "FAILURE")  # moto: the execution is FAILED
    sfn.start_execution(stateMachineArn=arn, name=run_id, input="{}")
    job = Job.model_validate({"name": "t", "dataset": {"uri": "s3://smlt-data/datasets/digits/"}})
    meta = MetaItem(run_id=run_id, execution=run_id, job=job, status="RUNNING", created_at=1.0, **SHAPE)
    RunTable("smlt-runs", run_id).put_once(keys.META, meta)
    return cloud.Stack(state_machine_arn=arn, **STACK)


def test_a_throttled_status_poll_is_asked_again_and_reads_the_execution(throttle, monkeypatch, capsys):
    stack = _stack_with_failed_run(monkeypatch, "thr-status")
    paused = throttle(2)
    with console():
        cloud.status("thr-status", stack)
    out = capsys.readouterr().out
    assert len(paused) == 2 and "run thr-status: FAILED" in out, out


def test_a_status_poll_throttled_for_good_goes_on_with_the_runs_own_status(throttle, monkeypatch, capsys):
    stack = _stack_with_failed_run(monkeypatch, "thr-good")
    paused = throttle(None)
    with console():
        meta = cloud.status("thr-good", stack)
    out = capsys.readouterr()
    text = out.out + out.err
    assert meta.status == "RUNNING" and len(paused) == cloud.POLL_ATTEMPTS - 1
    assert "Step Functions throttled DescribeExecution of thr-good" in text and "run thr-good: RUNNING" in text, text
    assert "smlt status` again" in text, text


def test_a_throttled_history_page_is_asked_again_not_the_listing(throttle, monkeypatch):
    stack = _stack_with_failed_run(monkeypatch, "thr-pages")
    paused = throttle(1)
    (ex,) = cloud.pages(
        boto3.client("stepfunctions").list_executions, "executions", stateMachineArn=stack.state_machine_arn
    )
    assert ex["name"] == "thr-pages" and len(paused) == 1


def test_a_throttled_start_says_so_by_name(throttle, monkeypatch, tmp_path):
    stack = _stack_with_failed_run(monkeypatch, "thr-old")
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"name": "thr", "dataset": {"uri": "s3://smlt-data/datasets/digits/"}}))
    paused = throttle(None)
    with pytest.raises(Throttled) as raised:
        cloud.start(path, stack)
    said = str(raised.value)
    assert said.startswith("Step Functions StartExecution of run thr-") and "(ThrottlingException)" in said, said
    assert "this request started nothing" in said and f"smlt start {path}` again in a minute" in said, said
    assert paused == []  # a start is not repeated by the CLI: the user repeats it
