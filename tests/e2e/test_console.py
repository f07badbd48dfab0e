"""`smlt local up` / `down` as a user drives them: the AWS CLI and plain boto3 start runs on the
console's endpoint, an upload to the data bucket starts a retraining run, `smlt stop` and
`smlt status` work against it, and the runs survive `down` and a second `up`."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from smlt import console
from smlt.datasets import local_dataset_folder
from smlt.runtime.records import RunTable

ROOT = Path(__file__).resolve().parents[2]
AWS = shutil.which("aws", path=str(Path(sys.executable).parent)) or shutil.which("aws")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def small_job(uri: str, **extra) -> dict:
    job = json.loads((ROOT / "examples/digits.json").read_text())
    job["dataset"]["uri"] = uri
    job["training"].update(max_rounds=2, target_value=None)
    job["workers"].update(initial=2, max=2)
    return {**job, **extra}


def smlt(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smlt.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def wait(sfn, arns: list[str], timeout: float = 240) -> dict[str, str]:
    t0, status = time.monotonic(), {}
    while time.monotonic() - t0 < timeout:
        status = {a: sfn.describe_execution(executionArn=a)["status"] for a in arns}
        if "RUNNING" not in status.values():
            return status
        time.sleep(1)
    raise TimeoutError(status)


@pytest.mark.skipif(AWS is None, reason="the AWS CLI (awscli, a dev dependency) is not installed")
def test_console_up_aws_cli_boto3_upload_trigger_down_and_up_again(tmp_path):
    state = tmp_path / "console"
    info = console.up(state, port=free_port())
    env = {**os.environ, **info.environment()}
    try:
        assert console.up(state, port=1).pid == info.pid  # already up: the same console
        kw = dict(
            endpoint_url=info.endpoint_url,
            region_name=info.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        sfn, s3, ddb = boto3.client("stepfunctions", **kw), boto3.client("s3", **kw), boto3.client("dynamodb", **kw)
        folder = local_dataset_folder("sklearn:digits")
        uri = f"s3://{info.data_bucket}/datasets/digits/"
        subprocess.run([AWS, "s3", "cp", str(folder), uri, "--recursive", "--quiet"], env=env, check=True, timeout=60)

        # the AWS CLI: the input a user would paste into the Step Functions console
        (tmp_path / "job.json").write_text(json.dumps(small_job(uri, run_id="by-cli")))
        out = subprocess.run(
            [
                AWS,
                "stepfunctions",
                "start-execution",
                "--state-machine-arn",
                info.state_machine_arn,
                "--name",
                "by-cli",
                "--input",
                f"file://{tmp_path / 'job.json'}",
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        cli_arn = json.loads(out.stdout)["executionArn"]
        # plain boto3
        boto_arn = sfn.start_execution(
            stateMachineArn=info.state_machine_arn,
            name="by-boto3",
            input=json.dumps(
                small_job(uri, run_id="by-boto3", training={**small_job(uri)["training"], "max_rounds": 30})
            ),
        )["executionArn"]
        # an upload: incoming/<pipeline>/job.json, the version's shards, its manifest last
        pipeline = small_job(uri)
        s3.put_object(Bucket=info.data_bucket, Key="incoming/digits/job.json", Body=json.dumps(pipeline))
        for f in sorted(folder.iterdir()):
            if f.name != "manifest.json":
                s3.upload_file(str(f), info.data_bucket, f"incoming/digits/v1/{f.name}")
        s3.upload_file(str(folder / "manifest.json"), info.data_bucket, "incoming/digits/v1/manifest.json")

        # `smlt stop` on the long boto3 run once it has a round: it ends early with its model
        table = RunTable(info.table, "by-boto3", client=ddb)
        t0 = time.monotonic()
        while not table.rounds() and time.monotonic() - t0 < 180:
            time.sleep(1)
        stopped = smlt(env, "stop", "by-boto3", "--reason", "enough")
        assert stopped.returncode == 0, stopped.stderr
        assert "stop requested for run by-boto3 by user: enough" in stopped.stdout

        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            arns = [
                e["executionArn"] for e in sfn.list_executions(stateMachineArn=info.state_machine_arn)["executions"]
            ]
            if len(arns) >= 3:
                break
            time.sleep(0.5)
        assert len(arns) == 3 and {cli_arn, boto_arn} < set(arns), "the upload started no execution"
        assert set(wait(sfn, arns).values()) == {"SUCCEEDED"}
        metas = {m.run_id: m for m in (RunTable(info.table, r, client=ddb).meta() for r in ("by-cli", "by-boto3")) if m}
        assert metas["by-cli"].final.rounds == 2
        assert metas["by-boto3"].final.stop_reason == "stopped by user: enough"
        assert metas["by-boto3"].final.rounds < 30
        triggered = [json.loads(sfn.describe_execution(executionArn=a)["input"]) for a in arns]
        assert any(t.get("trigger", {}).get("key") == "incoming/digits/v1/manifest.json" for t in triggered)

        # `smlt tune` through the deployed path: the console's stack outputs name the study machine
        study = json.loads((ROOT / "examples/digits-study.json").read_text())
        study["job"]["training"]["max_rounds"] = 2
        study.update(trials=2, concurrency=2, search={"kind": "random"})
        (tmp_path / "study.json").write_text(json.dumps(study))
        tuned = smlt(env, "tune", str(tmp_path / "study.json"), "--out", str(tmp_path / "study-out"))
        assert tuned.returncode == 0, tuned.stderr
        best = json.loads((tmp_path / "study-out" / "best.json").read_text())
        assert best["best_run_id"] and (tmp_path / "study-out" / "model.safetensors").stat().st_size > 0
    finally:
        console.down(state)
    assert console.read_info(state) is None and not (state / "console.json").exists()

    # up again: the runs are back (items and objects), `smlt status` reads them
    info2 = console.up(state, port=free_port())
    try:
        env = {**os.environ, **info2.environment()}
        status = smlt(env, "status", "by-cli")
        assert status.returncode == 0, status.stderr
        assert "run by-cli: SUCCEEDED" in status.stdout and "round   1" in status.stdout
        s3 = boto3.client(
            "s3",
            endpoint_url=info2.endpoint_url,
            region_name=info2.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        metrics = json.loads(
            s3.get_object(Bucket=info2.artifacts_bucket, Key="runs/by-boto3/final/metrics.json")["Body"].read()
        )
        assert metrics["final"]["stop_reason"] == "stopped by user: enough"
        # what was uploaded before the restart does not fire the trigger again
        time.sleep(2)
        sfn = boto3.client(
            "stepfunctions",
            endpoint_url=info2.endpoint_url,
            region_name=info2.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        assert sfn.list_executions(stateMachineArn=info2.state_machine_arn)["executions"] == []
    finally:
        console.down(state)


def test_down_without_a_console_and_a_taken_port_are_named_errors(tmp_path):
    with pytest.raises(console.ConsoleError, match="no console is up"):
        console.down(tmp_path / "none")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(console.ConsoleError, match=f"--port {port}: 127.0.0.1:{port} is in use"):
            console.Console(tmp_path / "c", port=port).start()
