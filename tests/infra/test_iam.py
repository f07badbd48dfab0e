"""IAM scoping: no wildcard actions, no `Resource: "*"` except for actions AWS cannot scope."""

from __future__ import annotations

from infra.stacks.nag import _flatten
from tests.infra.conftest import DEFAULT_TIERS

# Actions that only accept Resource "*" (AWS requirement), and why they are here.
STAR_RESOURCE_ACTIONS = {
    # Lambda and Step Functions active tracing
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    # Step Functions logging to CloudWatch Logs (vended log delivery)
    "logs:CreateLogDelivery",
    "logs:GetLogDelivery",
    "logs:UpdateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:DescribeResourcePolicies",
    "logs:DescribeLogGroups",
    # the planner reads the account's Lambda concurrency limit (account-level)
    "lambda:GetAccountSettings",
}


def _as_list(x):
    return x if isinstance(x, list) else [x]


def _statements(synth):
    for lid, pol in synth.resources("AWS::IAM::Policy").items():
        roles = [r["Ref"] for r in pol["Properties"].get("Roles", [])]
        for st in pol["Properties"]["PolicyDocument"]["Statement"]:
            yield lid, roles, st


def _grants(synth, role_prefix):
    """{action: {flattened resource}} of all Allow statements attached to the role."""
    out: dict[str, set[str]] = {}
    for _, roles, st in _statements(synth):
        if not any(r.startswith(role_prefix) for r in roles) or st["Effect"] != "Allow":
            continue
        for a in _as_list(st["Action"]):
            out.setdefault(a, set()).update(_flatten(r) for r in _as_list(st["Resource"]))
    return out


def test_no_wildcard_actions(synth):
    for lid, _, st in _statements(synth):
        for action in _as_list(st["Action"]):
            assert action != "*" and not action.endswith(":*"), (lid, action)
            assert "*" not in action, f"{lid}: wildcard action {action}"


def test_star_resource_only_where_aws_requires_it(synth):
    for lid, _, st in _statements(synth):
        if "*" in _as_list(st["Resource"]):
            extra = set(_as_list(st["Action"])) - STAR_RESOURCE_ACTIONS
            assert not extra, f"{lid}: Resource '*' for {sorted(extra)}"


def test_roles_have_no_managed_or_inline_policies(synth):
    for lid, role in synth.resources("AWS::IAM::Role").items():
        assert "ManagedPolicyArns" not in role["Properties"], lid
        assert "Policies" not in role["Properties"], lid


def test_one_role_per_function_trusting_lambda_only(synth):
    fn_roles = [fn["Properties"]["Role"]["Fn::GetAtt"][0] for fn in synth.resources("AWS::Lambda::Function").values()]
    # planner, aggregate, prepare, study controller, the tiers
    assert len(set(fn_roles)) == len(fn_roles) == 4 + len(DEFAULT_TIERS)
    for rid in fn_roles:
        doc = synth.template["Resources"][rid]["Properties"]["AssumeRolePolicyDocument"]
        (st,) = doc["Statement"]
        assert st["Principal"] == {"Service": "lambda.amazonaws.com"}


def _ids(synth, type_, prefix):
    return [k for k in synth.resources(type_) if k.startswith(prefix)]


def test_function_roles_are_scoped(synth):
    (data,) = _ids(synth, "AWS::S3::Bucket", "StorageData")
    (artifacts,) = _ids(synth, "AWS::S3::Bucket", "StorageArtifacts")
    (table,) = _ids(synth, "AWS::DynamoDB::Table", "Runs")
    # the patterns are the key functions' (smlt.runtime.keys) applied to "*"
    runs, pipelines = f"<{artifacts}.Arn>/runs/*/*", f"<{artifacts}.Arn>/pipelines/*/latest.json"
    study_best = f"<{artifacts}.Arn>/studies/*/best/*"
    records = {f"<{artifacts}.Arn>/pipelines/*/{k}/*" for k in ("versions", "promotions", "replaced")}
    data_objects = f"<{data}.Arn>/*"

    planner = _grants(synth, "FunctionsPlannerRole")
    assert planner["s3:GetObject"] == {data_objects, runs, pipelines, study_best, *records}
    assert planner["s3:PutObject"] == {runs, pipelines, *records}
    assert planner["lambda:GetAccountSettings"] == {"*"}
    assert planner["dynamodb:PutItem"] == {f"<{table}.Arn>"}
    sm_ids = [k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Workflow")]
    assert planner["states:StartExecution"] == {f"<{sm_ids[0]}>"}  # Chain
    # ...and DescribeExecution of its own executions only (is an existing continuation alive?)
    (described,) = planner["states:DescribeExecution"]
    assert described == f"arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:<{sm_ids[0]}.Name>:*"

    for tier in DEFAULT_TIERS:
        worker = _grants(synth, f"FunctionsTrainStep{tier}Role")
        rounds = f"<{artifacts}.Arn>/runs/*/rounds/*"
        assert worker["s3:GetObject"] == {data_objects, rounds, f"<{artifacts}.Arn>/code/*.zip"}
        assert worker["s3:PutObject"] == {rounds}
        assert worker["s3:PutObjectTagging"] == {rounds}
        assert worker["dynamodb:UpdateItem"] == {f"<{table}.Arn>"}
        assert not any(a.startswith(("states:", "lambda:")) for a in worker)

    aggregate = _grants(synth, "FunctionsAggregateRole")
    assert aggregate["s3:GetObject"] == {runs}
    assert aggregate["s3:PutObject"] == {runs}
    assert not any(a.startswith(("states:", "lambda:")) for a in aggregate)

    # Prepare reads raw uploads under incoming/ and writes only prepared/ and a pipeline's
    # feature spec: no object of the artifacts bucket, nothing else of the data bucket.
    prepare = _grants(synth, "FunctionsPrepareRole")
    incoming, prepared = f"<{data}.Arn>/incoming/*", f"<{data}.Arn>/prepared/*"
    assert prepare["s3:GetObject"] == {incoming, prepared}
    assert prepare["s3:PutObject"] == {prepared, f"<{data}.Arn>/incoming/*/features.json"}
    assert prepare["s3:DeleteObject"] == {prepared}
    assert prepare["s3:ListBucket"] == {f"<{data}.Arn>"}
    # the uploads into a version's folder still in progress when its marker lands, waited for
    assert prepare["s3:ListBucketMultipartUploads"] == {f"<{data}.Arn>"}
    assert not any(a.startswith(("states:", "lambda:")) for a in prepare)
    listing = [
        st
        for _, roles, st in _statements(synth)
        if any(r.startswith("FunctionsPrepareRole") for r in roles) and st["Action"] == "s3:ListBucket"
    ]
    assert [st["Condition"] for st in listing] == [{"StringLike": {"s3:prefix": ["incoming/*", "prepared/*"]}}]

    # DynamoDB: item actions on the one table, nothing table-level
    for prefix in (
        "FunctionsPlannerRole",
        "FunctionsAggregateRole",
        "FunctionsTrainStep1769Role",
        "FunctionsPrepareRole",
    ):
        g = _grants(synth, prefix)
        ddb = {a for a in g if a.startswith("dynamodb:")}
        assert ddb and not ddb & {
            "dynamodb:DeleteTable",
            "dynamodb:CreateTable",
            "dynamodb:Scan",
            "dynamodb:UpdateTable",
        }
        assert all(g[a] == {f"<{table}.Arn>"} for a in ddb)


def test_state_machine_invokes_exactly_its_functions(synth):
    g = _grants(synth, "WorkflowStateMachineRole")
    fns = [lid for lid in synth.resources("AWS::Lambda::Function") if not lid.startswith("StudyController")]
    unqualified = {f"<{lid}.Arn>" for lid in fns}
    invoke = g.pop("lambda:InvokeFunction")
    # plus the versions/aliases of planner/aggregate (added by CDK's LambdaInvoke)
    assert invoke - unqualified == {
        f"<{lid}.Arn>:*"
        for lid in fns
        if lid.startswith(("FunctionsPlanner", "FunctionsAggregate", "FunctionsPrepare"))
    }
    assert unqualified <= invoke
    sm_id = next(k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Workflow"))
    # Distributed Map: start/describe/stop/redrive only its own executions
    assert g.pop("states:StartExecution") == {f"<{sm_id}>"}
    for action in ("states:DescribeExecution", "states:StopExecution", "states:RedriveExecution"):
        (res,) = g.pop(action)
        assert f'"Ref":"{sm_id}"' in res and ":execution:" in res
    assert set(g) <= STAR_RESOURCE_ACTIONS


def test_trigger_role_starts_only_the_state_machine(synth):
    g = _grants(synth, "WorkflowStateMachineEventsRole")
    sm_id = next(k for k in synth.resources("AWS::StepFunctions::StateMachine") if k.startswith("Workflow"))
    assert g == {"states:StartExecution": {f"<{sm_id}>"}}
