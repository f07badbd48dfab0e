"""Integration tests of the local engine: the fixture CDK app's state machine on moto, Lambda
invocations served by the handler process pool. One engine (one synth, one server) per module.

If a moto or botocore upgrade breaks the interpreter or the Invoke seam, these fail loudly."""

import json
import os
import re
import threading
import time

import pytest
from botocore.exceptions import ClientError

from smlt.local import limits
from smlt.local.resolve import Resolver

from .conftest import job
from .fixture_app import STACK_ID


def _lid(engine, prefix):
    (lid,) = [k for k in engine.synthesized.template["Resources"] if re.fullmatch(prefix + r"[0-9A-F]{8}", k)]
    return lid


def _items(engine, run_id, prefix):
    table = engine.names[_lid(engine, "Table")]
    resp = engine.client("dynamodb").query(
        TableName=table,
        KeyConditionExpression="pk = :p AND begins_with(sk, :s)",
        ExpressionAttributeValues={":p": {"S": f"RUN#{run_id}"}, ":s": {"S": prefix}},
    )
    return resp["Items"]


def _run(engine, timeout=60, **kw):
    arn = engine.start_execution(job(**kw))
    d = engine.wait(arn, timeout=timeout)
    return arn, d


def _output(d):
    assert d["status"] == "SUCCEEDED", (d.get("error"), d.get("cause"))
    return json.loads(d["output"])


# ------------------------------------------------------------------------------------------
# the contract's shape end to end


def test_map_rounds_function_name_and_handler_io(engine):
    arn, d = _run(engine, workers=["ok", "ok", "ok"], rounds=2, max_concurrency=2)
    out = _output(d)
    run_id = out["execution"]
    assert out["outcomes"] == [{"worker": i, "ok": True} for i in range(3)]
    assert out["agg"] == {"round": 1, "stop": True, "workers_ok": 3}
    assert out["final"] == {"final": True}
    # FunctionName.$ came from the plan, which read the tier map from its env (Refs resolved)
    small = engine.names[_lid(engine, "TrainSmall")]
    assert out["plan"]["function_name"] == small
    # handler processes wrote to S3 and DynamoDB over loopback
    s3 = engine.client("s3")
    bucket = engine.names[_lid(engine, "ArtifactsBucket")]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{run_id}/")["Contents"]}
    for r in (0, 1):
        assert f"runs/{run_id}/rounds/{r:06d}/plan.json" in keys
        assert f"runs/{run_id}/rounds/{r:06d}/summary.json" in keys
        for i in range(3):
            assert f"runs/{run_id}/rounds/{r:06d}/updates/{i:05d}.json" in keys
    body = json.loads(
        s3.get_object(Bucket=bucket, Key=f"runs/{run_id}/rounds/000001/updates/00002.json")["Body"].read()
    )
    assert body == {"worker": 2, "tier": "small"}
    workers = _items(engine, run_id, "WORKER#")
    assert len(workers) == 6
    pids = {int(w["pid"]["N"]) for w in workers}
    assert os.getpid() not in pids
    assert {w["function"]["S"] for w in workers} == {small}
    rounds = _items(engine, run_id, "ROUND#")
    assert [x["workers_ok"]["N"] for x in rounds] == ["3", "3"]
    # the history has the distributed map run
    types = [e["type"] for e in engine.history(arn)]
    assert "MapRunStarted" in types and "MapRunSucceeded" in types
    assert types[0] == "ExecutionStarted" and types[-1] == "ExecutionSucceeded"


def test_max_concurrency_path_is_honoured(engine):
    _, d = _run(engine, workers=["sleep:0.3"] * 3, max_concurrency=1)
    run_id = _output(d)["execution"]
    spans = sorted((float(w["t_start"]["S"]), float(w["t_end"]["S"])) for w in _items(engine, run_id, "WORKER#"))
    assert len(spans) == 3
    for (_, e0), (s1, _) in zip(spans, spans[1:]):
        assert s1 >= e0, "with MaxConcurrency 1 the workers must not overlap"


def test_intrinsic_functions(engine):
    _, d = _run(engine, workers=["ok", "ok"], rounds=0, spins=4)
    out = _output(d)
    name = out["execution"]
    assert out["n_workers"] == 2
    assert out["key"] == f"runs/{name}/job.json"
    assert out["merged"] == {"a": 1, "b": 2}
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", out["uuid"])
    assert out["range"] == [0, 2, 4]
    assert out["sum"] == 5
    assert out["plan"]["action"] == "stop" and "outcomes" not in out


# ------------------------------------------------------------------------------------------
# errors: Retry, Catch, names


def test_retry_until_success(engine):
    arn, d = _run(engine, workers=["flaky:1", "ok"])
    out = _output(d)
    assert out["outcomes"] == [{"worker": 0, "ok": True}, {"worker": 1, "ok": True}]
    (flaky,) = _items(engine, out["execution"], "FLAKY#")
    assert flaky["attempts"]["N"] == "2"


def test_catch_reports_the_error_type(engine):
    _, d = _run(engine, workers=["boom", "ok"])
    out = _output(d)
    failed, ok = out["outcomes"]
    assert ok == {"worker": 1, "ok": True}
    assert failed["ok"] is False and failed["worker"] == {"i": 0, "mode": "boom"}
    assert failed["error"] == "WorkerBoom"
    cause = json.loads(failed["cause"])
    assert cause["errorType"] == "WorkerBoom"
    assert cause["errorMessage"] == "worker 0 exploded"
    assert any("app.py" in line for line in cause["stackTrace"])


def test_uncaught_handler_error_fails_the_execution_with_its_name(engine):
    arn, d = _run(engine, invalid="dataset")
    assert d["status"] == "FAILED"
    assert d["error"] == "InvalidJob"
    cause = json.loads(d["cause"])
    assert cause["errorType"] == "InvalidJob"
    assert cause["errorMessage"] == "job.dataset: field required"
    events = engine.history(arn)
    failed = [e for e in events if e["type"] == "LambdaFunctionFailed"]
    assert failed and failed[0]["lambdaFunctionFailedEventDetails"]["error"] == "InvalidJob"
    last = events[-1]
    assert last["type"] == "ExecutionFailed"
    assert last["executionFailedEventDetails"]["error"] == "InvalidJob"


def test_timeout_kills_and_replaces_the_worker(engine):
    before = dict(engine.pool.stats)
    pids_before = set(engine.pool.pids())
    t0 = time.monotonic()
    _, d = _run(engine, workers=["sleep:30"], tier="tiny")
    assert time.monotonic() - t0 < 20
    (failed,) = _output(d)["outcomes"]
    assert failed["error"] == "Sandbox.Timedout"
    assert "Task timed out after 1.00 seconds" in json.loads(failed["cause"])["errorMessage"]
    assert engine.pool.stats["timeouts"] == before["timeouts"] + 1
    assert engine.pool.stats["replaced"] == before["replaced"] + 1
    assert len(engine.pool.pids()) == engine.pool.size
    assert set(engine.pool.pids()) != pids_before
    # the pool still works
    _, d = _run(engine, workers=["ok"], tier="tiny")
    assert _output(d)["outcomes"] == [{"worker": 0, "ok": True}]


def test_task_timeout_abandons_a_straggler(engine):
    # TimeoutSecondsPath on the child task: the state times out, the invocation runs on
    _, d = _run(engine, workers=["sleep:2.5", "ok"], worker_timeout_s=1)
    failed, ok = _output(d)["outcomes"]
    assert failed["error"] == "States.Timeout"
    assert ok == {"worker": 1, "ok": True}


def test_worker_process_exit_is_runtime_exit_error(engine):
    _, d = _run(engine, workers=["exit"])
    (failed,) = _output(d)["outcomes"]
    assert failed["error"] == "Runtime.ExitError"
    assert "exit status 3" in json.loads(failed["cause"])["errorMessage"]
    assert len(engine.pool.pids()) == engine.pool.size


# ------------------------------------------------------------------------------------------
# fault injection


def _worker_calls(engine, action, times=None, worker=None):
    """A filter: `action` for worker invocations (optionally only worker i, only n times)."""
    small = engine.names[_lid(engine, "TrainSmall")]
    left = [times]
    lock = threading.Lock()

    def f(name, payload):
        if name != small or (worker is not None and payload["worker"]["i"] != worker):
            return "ok"
        with lock:
            if left[0] is not None:
                if left[0] <= 0:
                    return "ok"
                left[0] -= 1
        return action

    return f


def test_throttle_is_retried_as_lambda_too_many_requests(faults):
    engine = faults
    engine.invoke_filter = _worker_calls(engine, "throttle", times=1)
    n0 = len([c for c in engine.invocations if c[2] == "throttle"])
    arn, d = _run(engine, workers=["ok"])
    assert _output(d)["outcomes"] == [{"worker": 0, "ok": True}]
    throttles = [c for c in engine.invocations if c[2] == "throttle"]
    assert len(throttles) == n0 + 1
    # throttled for good: the Retry gives up and the Catch reports the Lambda error name
    engine.invoke_filter = _worker_calls(engine, "throttle")
    _, d = _run(engine, workers=["ok"])
    (failed,) = _output(d)["outcomes"]
    assert failed["error"] == "Lambda.TooManyRequestsException"
    assert "Rate Exceeded." in failed["cause"]


def test_throttled_payload_only_task_is_named_like_on_aws(faults):
    engine = faults
    planner = engine.names[_lid(engine, "Planner")]
    engine.invoke_filter = lambda name, payload: "throttle" if name == planner else "ok"
    arn, d = _run(engine)
    assert d["status"] == "FAILED"
    assert d["error"] == "Lambda.TooManyRequestsException"  # moto alone says "Exception"
    failed = [e for e in engine.history(arn) if e["type"] == "LambdaFunctionFailed"]
    assert failed[0]["lambdaFunctionFailedEventDetails"]["cause"] == "Rate Exceeded."


def test_fail_duplicate_and_timeout_actions(faults):
    engine = faults
    engine.invoke_filter = _worker_calls(engine, "fail", worker=0)
    _, d = _run(engine, workers=["ok", "ok"])
    assert [o.get("error") for o in _output(d)["outcomes"]] == ["InjectedFault", None]

    engine.invoke_filter = _worker_calls(engine, "duplicate")
    _, d = _run(engine, workers=["flaky:0"])
    out = _output(d)
    assert out["outcomes"] == [{"worker": 0, "ok": True}]
    (flaky,) = _items(engine, out["execution"], "FLAKY#")
    assert flaky["attempts"]["N"] == "2"  # the handler ran twice

    engine.invoke_filter = _worker_calls(engine, "timeout")
    _, d = _run(engine, workers=["ok"])
    out = _output(d)
    assert out["outcomes"][0]["error"] == "Sandbox.Timedout"
    # the handler did run: its side effects are there, as after a real late finish
    assert len(_items(engine, out["execution"], "WORKER#")) == 1


# ------------------------------------------------------------------------------------------
# limits


def test_state_payload_limit(engine):
    # a Task result over 256 KiB fails the execution
    _, d = _run(engine, plan_pad=300_000)
    assert d["status"] == "FAILED" and d["error"] == "States.DataLimitExceeded"
    # ... and States.ALL in the child's Catch does not catch it (it does in plain moto)
    # so the child fails, and a failed child fails the Distributed Map (tolerance 0), as on AWS
    arn, d = _run(engine, workers=["big:300", "ok"])
    assert d["status"] == "FAILED", d.get("output")
    assert d["error"] == "States.ExceedToleratedFailureThreshold"
    assert "1 of 2 items failed" in d["cause"]
    assert "MapRunFailed" in [e["type"] for e in engine.history(arn)]
    # just under the limit passes (the Task result includes the invoke response envelope)
    _, d = _run(engine, plan_pad=250_000)
    assert _output(d)["plan"]["pad"] == "p" * 250_000


def test_size_quota_boundary_is_inclusive():
    assert limits._is_within_size_quota("x" * limits.MAX_PAYLOAD_BYTES)
    assert not limits._is_within_size_quota("x" * (limits.MAX_PAYLOAD_BYTES + 1))
    from moto.stepfunctions.parser.asl.component.state import state

    assert state.is_within_size_quota is limits._is_within_size_quota


@pytest.mark.parametrize(
    "failed,total,count,pct,exceeds",
    [
        (0, 5, 0, 0.0, False),
        (1, 5, 0, 0.0, True),
        (2, 5, 2, 0.0, False),
        (3, 5, 2, 0.0, True),
        (1, 5, 0, 20.0, False),
        (2, 5, 0, 20.0, True),
        (2, 5, 5, 20.0, True),
    ],
)
def test_map_run_failure_threshold(failed, total, count, pct, exceeds):
    assert limits.map_run_exceeds(failed, total, count, pct) is exceeds


def test_execution_input_limit(engine):
    with pytest.raises(limits.LimitError, match="256 KiB"):
        engine.start_execution(job(pad="x" * 262_144))


def test_history_limit(engine):
    limits.set_history_limit(60)
    try:
        arn, d = _run(engine, mode="spin", spins=200)
    finally:
        limits.set_history_limit(limits.HISTORY_LIMIT)
    assert d["status"] == "FAILED"
    assert d["error"] == "States.Runtime"
    assert "maximum number of history events (60)" in d["cause"]
    assert len(engine.history(arn)) <= 62
    # under the limit the same loop succeeds
    _, d = _run(engine, mode="spin", spins=5)
    assert d["status"] == "SUCCEEDED"


def test_invoke_payload_limits(engine):
    lam = engine.client("lambda")
    small = engine.names[_lid(engine, "TrainSmall")]
    with pytest.raises(ClientError) as e:
        lam.invoke(FunctionName=small, Payload=json.dumps({"x": "y" * (6 * 1024 * 1024)}))
    assert e.value.response["Error"]["Code"] == "RequestEntityTooLargeException"
    resp = lam.invoke(
        FunctionName=small, Payload=json.dumps({"run_id": "r", "round": 0, "worker": {"i": 0, "mode": "big:6200"}})
    )
    assert resp["FunctionError"] == "Unhandled"
    assert json.load(resp["Payload"])["errorType"] == "Function.ResponseSizeTooLarge"


# ------------------------------------------------------------------------------------------
# resolution


def test_resolved_definition_equals_synthesized_modulo_names(engine):
    syn = engine.synthesized
    res = syn.template["Resources"]
    (sm_id,) = [k for k, v in res.items() if v["Type"] == "AWS::StepFunctions::StateMachine"]

    # the synthesized definition with every intrinsic replaced by a token
    def token(part):
        if isinstance(part, str):
            return part
        if "Ref" in part:
            return "@{" + part["Ref"] + "}"
        lid, attr = part["Fn::GetAtt"]
        return "@{" + lid + "." + attr + "}"

    delim, parts = res[sm_id]["Properties"]["DefinitionString"]["Fn::Join"]
    expected = json.loads(delim.join(token(p) for p in parts))

    # the engine's definition with every local name/ARN replaced by the same tokens
    r = engine.resolver
    text = json.dumps(engine.definition)
    subs = {}
    for lid in res:
        lr = r.local(lid)
        if lr.arn:
            subs[lr.arn] = "@{" + lid + ".Arn}"
        subs[lr.name] = "@{" + lid + "}"
    subs["arn:aws:"] = "arn:@{AWS::Partition}:"
    for k in sorted(subs, key=len, reverse=True):
        text = text.replace(k, subs[k])
    assert json.loads(text) == expected
    # and what moto holds is exactly that definition
    desc = engine.client("stepfunctions").describe_state_machine(stateMachineArn=engine.state_machine_arn)
    assert json.loads(desc["definition"]) == engine.definition


def test_names_are_deterministic_and_valid(engine):
    again = Resolver(engine.synthesized.template, STACK_ID).names()
    assert again == engine.names
    for lid, name in engine.names.items():
        rtype = engine.synthesized.template["Resources"][lid]["Type"]
        if rtype == "AWS::S3::Bucket":
            assert re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name), name
        if rtype == "AWS::Lambda::Function":
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name), name
    assert len(set(engine.names.values())) == len(engine.names)
    table = engine.names[_lid(engine, "Table")]
    desc = engine.client("dynamodb").describe_table(TableName=table)["Table"]
    assert {k["AttributeName"]: k["KeyType"] for k in desc["KeySchema"]} == {"pk": "HASH", "sk": "RANGE"}
    assert desc["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    versioning = engine.client("s3").get_bucket_versioning(Bucket=engine.names[_lid(engine, "ArtifactsBucket")])
    assert versioning["Status"] == "Enabled"


def test_function_env_and_context_inside_the_handler(engine):
    planner = _lid(engine, "Planner")
    env = engine.function_env(planner)
    names = engine.names
    assert env["SMLT_TABLE"] == names[_lid(engine, "Table")]
    assert env["SMLT_ARTIFACTS_BUCKET"] == names[_lid(engine, "ArtifactsBucket")]
    assert env["FIXTURE_SUB"] == "us-east-1/123456789012/aws/x"
    assert env["FIXTURE_TABLE_ARN"] == f"arn:aws:dynamodb:us-east-1:123456789012:table/{names[_lid(engine, 'Table')]}"
    assert json.loads(env["FIXTURE_TRAIN_FUNCTIONS"]) == {
        "small": names[_lid(engine, "TrainSmall")],
        "tiny": names[_lid(engine, "TrainTiny")],
    }
    assert env["AWS_ENDPOINT_URL"] == engine.endpoint_url
    assert env["SMLT_LOCAL_CONCURRENCY"] == str(engine.pool.size)
    assert env["AWS_EXECUTION_ENV"] == "AWS_Lambda_python3.11"  # the fixture's zip Runtime
    resp = engine.client("lambda").invoke(FunctionName=names[planner], Payload=json.dumps({"op": "echo"}))
    assert "FunctionError" not in resp
    seen = json.load(resp["Payload"])
    assert seen["function_name"] == names[planner]
    assert seen["memory"] == "1024"
    for k, v in env.items():
        if k.startswith(("SMLT_", "FIXTURE_", "AWS_")):
            assert seen["env"].get(k) == v, k
    # the user's code meets a Lambda's read-only files and missing /dev/shm (smlt.runtime.worker_limits.LIMITS_ENV)
    assert seen["env"].get("SMLT_LAMBDA_LIMITS") == "1"


def test_unsupported_function_answers_with_an_import_error(engine):
    node_fn = [s for s in engine.functions.values() if s.kind == "unsupported"]
    assert node_fn and "nodejs" in node_fn[0].problem
    resp = engine.client("lambda").invoke(FunctionName=node_fn[0].name, Payload=b"{}")
    assert resp["FunctionError"] == "Unhandled"
    assert json.load(resp["Payload"])["errorType"] == "Runtime.ImportModuleError"
    with pytest.raises(ClientError) as e:
        engine.client("lambda").invoke(FunctionName="no-such-function", Payload=b"{}")
    assert e.value.response["Error"]["Code"] == "ResourceNotFoundException"


def test_per_invoke_overhead(engine, capsys):
    lam = engine.client("lambda")
    name = engine.names[_lid(engine, "Planner")]
    lam.invoke(FunctionName=name, Payload=b'{"op": "echo"}')  # warm
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        lam.invoke(FunctionName=name, Payload=b'{"op": "echo"}')
    per = (time.perf_counter() - t0) / n
    with capsys.disabled():
        print(f"\n[smlt.local] timings {engine.timings}; per-invoke round trip {per * 1000:.1f} ms")
    assert per < 0.5


def test_engines_share_the_server_and_clean_up_after_themselves(engine, tmp_path):
    from smlt.local.engine import LocalEngine

    from .fixture_app import build_app

    # the same stack twice: refused, and the running engine is untouched
    with pytest.raises(RuntimeError, match="already served"):
        LocalEngine(synthesized=engine.synthesized, workers=1).start()
    # another stack alongside
    with LocalEngine(
        build_app, outdir=tmp_path / "cdk.out", workers=1, synth_context={"fixture:stack": "Other"}
    ) as other:
        assert other.endpoint_url == engine.endpoint_url
        bucket = other.names[_lid(other, "ArtifactsBucket")]
        assert bucket.startswith("other-")
        _, d = _run(other, workers=["ok"])
        out = _output(d)
        assert out["plan"]["function_name"].startswith("Other-")
        _, d = _run(engine, workers=["ok"])
        _output(d)
    names = {b["Name"] for b in engine.client("s3").list_buckets()["Buckets"]}
    assert bucket not in names
    assert engine.names[_lid(engine, "ArtifactsBucket")] in names
    _, d = _run(engine, workers=["ok"])
    assert _output(d)["outcomes"] == [{"worker": 0, "ok": True}]


# ------------------------------------------------------------------------------------------
# what the engine keeps in memory


def _moto_execution(arn):
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    for regions in stepfunctions_parser_backends.values():
        for backend in regions.values():
            for sm in backend.state_machines:
                for e in sm.executions:
                    if e.exec_arn == arn:
                        return e
    raise AssertionError(f"moto has no execution {arn}")


def _shape(events):
    """What must not change when a history is read back from the spill file: every event's id,
    parent, type and details (names and ARNs differ between two executions, so they are masked)."""
    return [
        (e["id"], e.get("previousEventId"), e["type"], sorted(k for k in e if k.endswith("EventDetails")))
        for e in events
    ]


def test_a_finished_executions_history_leaves_memory_and_reads_back_as_moto_kept_it(engine, monkeypatch):
    from smlt.local import memory

    arn, d = _run(engine, workers=["ok", "ok"], rounds=2)
    _output(d)
    kept = _moto_execution(arn)
    # out of moto's memory: the execution's thread spills it as it ends, just after the status is set
    deadline = time.monotonic() + 30
    while kept.exec_worker.env.event_manager._history_event_list and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kept.exec_worker.env.event_manager._history_event_list == []
    spilled = engine.history(arn)
    # the same execution with the spill switched off: moto's own answer, from its memory
    monkeypatch.setattr(memory, "spill_history", lambda execution: None)
    arn2, d2 = _run(engine, workers=["ok", "ok"], rounds=2)
    _output(d2)
    assert len(_moto_execution(arn2).exec_worker.env.event_manager._history_event_list) == len(spilled)
    assert _shape(spilled) == _shape(engine.history(arn2))
    assert spilled[0]["type"] == "ExecutionStarted" and spilled[-1]["type"] == "ExecutionSucceeded"
    assert json.loads(spilled[-1]["executionSucceededEventDetails"]["output"]) == json.loads(d["output"])


def test_a_history_read_while_the_execution_ends_is_whole(engine, monkeypatch):
    """The end of an execution spills its history under the event mutex; a reader that found it
    unspilled and then waited on that mutex copies the emptied list. It must read the file."""
    from smlt.local import memory

    spill = memory.spill_history
    monkeypatch.setattr(memory, "spill_history", lambda execution: None)
    arn, d = _run(engine, workers=["ok"], rounds=1)
    _output(d)
    execution = _moto_execution(arn)
    manager = execution.exec_worker.env.event_manager
    whole = manager.get_event_history()
    copy = manager.get_event_history

    def spilled_first():  # the terminating thread took the mutex first
        spill(execution)
        return copy()

    monkeypatch.setattr(manager, "get_event_history", spilled_first)
    assert _shape(engine.history(arn)) == _shape(whole) and whole


def test_s3_bodies_live_in_the_spill_file_and_read_back_whole_ranged_copied_and_overwritten(engine):
    import hashlib

    from moto.s3.models import s3_backends

    from smlt.local.memory import BODIES, SpilledBody

    bucket = engine.names[_lid(engine, "ArtifactsBucket")]
    s3 = engine.client("s3")
    body = bytes(range(256)) * 40  # 10 KiB
    before = BODIES.size
    put = s3.put_object(Bucket=bucket, Key="memtest/a", Body=body)
    assert BODIES.size - before >= len(body)  # on disk, in the spill file
    key = s3_backends["123456789012"]["aws"].buckets[bucket].keys["memtest/a"]
    assert isinstance(key._value_buffer, SpilledBody)
    assert put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    assert s3.get_object(Bucket=bucket, Key="memtest/a")["Body"].read() == body
    assert s3.get_object(Bucket=bucket, Key="memtest/a", Range="bytes=100-4195")["Body"].read() == body[100:4196]
    s3.copy_object(Bucket=bucket, Key="memtest/b", CopySource={"Bucket": bucket, "Key": "memtest/a"})
    s3.put_object(Bucket=bucket, Key="memtest/a", Body=b"shorter")
    assert s3.get_object(Bucket=bucket, Key="memtest/a")["Body"].read() == b"shorter"
    assert s3.get_object(Bucket=bucket, Key="memtest/b")["Body"].read() == body
    s3.put_object(Bucket=bucket, Key="memtest/empty", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="memtest/empty")["Body"].read() == b""
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"memtest/{k}"} for k in ("a", "b", "empty")]})
    with pytest.raises(ClientError, match="NoSuchKey"):
        s3.get_object(Bucket=bucket, Key="memtest/a")
    first = s3.list_object_versions(Bucket=bucket, Prefix="memtest/a")["Versions"][-1]  # a versioned bucket
    got = s3.get_object(Bucket=bucket, Key="memtest/a", VersionId=first["VersionId"])["Body"].read()
    assert got in (body, b"shorter") and first["Size"] == len(got)
