"""Unit tests of the local engine's parts that need no moto server or CDK synth."""

import json
import textwrap
import time
import uuid

import pytest

from smlt.local import limits, patches
from smlt.local.errors import MotoVersionError
from smlt.local.functions import _dockerfile_cmd
from smlt.local.invoke import parse_function_name
from smlt.local.pool import WorkerPool
from smlt.local.resolve import Resolver, UnresolvableError, bucket_name


def _template(**resources):
    return {
        "Parameters": {
            "Stage": {"Type": "String", "Default": "dev"},
            "BootstrapVersion": {
                "Type": "AWS::SSM::Parameter::Value<String>",
                "Default": "/cdk-bootstrap/hnb659fds/version",
            },
        },
        "Resources": {
            "Bucket83908E77": {"Type": "AWS::S3::Bucket"},
            "Fn9270CBC0": {"Type": "AWS::Lambda::Function", "Properties": {}},
            "Named": {
                "Type": "AWS::DynamoDB::Table",
                "Properties": {"TableName": {"Fn::Sub": "t-${Stage}-${AWS::Region}"}},
            },
            **resources,
        },
    }


def test_refs_atts_joins_and_subs():
    r = Resolver(_template(), "Smlt")
    assert r.resolve({"Ref": "Bucket83908E77"}) == "smlt-bucket83908e77"
    assert r.resolve({"Ref": "Fn9270CBC0"}) == "Smlt-Fn9270CBC0"
    assert (
        r.resolve({"Fn::GetAtt": ["Fn9270CBC0", "Arn"]})
        == "arn:aws:lambda:us-east-1:123456789012:function:Smlt-Fn9270CBC0"
    )
    assert r.resolve({"Fn::GetAtt": "Bucket83908E77.Arn"}) == "arn:aws:s3:::smlt-bucket83908e77"
    assert r.resolve({"Ref": "Named"}) == "t-dev-us-east-1"
    assert (
        r.resolve(
            {"Fn::Join": ["/", [{"Ref": "AWS::Partition"}, {"Ref": "AWS::URLSuffix"}, {"Ref": "AWS::AccountId"}]]}
        )
        == "aws/amazonaws.com/123456789012"
    )
    assert r.resolve(
        {"Fn::Sub": ["${Fn9270CBC0.Arn}|${X}|${!Literal}|${Bucket83908E77}", {"X": {"Ref": "Stage"}}]}
    ) == ("arn:aws:lambda:us-east-1:123456789012:function:Smlt-Fn9270CBC0|dev|${Literal}|smlt-bucket83908e77")
    # plain structures pass through, nested intrinsics resolve
    assert r.resolve({"a": [1, {"Ref": "AWS::Region"}], "b": None}) == {"a": [1, "us-east-1"], "b": None}


@pytest.mark.parametrize(
    "value,match",
    [
        ({"Fn::If": ["C", 1, 2]}, "Fn::If is not supported"),
        ({"Fn::GetAZs": ""}, "Fn::GetAZs is not supported"),
        ({"Fn::ImportValue": "x"}, "Fn::ImportValue"),
        ({"Ref": "Missing"}, "no resource 'Missing'"),
        ({"Ref": "BootstrapVersion"}, "no local value"),
        ({"Ref": "AWS::NotificationARNs"}, "unsupported pseudo parameter"),
        ({"Fn::GetAtt": ["Fn9270CBC0", "SnapStartResponse"]}, "not supported locally"),
    ],
)
def test_anything_else_raises_with_its_location(value, match):
    r = Resolver(_template(), "Smlt")
    with pytest.raises(UnresolvableError, match=match) as e:
        r.resolve({"Outer": {"Inner": value}}, where="Here")
    assert "Here.Outer.Inner" in str(e.value) or "Missing" in str(e.value)


def test_names_fit_service_rules_and_are_deterministic():
    long_id = "A" * 40 + "VeryLongLogicalIdForAResourceThatGoesOnAndOn1234ABCD"
    t = _template(
        **{
            long_id: {"Type": "AWS::S3::Bucket"},
            "F" + long_id: {"Type": "AWS::Lambda::Function"},
            "Sm" + long_id * 2: {"Type": "AWS::StepFunctions::StateMachine"},
        }
    )
    names = Resolver(t, "SmltStackWithALongName").names()
    assert names == Resolver(t, "SmltStackWithALongName").names()
    b = names[long_id]
    assert 3 <= len(b) <= 63 and b == b.lower() and b[0].isalnum() and b[-1].isalnum()
    assert len(names["F" + long_id]) <= 64
    assert len(names["Sm" + long_id * 2]) <= 80
    assert bucket_name("S", "X") == "s-x"
    assert len(set(names.values())) == len(names)


def test_definition_substitutions_and_jsonata_refusal():
    sm = {
        "Type": "AWS::StepFunctions::StateMachine",
        "Properties": {
            "DefinitionString": '{"StartAt":"A","States":{"A":{"Type":"Task","Resource":"${Fn}","End":true}}}',
            "DefinitionSubstitutions": {"Fn": {"Fn::GetAtt": ["Fn9270CBC0", "Arn"]}},
            "RoleArn": {"Fn::GetAtt": ["Role", "Arn"]},
        },
    }
    t = _template(Sm=sm, Role={"Type": "AWS::IAM::Role"})
    r = Resolver(t, "Smlt")
    d = r.definition()
    assert d["States"]["A"]["Resource"] == "arn:aws:lambda:us-east-1:123456789012:function:Smlt-Fn9270CBC0"
    assert r.role_arn() == "arn:aws:iam::123456789012:role/Smlt-Role"
    sm2 = {
        "Type": "AWS::StepFunctions::StateMachine",
        "Properties": {
            "Definition": {"QueryLanguage": "JSONata", "StartAt": "A", "States": {"A": {"Type": "Pass", "End": True}}}
        },
    }
    with pytest.raises(UnresolvableError, match="JSONata"):
        Resolver(_template(Sm=sm2), "Smlt").definition()
    with pytest.raises(UnresolvableError, match="2 state machines"):
        Resolver(_template(Sm=sm, Sm2=sm2), "Smlt").definition()


@pytest.mark.parametrize(
    "url,expected",
    [
        ("http://localhost:5/2015-03-31/functions/my-fn/invocations", ("my-fn", None)),
        (
            "http://localhost:5/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A123456789012"
            "%3Afunction%3Amy-fn/invocations",
            ("my-fn", None),
        ),
        (
            "http://localhost:5/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A123456789012"
            "%3Afunction%3Amy-fn%3Aprod/invocations",
            ("my-fn", "prod"),
        ),
        ("http://localhost:5/2015-03-31/functions/123456789012%3Afunction%3Amy-fn/invocations", ("my-fn", None)),
        ("http://localhost:5/2015-03-31/functions/my-fn/invocations?Qualifier=3", ("my-fn", "3")),
    ],
)
def test_parse_function_name(url, expected):
    assert parse_function_name(url) == expected


def test_tolerated_failure_percentage_parses_in_moto():
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    from smlt.local.engine import definition_for_moto

    d = {
        "StartAt": "M",
        "States": {
            "M": {
                "Type": "Map",
                "ToleratedFailurePercentage": 10,
                "ToleratedFailureCount": 2,
                "End": True,
                "ItemProcessor": {
                    "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                    "StartAt": "P",
                    "States": {"P": {"Type": "Pass", "End": True}},
                },
            }
        },
    }
    text = definition_for_moto(d)
    assert json.loads(text) == d
    assert '"ToleratedFailurePercentage": 10.0' in text and '"ToleratedFailureCount": 2' in text
    AmazonStateLanguageParser.parse(text)


def test_dockerfile_cmd(tmp_path):
    (tmp_path / "Dockerfile").write_text('FROM x\nCMD ["a.b.handler"]\n')
    assert _dockerfile_cmd(tmp_path, None) == "a.b.handler"
    (tmp_path / "Other").write_text("FROM x\nCMD a.c.handler\n")
    assert _dockerfile_cmd(tmp_path, "Other") == "a.c.handler"


def test_payload_helpers():
    assert limits.payload_size({"a": "é"}) == len('{"a":"é"}'.encode())
    assert limits.check_input({"a": 1}) == '{"a":1}'
    with pytest.raises(limits.LimitError):
        limits.check_input("x" * (limits.MAX_PAYLOAD_BYTES + 1))


def test_install_refuses_another_moto_version(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(patches, "_installed", set())
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(MotoVersionError, match="found moto 9.9.9"):
        patches.install()


@pytest.mark.parametrize(
    "version, ok", [("5.2.0", True), ("5.2.5", True), ("5.2.11", True), ("5.1.9", False), ("5.3.0", False)]
)
def test_supported_moto_range(version, ok):
    if ok:
        patches.check_version(version)
    else:
        with pytest.raises(MotoVersionError, match=f"found moto {version}"):
            patches.check_version(version)


def test_patches_named_in_smlt_local_without_are_left_out(monkeypatch):
    monkeypatch.setenv("SMLT_LOCAL_WITHOUT", "payload-boundary, table-query")
    names = {p.name for p in patches.selected(speedups=True)}
    assert names == {p.name for p in patches.PATCHES} - {"payload-boundary", "table-query"}
    monkeypatch.setenv("SMLT_LOCAL_WITHOUT", "no-such-patch")
    with pytest.raises(ValueError, match="SMLT_LOCAL_WITHOUT names no patch: no-such-patch"):
        patches.selected()


def test_speedups_off_keeps_the_correctness_and_memory_patches(monkeypatch):
    monkeypatch.setenv("SMLT_LOCAL_SPEEDUPS", "0")
    kinds = {p.kind for p in patches.selected()}
    assert kinds == {"correctness", "memory"}
    assert {p.name for p in patches.selected(speedups=True)} == {p.name for p in patches.PATCHES}


# ------------------------------------------------------------------------------------------
# the worker pool on its own


HANDLER = textwrap.dedent("""
    import os, time

    class Nope(Exception):
        pass

    LOADED_WITH = os.environ.get("MARK")

    def handler(event, context):
        if event.get("raise"):
            raise Nope("no " + event["raise"])
        if event.get("sleep"):
            time.sleep(event["sleep"])
        return {"mark": os.environ.get("MARK"), "other": os.environ.get("OTHER"),
                "loaded_with": LOADED_WITH, "pid": os.getpid(),
                "remaining_ms": context.get_remaining_time_in_millis(),
                "memory": context.memory_limit_in_mb}
""")


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1) as p:
        yield p


def _job(path, name="fn", **payload):
    return {
        "function": name,
        "arn": f"arn:aws:lambda:us-east-1:123456789012:function:{name}",
        "memory": 256,
        "module_file": str(path),
        "module_name": "handler",
        "attr": "handler",
        "payload": json.dumps(payload).encode(),
        "env": {"MARK": name},
        "request_id": str(uuid.uuid4()),
    }


def test_pool_runs_handlers_with_exactly_the_job_environment(pool, tmp_path):
    path = tmp_path / "handler.py"
    path.write_text(HANDLER)
    job = _job(path, "one")
    job["env"]["OTHER"] = "x"
    out = pool.run(job, timeout=10)
    assert out.ok
    first = json.loads(out.payload)
    assert first["mark"] == "one" and first["other"] == "x" and first["memory"] == "256"
    assert 0 < first["remaining_ms"] <= 10_000
    # a second function in the same worker: its own module instance, no leftover variables
    second = json.loads(pool.run(_job(path, "two"), timeout=10).payload)
    assert second == {**second, "mark": "two", "other": None, "loaded_with": "two"}
    assert second["pid"] == first["pid"]
    # warm: the first function's module was kept
    again = json.loads(pool.run(_job(path, "one"), timeout=10).payload)
    assert again["loaded_with"] == "one"


def test_pool_errors_and_timeouts(pool, tmp_path):
    path = tmp_path / "handler.py"
    path.write_text(HANDLER)
    out = pool.run(_job(path, **{"raise": "way"}), timeout=10)
    assert not out.ok and out.error_type == "Nope"
    err = json.loads(out.payload)
    assert err["errorMessage"] == "no way" and err["stackTrace"]
    assert not any("smlt/local/pool.py" in line for line in err["stackTrace"])

    pid = pool.pids()
    out = pool.run(_job(path, sleep=5), timeout=0.5)
    assert out.error_type == "Sandbox.Timedout" and out.seconds < 3
    assert pool.pids() != pid and len(pool.pids()) == 1

    missing = _job(tmp_path / "nope.py")
    out = pool.run(missing, timeout=10)
    assert out.error_type == "Runtime.ImportModuleError"
    bad_attr = _job(path)
    bad_attr["attr"] = "nothing"
    assert pool.run(bad_attr, timeout=10).error_type == "Runtime.HandlerNotFound"


def test_spawn_start_method_works_too(tmp_path):
    path = tmp_path / "handler.py"
    path.write_text(HANDLER)
    with WorkerPool(1, start_method="spawn") as p:
        out = p.run(_job(path, "spawned"), timeout=30)
    assert out.ok and json.loads(out.payload)["mark"] == "spawned"
    with pytest.raises(ValueError, match="never 'fork'"):
        WorkerPool(1, start_method="fork")


def test_the_seam_is_registered_once_per_session_through_the_event_api(monkeypatch):
    import boto3
    import botocore.handlers

    from smlt.local import invoke

    builtin = list(botocore.handlers.BUILTIN_HANDLERS)
    own = boto3.session.Session()
    for session in (None, None, own, own):  # twice each: a second registration is a no-op
        invoke.install(session)
    assert botocore.handlers.BUILTIN_HANDLERS == builtin  # botocore's module list is left alone
    calls = []

    class Probe:
        url = "http://localhost:1/2015-03-31/functions/x/invocations"

    router = type(
        "R",
        (),
        {
            "functions": {"x": None},
            "owns": lambda self, url: True,
            "handle": lambda self, req: calls.append(req) or "answer",
        },
    )()
    monkeypatch.setattr(invoke, "_routers", [router])
    for session in (own, boto3.DEFAULT_SESSION):
        calls.clear()
        responses = session.events.emit(invoke.EVENT, request=Probe())
        assert [r for _, r in responses if r is not None] == ["answer"]
        assert len(calls) == 1
    # a client made from the default session, as moto's interpreter makes its Lambda client, asks the seam
    client = boto3.client("lambda", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    calls.clear()
    assert client.meta.events.emit_until_response(invoke.EVENT, request=Probe())[1] == "answer"
    calls.clear()  # a session made elsewhere is not touched (no process-wide list is changed)
    assert all(r is None for _, r in boto3.session.Session().events.emit(invoke.EVENT, request=Probe()))
    assert not calls


# ------------------------------------------------------------------------------------------
# the trigger's EventBridge replay (moto's matcher, our renderer)


def test_trigger_rule_pattern_with_motos_matcher():
    from smlt.local.eventbridge import matches, object_created_event

    pattern = {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {"bucket": {"name": ["data"]}, "object": {"key": [{"wildcard": "incoming/*/*/manifest.json"}]}},
    }
    assert matches(pattern, object_created_event("data", "incoming/digits/v2/manifest.json", 2, "e"))
    assert matches(pattern, object_created_event("data", "incoming/digits/2026/11/manifest.json", 2, "e"))
    assert not matches(pattern, object_created_event("data", "incoming/digits/job.json", 2, "e"))
    assert not matches(pattern, object_created_event("other", "incoming/digits/v2/manifest.json", 2, "e"))
    event = object_created_event("data", "incoming/digits/v2/manifest.json", 2, "e")
    assert not matches(pattern, {**event, "source": "aws.s3x"})
    assert not matches(pattern, {**event, "detail-type": "Object Deleted"})


def test_target_input_renders_strings_as_json_where_cdk_leaves_placeholders_unquoted():
    from smlt.local.eventbridge import object_created_event, render_target_input

    event = object_created_event("data", "incoming/p/v1/manifest.json", 2, "e1")
    target = {
        "InputTransformer": {
            "InputPathsMap": {
                "detail-bucket-name": "$.detail.bucket.name",
                "detail-object-size": "$.detail.object.size",
            },
            "InputTemplate": '{"bucket":<detail-bucket-name>,"size":<detail-object-size>,"text":"<detail-bucket-name>"}',
        }
    }
    assert json.loads(render_target_input(target, event)) == {"bucket": "data", "size": 2, "text": "data"}
    assert json.loads(render_target_input({"InputPath": "$.detail.bucket"}, event)) == {"name": "data"}
    assert render_target_input({"Input": '{"a":1}'}, event) == '{"a":1}'


# ------------------------------------------------------------------------------------------
# the spill file (finished executions' histories)


def test_spill_file_reads_back_what_was_put_until_reset():
    from smlt.local.memory import SpillFile

    spill = SpillFile()
    first, second = spill.put(b"abc"), spill.put(b"\x00" * 5000)
    assert spill.get(second) == b"\x00" * 5000 and spill.get(first) == b"abc"
    assert spill.size == 5003
    spill.reset()
    with pytest.raises(LookupError, match="reset"):
        spill.get(first)
    assert spill.get(spill.put(b"again")) == b"again"
    spill.reset()


def test_spilled_body_is_the_file_like_object_moto_uses():
    import os

    from smlt.local.memory import SpilledBody

    body = SpilledBody()
    assert body.read() == b""
    body.seek(0)
    body.truncate()
    assert body.write(b"hello world") == 11
    assert body.seek(0, os.SEEK_END) == 11 and body.tell() == 11
    body.seek(6)
    assert body.read(3) == b"wor" and body.read() == b"ld" and body.read() == b""
    body.seek(0)
    assert body.read(100) == b"hello world"
    body.seek(6)
    body.write(b"WORLD!")  # not how moto writes: the body is rewritten
    body.seek(0)
    assert body.read() == b"hello WORLD!"
    body.seek(0)
    body.truncate()
    body.write(b"new")
    body.seek(0)
    assert body.read() == b"new"
    body.close()
    with pytest.raises(ValueError, match="closed file"):
        body.read()


def test_an_invocations_output_goes_to_the_file_named_whole_or_capped(tmp_path, capfd, monkeypatch):
    """`job["output"]`: stdout and stderr (the descriptors: a C extension's writes too) appended
    under a line naming the invocation, at most OUTPUT_KEPT bytes of it; nothing printed, nothing
    written; without it the worker's own descriptors, as before."""
    import os
    import sys

    from smlt.local import pool

    # as in a worker process: sys.stdout and sys.stderr write to descriptors 1 and 2
    monkeypatch.setattr(sys, "stdout", open(1, "w", closefd=False))  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", open(2, "w", closefd=False))  # noqa: SIM115

    log = tmp_path / "f.log"
    job = {"function": "Fn", "request_id": "r1"}
    with pool._output_to(str(log), job):
        print("from python", flush=True)
        sys.stderr.write("to stderr\n")
        sys.stderr.flush()
        os.write(1, b"from the descriptor")  # no newline: the log adds one
    assert capfd.readouterr() == ("", "")
    lines = log.read_text().splitlines()
    assert lines[0].startswith("--- Fn r1 (") and lines[1:] == ["from python", "to stderr", "from the descriptor"]

    with pool._output_to(str(log), {"function": "Fn", "request_id": "r2"}):
        pass
    assert len(log.read_text().splitlines()) == 4  # nothing printed: no line for it

    with pool._output_to(str(log), {"function": "Fn", "request_id": "r3"}):
        sys.stdout.write("x" * (pool.OUTPUT_KEPT + 1000))
    tail = log.read_bytes().split(b"--- Fn r3")[1]
    assert tail.count(b"x") == pool.OUTPUT_KEPT
    assert tail.endswith(b"\n... 1,000 more bytes of this invocation left out\n")

    with pool._output_to(None, job):
        print("to the terminal", flush=True)
    assert capfd.readouterr().out == "to the terminal\n"


def test_a_worker_whose_engine_is_gone_ends_quietly(tmp_path):
    """The engine's process killed (SIGKILL, or a SIGTERM before it was a Ctrl-C) while a handler
    runs: the worker finishes it, finds the pipe closed, and ends with exit code 0 (it used to end
    with a BrokenPipeError traceback on the terminal, exit code 1)."""
    path = tmp_path / "handler.py"
    path.write_text(HANDLER)
    p = WorkerPool(1).start()
    try:
        (w,) = p._workers.values()
        job = {**_job(path, sleep=0.5), "deadline_epoch": time.time() + 10}
        w.conn.send(job)
        w.conn.close()  # the engine's end of the pipe, as its process dying closes it
        w.proc.join(timeout=30)
        assert w.proc.exitcode == 0
    finally:
        p._closed = True
        p._workers.clear()
