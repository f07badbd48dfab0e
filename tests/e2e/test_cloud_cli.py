"""`smlt start/status/fetch/resume` against a "deployed" stack: the local engine's endpoint
stands in for AWS, and a CloudFormation stack in moto carries the outputs the CLI looks up."""

import json
from pathlib import Path

import pytest

from smlt import cloud
from smlt.cli.console import console
from smlt.runtime.errors import StackNotFound

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def deployed(engine_as_aws):
    from smlt.console import publish_outputs

    engine, names = engine_as_aws
    publish_outputs(engine, "SmltCliTest")
    cfn = engine.client("cloudformation")
    yield engine, cloud.Stack.lookup("SmltCliTest", cfn=cfn)
    cfn.delete_stack(StackName="SmltCliTest")


def test_start_status_fetch(deployed, tmp_path, capsys):
    engine, stack = deployed
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job.update(run_id="cli-run")
    job["training"].update(max_rounds=2, target_value=None)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    with console():  # the lines `smlt start` prints
        run_id = cloud.start(path, stack)
    assert run_id == "cli-run" and "started run cli-run" in capsys.readouterr().out
    sfn = engine.client("stepfunctions")
    (ex,) = [
        e
        for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if e["name"].startswith("cli-run")
    ]
    assert engine.wait(ex["executionArn"], interval=0.2)["status"] == "SUCCEEDED"

    with console():
        assert cloud.status("cli-run", stack).status == "SUCCEEDED"
    out = capsys.readouterr().out
    assert "round   1" in out and "run cli-run: SUCCEEDED" in out

    assert cloud.fetch("cli-run", stack, tmp_path / "fetched")["final"]["rounds"] == 2
    for name in ("model.safetensors", "metrics.json", "report.png", "history.json"):
        assert (tmp_path / "fetched" / name).exists()
    with pytest.raises(Exception, match="already finished"):
        cloud.resume("cli-run", stack)


def test_lookup_names_a_missing_stack(deployed):
    engine, _ = deployed
    with pytest.raises(StackNotFound, match="stack 'Nope' not found"):
        cloud.Stack.lookup("Nope", cfn=engine.client("cloudformation"))


WIDE = """\
from torch import nn


def build(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], output_dim + 2))
"""


def test_start_with_an_s3_dataset_refuses_a_model_that_cannot_train_before_any_execution(deployed, tmp_path, capsys):
    from smlt.cli import main
    from smlt.datasets import local_dataset_folder, upload_dataset

    engine, stack = deployed
    uri = upload_dataset(local_dataset_folder("sklearn:digits"), stack.data_bucket)
    pkg = tmp_path / "e2ewide"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(WIDE)
    path = tmp_path / "job.json"
    path.write_text(
        json.dumps({"name": "wide", "run_id": "s3-wide", "dataset": {"uri": uri}, "model": {"name": "e2ewide:build"}})
    )
    assert main(["start", str(path), "--stack", "SmltCliTest", "--code", str(pkg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: InvalidJob: model.name: 'e2ewide:build' gives 12 outputs per sample, but digits has 10 classes: too many"
    )
    sfn = engine.client("stepfunctions")
    started = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    assert not [e for e in started if e["name"].startswith("s3-wide")]


RAISES = """\
from torch import nn


class Net(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.lin = nn.Linear(n, k)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.training and self.calls > 1:
            raise ValueError("scale is not ready")
        return self.lin(x)


def build(input_shape, output_dim):
    return Net(input_shape[0], output_dim)
"""


class _Ended:
    """Step Functions as seen by `smlt status`, the execution ended with `error`."""

    def __init__(self, sfn, error):
        self.sfn, self.error, self.exceptions = sfn, error, sfn.exceptions

    def describe_execution(self, executionArn):
        ended = self.sfn.describe_execution(executionArn=executionArn)
        return {**ended, "status": "FAILED", "error": self.error, "cause": f"{self.error}: the cause"}


def test_status_of_a_run_a_resume_would_fail_again_says_to_start_it_again(deployed, tmp_path, capsys):
    """`smlt status` reads the CLI's own list of errors a resume meets again (UserCodeError,
    InvalidCode, Diverged, ...): it used to print `smlt resume RUN` after every failed execution."""
    from smlt.cli import main

    engine, stack = deployed
    pkg = tmp_path / "e2eraises"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(RAISES)
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job.update(run_id="cli-usercode", model={"name": "e2eraises:build"})
    job["training"].update(max_rounds=2, target_value=None)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    with console():
        cloud.start(path, stack, code=pkg)
    capsys.readouterr()
    sfn = engine.client("stepfunctions")
    (ex,) = [
        e
        for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if e["name"].startswith("cli-usercode")
    ]
    assert engine.wait(ex["executionArn"], interval=0.2)["status"] == "FAILED"

    assert main(["status", "cli-usercode", "--stack", "SmltCliTest"]) == 0
    out = capsys.readouterr().out
    assert "run cli-usercode: FAILED: UserCodeError" in out and "scale is not ready" in out
    assert "fix your code and start the run again" in out and "smlt resume" not in out

    for error in ("Diverged", "InvalidCode"):  # the cause says nothing: the CLI's line says it
        with console():
            cloud.status("cli-usercode", stack, sfn=_Ended(sfn, error))
        out = capsys.readouterr().out
        assert "a resume would fail the same way: fix the cause and start the run again" in out
        assert "smlt resume" not in out
    with console():  # a platform's failure: resumed
        cloud.status("cli-usercode", stack, sfn=_Ended(sfn, "States.Timeout"), resume_command="smlt resume R --stack S")
    assert "continue it from its last complete round with: smlt resume R --stack S" in capsys.readouterr().out
