"""The CLI user's own IAM: a command or `smlt doctor` whose credentials may not make a call says
who was refused, the IAM action and the resource, and what grants it (docs/deploy.md, "What the
CLI's user needs"); doctor reports what it could not check and checks the rest."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

USER = "arn:aws:iam::111122223333:user/ana"
SM = "arn:aws:states:eu-west-1:111122223333:stateMachine:Smlt-Workflow"


def _refusal(action: str, resource: str) -> str:
    return (
        f"User: {USER} is not authorized to perform: {action} on resource: {resource} because no "
        f"identity-based policy allows the {action} action"
    )


def _client(service: str, *answers):
    """A client answering (method, response) or (method, code, status, message) in order."""
    client = boto3.client(service, region_name="eu-west-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    for method, *rest in answers:
        if len(rest) == 1:
            stub.add_response(method, rest[0])
        else:
            code, status, message = rest
            stub.add_client_error(method, service_error_code=code, http_status_code=status, service_message=message)
    stub.activate()
    return client


def test_a_refused_start_reaching_the_command_line_names_the_user_the_action_and_the_state_machine(monkeypatch, capsys):
    import smlt.cli.cloud
    from smlt import cloud
    from smlt.cli import main

    refused = _client(
        "stepfunctions", ("start_execution", "AccessDeniedException", 400, _refusal("states:StartExecution", SM))
    )
    stack = cloud.Stack(state_machine_arn=SM, data_bucket="d", artifacts_bucket="a", table="t")

    def start(args):  # `smlt start` past its job checks, at its StartExecution
        refused.start_execution(stateMachineArn=stack.state_machine_arn, name="r", input="{}")

    monkeypatch.setattr(smlt.cli.cloud, "start", start)
    assert main(["start", "job.json"]) == 1
    assert capsys.readouterr().err == (
        f"error: AWS refused StartExecution (AccessDeniedException): {USER} may not states:StartExecution on {SM} "
        "(because no identity-based policy allows the states:StartExecution action): allow it in that user's "
        "or role's IAM policy, or use a profile that may (AWS_PROFILE) (docs/deploy.md, \"What the CLI's user needs\")\n"
    )


def test_a_stack_the_credentials_may_not_describe_is_access_denied_not_not_found():
    from smlt import cloud
    from smlt.runtime.errors import AccessDenied

    arn = "arn:aws:cloudformation:eu-west-1:111122223333:stack/Smlt/*"
    cfn = _client(
        "cloudformation", ("describe_stacks", "AccessDenied", 403, _refusal("cloudformation:DescribeStacks", arn))
    )
    with pytest.raises(AccessDenied) as e:
        cloud.Stack.lookup("Smlt", cfn=cfn)
    assert f"{USER} may not cloudformation:DescribeStacks on {arn}" in str(e.value)
    assert "not found" not in str(e.value) and "deploy it" not in str(e.value)


def test_doctor_says_what_it_could_not_check_and_checks_the_rest():
    from smlt.cli.doctor import check

    planner = "Smlt-FunctionsPlanner1"
    stack = {
        "StackResources": [
            {
                "LogicalResourceId": "FunctionsPlannerABC",
                "PhysicalResourceId": planner,
                "ResourceType": "AWS::Lambda::Function",
                "Timestamp": "2026-12-01T00:00:00Z",
                "ResourceStatus": "CREATE_COMPLETE",
            }
        ]
    }
    env = {"Environment": {"Variables": {"SMLT_TRAIN_FUNCTIONS": json.dumps({"1769": "a", "3008": "b"})}}}
    # no lambda:GetAccountSettings: the stack's tiers are read, the limits are said to be unknown
    lam = _client(
        "lambda",
        ("get_account_settings", "AccessDeniedException", 403, _refusal("lambda:GetAccountSettings", "*")),
        ("get_function_configuration", env),
    )
    lines, ok = check("Smlt", lam=lam, cfn=_client("cloudformation", ("describe_stack_resources", stack)))
    assert lines[0].startswith(
        f"not checked: the account's Lambda concurrency: AWS refused GetAccountSettings (AccessDeniedException): "
        f"{USER} may not lambda:GetAccountSettings on *"
    )
    assert lines[1] == "stack 'Smlt': tiers [1769, 3008] MB, max_concurrency 64"
    assert "the account's limits are not known" in lines[2] and ok
    # no lambda:GetFunctionConfiguration on the planner: the limits are checked against cdk.json's tiers
    limits = {"AccountLimit": {"ConcurrentExecutions": 10, "UnreservedConcurrentExecutions": 10}}
    fn_arn = f"arn:aws:lambda:eu-west-1:111122223333:function:{planner}"
    lam = _client(
        "lambda",
        ("get_account_settings", limits),
        (
            "get_function_configuration",
            "AccessDeniedException",
            403,
            _refusal("lambda:GetFunctionConfiguration", fn_arn),
        ),
    )
    lines, ok = check("Smlt", lam=lam, cfn=_client("cloudformation", ("describe_stack_resources", stack)))
    text = "\n".join(lines)
    assert "10 per account in this region" in text and "at most 10 workers at once" in text
    assert (
        "not checked: stack 'Smlt''s deployed tiers and max_concurrency: AWS refused GetFunctionConfiguration" in text
    )
    assert f"may not lambda:GetFunctionConfiguration on {fn_arn}" in text
    assert "checking against what cdk.json deploys: tiers [1769, 3008], max_concurrency 64" in text


def _wrong_region(code: str, status: int, meta: dict, headers: dict | None = None):
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_client_error(
        "get_object",
        service_error_code=code,
        http_status_code=status,
        service_message="wrong region",
        service_error_meta=meta,
        response_meta={"HTTPHeaders": headers or {}},
    )
    stub.activate()
    return client


@pytest.mark.parametrize(
    ("code", "status", "meta", "headers"),
    [
        ("PermanentRedirect", 301, {"Endpoint": "team-data.s3.eu-west-1.amazonaws.com"}, None),
        ("AuthorizationHeaderMalformed", 400, {"Region": "eu-west-1"}, None),
        ("301", 301, {}, {"x-amz-bucket-region": "eu-west-1"}),
    ],
)
def test_a_dataset_bucket_in_another_region_is_named_with_its_region_and_the_fix(
    monkeypatch, code, status, meta, headers
):
    """botocore follows S3's redirect to the bucket's region; an answer it could not follow (a
    second redirect, an endpoint of one's own) says where the bucket is and what to do, in a
    function (DataError: the run is not retried) and for the CLI's pre-check."""
    from smlt.aws_errors import user_get
    from smlt.runtime.errors import DataError, InvalidDataset
    from smlt.runtime.store import S3Store

    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "Smlt-TrainStep1769")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with pytest.raises(DataError) as e:
        S3Store("team-data", "ds/", client=_wrong_region(code, status, meta, headers)).get("manifest.json")
    assert str(e.value).startswith(
        f"s3://team-data/ds/manifest.json: the bucket is in eu-west-1, not us-east-1 (S3 answered {code}): copy "
        "the dataset into a bucket in us-east-1"
    )
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME")
    store = S3Store("team-data", "ds/", client=_wrong_region(code, status, meta, headers))
    with pytest.raises(InvalidDataset) as e:
        user_get(store, "manifest.json", "dataset.uri", InvalidDataset)
    assert str(e.value).startswith(
        f"dataset.uri: s3://team-data is in eu-west-1, not us-east-1 (S3 answered {code} reading "
        "s3://team-data/ds/manifest.json): copy the dataset into a bucket in the stack's region"
    )
    # any other command's S3 call that meets it (a fetch, an upload): one line, the bucket's region
    from botocore.exceptions import ClientError

    from smlt.aws_errors import cli_message

    with pytest.raises(ClientError) as raw:
        _wrong_region(code, status, meta, headers).get_object(Bucket="team-data", Key="k")
    assert cli_message(raw.value).startswith(
        f"AWS refused GetObject: {code}: the bucket is in eu-west-1: set AWS_REGION"
    )
