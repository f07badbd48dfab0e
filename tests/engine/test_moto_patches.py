"""The gate of smlt's moto patches (smlt/local/patches.py) is behaviour: every patch names the tests
that show what it does, those tests exist, and the patches no other file exercises are exercised
here (on moto's threaded server, as the engine runs it)."""

from __future__ import annotations

import ast
import json
import threading
import time
import uuid
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from smlt.local import moto_fixes, patches
from smlt.local import server as moto_server
from smlt.local.errors import MotoVersionError

REPO = Path(__file__).resolve().parents[2]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_every_patch_is_gated_by_behaviour_tests_that_exist():
    names = [p.name for p in patches.PATCHES]
    assert len(set(names)) == len(names)
    for p in patches.PATCHES:
        assert p.tests, f"{p.name}: no behaviour test"
        for node in p.tests:
            path, _, function = node.partition("::")
            assert (REPO / path).is_file(), f"{p.name}: {path} is missing"
            assert function in _functions(REPO / path), f"{p.name}: {node} is missing"
        assert p.upstream and p.until, f"{p.name}: no upstream reference or deletion point"
        proposal = p.upstream.partition("docs/moto-upstream/")[2].split(" ")[0]
        if proposal:
            assert (REPO / "docs" / "moto-upstream" / proposal).is_file(), f"{p.name}: {proposal} is missing"


def test_a_patch_whose_target_is_gone_fails_by_name(monkeypatch):
    def apply() -> None:
        raise AttributeError("type object 'Table' has no attribute 'query'")

    gone = patches.Patch("gone", "speed", "-", apply, ("-",), "-", "-")
    monkeypatch.setattr(patches, "PATCHES", (gone,))
    monkeypatch.setattr(patches, "_installed", set())
    with pytest.raises(MotoVersionError, match=r"moto patch 'gone': .*no attribute 'query'"):
        patches.install(speedups=True)


@pytest.fixture(scope="module")
def server():
    s = moto_server.acquire()
    yield s
    moto_server.release()


def _client(server, service):
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).client(service, endpoint_url=server.endpoint_url)


def test_dynamodb_operations_take_turns(server):
    """moto's table operations are not thread-safe (a transaction's rollback copy iterates a table
    another request thread writes to): each runs under one lock, so a write waits for the one under way."""
    ddb = _client(server, "dynamodb")
    table = f"smlt-lock-{uuid.uuid4().hex[:8]}"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    done = threading.Event()
    writer = threading.Thread(target=lambda: (ddb.put_item(TableName=table, Item={"pk": {"S": "a"}}), done.set()))
    with moto_fixes._lock:  # an operation under way
        writer.start()
        assert not done.wait(0.5)  # the write waits for it
    assert done.wait(10)
    writer.join()
    assert ddb.get_item(TableName=table, Key={"pk": {"S": "a"}})["Item"] == {"pk": {"S": "a"}}
    ddb.delete_table(TableName=table)


def test_racing_conditional_puts_have_one_winner(server):
    """If-None-Match: * is atomic on AWS: of racing writers exactly one stores its body (412 for the
    others), even when storing a body takes a moment (a spilled body is a file write)."""
    s3 = _client(server, "s3")
    bucket = f"smlt-race-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    body = b"x" * (2 * 1024 * 1024)
    for key in ("a", "b", "c"):
        barrier, outcomes = threading.Barrier(6), []

        def put(i: int, key: str = key, barrier: threading.Barrier = barrier, outcomes: list = outcomes) -> None:
            barrier.wait()
            try:
                s3.put_object(Bucket=bucket, Key=key, Body=bytes([65 + i]) + body, IfNoneMatch="*")
                outcomes.append(i)
            except ClientError as e:
                outcomes.append(e.response["Error"]["Code"])

        threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if isinstance(o, int)]
        assert len(winners) == 1 and sorted(o for o in outcomes if not isinstance(o, int)) == ["PreconditionFailed"] * 5
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read(1) == bytes([65 + winners[0]])


def test_start_execution_task_is_cased_as_on_aws(server):
    """A states:startExecution.sync:2 task passes the ASL's StateMachineArn/Input to the API and
    hands back ExecutionArn/Output/Status, as on AWS (moto alone passes the parameters as written:
    the API refuses them, and its own .sync resolver looks for ExecutionArn)."""
    sfn = _client(server, "stepfunctions")
    role = "arn:aws:iam::123456789012:role/smlt-local"
    suffix = uuid.uuid4().hex[:8]
    child = sfn.create_state_machine(
        name=f"smlt-child-{suffix}",
        roleArn=role,
        definition=json.dumps({"StartAt": "Echo", "States": {"Echo": {"Type": "Pass", "End": True}}}),
    )["stateMachineArn"]
    parent_definition = {
        "StartAt": "Run",
        "States": {
            "Run": {
                "Type": "Task",
                "Resource": "arn:aws:states:::states:startExecution.sync:2",
                "Parameters": {"StateMachineArn": child, "Input": {"trial.$": "$.trial"}},
                "ResultSelector": {"status.$": "$.Status", "arn.$": "$.ExecutionArn", "output.$": "$.Output"},
                "End": True,
            }
        },
    }
    parent = sfn.create_state_machine(
        name=f"smlt-parent-{suffix}", roleArn=role, definition=json.dumps(parent_definition)
    )["stateMachineArn"]
    arn = sfn.start_execution(stateMachineArn=parent, input=json.dumps({"trial": 7}))["executionArn"]
    deadline = time.monotonic() + 60
    while (d := sfn.describe_execution(executionArn=arn))["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert d["status"] == "SUCCEEDED", (d.get("error"), d.get("cause"))
    out = json.loads(d["output"])
    assert out["status"] == "SUCCEEDED"
    assert out["arn"].startswith(child.replace(":stateMachine:", ":execution:"))
    assert out["output"] == {"trial": 7}
