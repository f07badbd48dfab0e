"""Every call a synthesized state machine makes is granted to its role: each Task's Lambda
function (a plan's `$.function_name` may name any train tier the planner is given), each
startExecution (with the `.sync` pattern's describe/stop and its managed EventBridge rule), each
Distributed Map's child executions and any ItemReader/ResultWriter object. The requests are
derived from the definition and evaluated against the role's policies as IAM does (the local
engine's evaluator, smlt/local/iam_record.py), so a Task added without its grant fails here
rather than on AWS (States.TaskFailed: Lambda.AWSLambdaException ... not authorized)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from smlt.local.iam_record import Request, allows, role_statements
from smlt.local.resolve import ACCOUNT, FUNCTION, REGION, STATE_MACHINE, Resolver
from tests.infra.conftest import LARGE_TIERS, synthesize

STATES = f"arn:aws:states:{REGION}:{ACCOUNT}"
SYNC_RULE = f"arn:aws:events:{REGION}:{ACCOUNT}:rule/StepFunctionsGetEventsForStepFunctionsExecutionRule"


def _states(scope: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, st in scope["States"].items():
        yield name, st
        for key in ("ItemProcessor", "Iterator"):
            if key in st:
                yield from _states(st[key])
        for branch in st.get("Branches", []):
            yield from _states(branch)


def _function_arn(name: str) -> str:
    return name if name.startswith("arn:") else f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"


def _train_functions(resolver: Resolver) -> list[str]:
    """The functions a plan may name (`$.function_name`): the planner's SMLT_TRAIN_FUNCTIONS."""
    for lid in resolver.of_type(FUNCTION):
        env = resolver.resources[lid]["Properties"].get("Environment", {}).get("Variables", {})
        if "SMLT_TRAIN_FUNCTIONS" in env:
            names = json.loads(resolver.resolve(env["SMLT_TRAIN_FUNCTIONS"], lid))
            return [_function_arn(n) for n in names.values()]
    raise AssertionError("no function has SMLT_TRAIN_FUNCTIONS")


def _task_requests(st: dict[str, Any], trains: list[str]) -> list[Request]:
    res, params = st["Resource"], st.get("Parameters", {})
    if res.startswith("arn:aws:lambda:"):
        return [Request("lambda:InvokeFunction", res)]
    if res.split(".")[0] == "arn:aws:states:::lambda:invoke":
        if "FunctionName" in params:
            return [Request("lambda:InvokeFunction", _function_arn(params["FunctionName"]))]
        assert params.get("FunctionName.$") == "$.function_name", params  # chosen by the plan only
        return [Request("lambda:InvokeFunction", arn) for arn in trains]
    if res.startswith("arn:aws:states:::states:startExecution"):
        child = params["StateMachineArn"]
        out = [Request("states:StartExecution", child)]
        if ".sync" in res:  # Step Functions watches the child and stops it with the parent
            execution = child.replace(":stateMachine:", ":execution:") + ":child-0001"
            out += [Request("states:DescribeExecution", execution), Request("states:StopExecution", execution)]
            out += [Request(f"events:{a}", SYNC_RULE) for a in ("PutTargets", "PutRule", "DescribeRule")]
        return out
    raise AssertionError(f"a Task resource this test does not map to IAM yet: {res} (add it here)")


def _map_requests(st: dict[str, Any], own_arn: str) -> list[Request]:
    out: list[Request] = []
    if st.get("ItemProcessor", {}).get("ProcessorConfig", {}).get("Mode") == "DISTRIBUTED":
        # What AWS documents a Distributed Map's role needs ("IAM policies for using Distributed
        # Map states", docs.aws.amazon.com/step-functions/latest/dg/iam-policies-eg-dist-map.html):
        # StartExecution on the state machine, DescribeExecution/StopExecution on execution:NAME:*.
        execution = own_arn.replace(":stateMachine:", ":execution:") + ":0a1b2c3d-run"
        out += [Request("states:StartExecution", own_arn)]
        out += [Request(f"states:{a}", execution) for a in ("DescribeExecution", "StopExecution")]
    reader, writer = st.get("ItemReader"), st.get("ResultWriter")
    if reader:
        p = reader.get("Parameters", {})
        if reader["Resource"].endswith("s3:listObjectsV2"):
            out.append(Request("s3:ListBucket", f"arn:aws:s3:::{p['Bucket']}"))
        else:
            out.append(Request("s3:GetObject", f"arn:aws:s3:::{p['Bucket']}/{p['Key']}"))
    if writer:
        p = writer.get("Parameters", {})
        out.append(Request("s3:PutObject", f"arn:aws:s3:::{p['Bucket']}/{p.get('Prefix', '')}x/manifest.json"))
    return out


def required(resolver: Resolver, lid: str) -> list[tuple[str, Request]]:
    """(state, request) for every call the state machine `lid` makes with its role."""
    trains = _train_functions(resolver)
    own = resolver.local(lid).arn or ""
    out: list[tuple[str, Request]] = []
    for name, st in _states(resolver.definition(lid)):
        if st["Type"] == "Task":
            out += [(name, r) for r in _task_requests(st, trains)]
        if st["Type"] == "Map":
            out += [(name, r) for r in _map_requests(st, own)]
    return out


def _machines(synth) -> list[tuple[str, list[dict[str, Any]], list[tuple[str, Request]]]]:
    resolver = Resolver(synth.template, synth.stack.stack_name)
    by_role = role_statements(synth.template, resolver)
    out = []
    for lid in resolver.of_type(STATE_MACHINE):
        role = synth.template["Resources"][lid]["Properties"]["RoleArn"]["Fn::GetAtt"][0]
        out.append((lid, by_role.get(role, []), required(resolver, lid)))
    return out


def _denied(statements, reqs) -> list[str]:
    return [f"{state}: {r.action} on {r.resource}" for state, r in reqs if not allows(statements, r)]


@pytest.fixture(scope="module")
def large_synth(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("cdk-large-tiers"), {"memory_tiers": list(LARGE_TIERS)})


@pytest.mark.parametrize("which", ["synth", "large_synth"])
def test_every_call_of_each_state_machine_is_granted_to_its_role(which, request):
    synth = request.getfixturevalue(which)
    machines = _machines(synth)
    assert {lid.split("StateMachine")[0] for lid, _, _ in machines} == {"Workflow", "Study"}
    for lid, statements, reqs in machines:
        assert not _denied(statements, reqs), lid
    (workflow,) = [reqs for lid, _, reqs in machines if lid.startswith("Workflow")]
    invoked = {r.resource for _, r in workflow if r.action == "lambda:InvokeFunction"}
    trains = [lid for lid in synth.resources("AWS::Lambda::Function") if lid.startswith("FunctionsTrainStep")]
    assert len(invoked) == len(trains) + 3  # every tier, the planner, the aggregator, Prepare
    assert any(r.action == "states:StartExecution" for _, r in workflow)  # its Distributed Maps


def test_a_removed_grant_is_named_by_state_and_resource(synth):
    (workflow,) = [m for m in _machines(synth) if m[0].startswith("Workflow")]
    (study,) = [m for m in _machines(synth) if m[0].startswith("Study")]
    tier = next(r.resource for s, r in workflow[2] if s == "TrainWorker" and "TrainStep3008" in r.resource)

    def without(statements, action, part):
        out = []
        for s in statements:
            actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
            resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
            if action in actions:
                rest = [r for r in resources if part not in str(r)]
                out += [{**s, "Resource": rest}] if rest else []
                out += [{**s, "Action": [a for a in actions if a != action]}] if len(actions) > 1 else []
            else:
                out.append(s)
        return out

    denied = _denied(without(workflow[1], "lambda:InvokeFunction", tier), workflow[2])
    assert denied and all(d.startswith(("TrainWorker:", "TrainWorkerDistributed:")) and tier in d for d in denied)
    denied = _denied(without(study[1], "events:PutRule", "StepFunctionsGetEvents"), study[2])
    assert denied == [f"RunTrial: events:PutRule on {SYNC_RULE}"]
