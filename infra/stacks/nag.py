"""cdk-nag acknowledgments, in one place, each with its reason.

cdk-nag 3 runs as a CDK validation plugin (`Validations.of(app).add_plugins(AwsSolutionsChecks())`)
and fails the synth on any finding that is not acknowledged with
`Validations.of(construct).acknowledge(Acknowledgment(id=..., reason=...))`. Wildcard findings
(AwsSolutions-IAM5) are acknowledged one by one (`AwsSolutions-IAM5[Resource::...]`, cdk-nag's
`appliesTo` form): the policies of the stack are scanned here and only the findings that match
WILDCARD_ALLOWLIST, or `Resource::*` for exactly the STAR_RESOURCE_ACTIONS a policy grants, are
acknowledged, so any new wildcard fails the synth until it is justified below.
"""

from __future__ import annotations

import re
from typing import Any

from aws_cdk import Acknowledgment, CfnResource, Stack, Validations
from aws_cdk import aws_iam as iam
from constructs import IConstruct

# The actions that support no resource-level permissions (AWS authorizes them only on Resource
# "*") and that the stack grants, with what needs them. A `Resource::*` finding is acknowledged
# only on a policy whose every `*`-resource statement grants nothing but these, with a reason
# naming exactly the actions that policy grants: any other action on `*` fails the synth.
STAR_RESOURCE_ACTIONS: dict[str, str] = {
    **dict.fromkeys(
        ["xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules", "xray:GetSamplingTargets"],
        "X-Ray active tracing of the functions and the state machine",
    ),
    **dict.fromkeys(
        [
            "logs:CreateLogDelivery",
            "logs:GetLogDelivery",
            "logs:UpdateLogDelivery",
            "logs:DeleteLogDelivery",
            "logs:ListLogDeliveries",
            "logs:PutResourcePolicy",
            "logs:DescribeResourcePolicies",
            "logs:DescribeLogGroups",
        ],
        "the state machine's vended logs to CloudWatch Logs",
    ),
    "lambda:GetAccountSettings": "the planner reads the account's Lambda concurrency limit at each run's first "
    "plan (an account-level read)",
    **dict.fromkeys(
        ["ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets"],
        "redis_reducer only: Lambda managing the VPC network interfaces of the functions in the exchange's VPC",
    ),
}
STAR = "Resource::*"

# (finding regex, reason) for the scoped wildcards. Findings are cdk-nag's flattened form:
# `Resource::<LogicalId.Arn>/runs/*`.
WILDCARD_ALLOWLIST: list[tuple[str, str]] = [
    (
        r"^Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/\*$",
        "redis_reducer only: Lambda creates, deletes and re-addresses the VPC network interfaces of the "
        "functions in the exchange's VPC with the execution role; interface ids are made at run time "
        "(CreateNetworkInterface is also scoped to the VPC's subnets and the functions' security group).",
    ),
    (
        r"^Resource::<\w*Artifacts\w*\.Arn>/(runs/\*/\*|runs/\*/rounds/\*|runs/\*/final/\*|pipelines/\*/latest\.json|pipelines/\*/(versions|promotions|replaced)/\*)$",
        "Objects under the run prefix runs/ (and, for the planner, pipelines/: the champion and the "
        "gate's version and promotion records, and versions' replaced records) of the artifacts bucket; keys are per run/round/worker "
        "or per pipeline and version and not known at deploy time.",
    ),
    (
        r"^Resource::<\w*Artifacts\w*\.Arn>/studies/\*/(\*|best/\*)$",
        "The study controller's objects under studies/ of the artifacts bucket (a study's file and its best "
        "model), and the planner's read of studies/*/best/* (a study's trials warm-start from another "
        "study's best model); study ids are chosen by users at run time.",
    ),
    (
        r"^Resource::<\w*Artifacts\w*\.Arn>/code/\*\.zip$",
        "Read-only access of the train functions to users' code under code/ of the artifacts bucket "
        "(`--code`, smlt/runtime/usercode.py); keys are content digests, made at run time.",
    ),
    (
        r"^Resource::<\w*Data\w*\.Arn>/\*$",
        "Read-only access to dataset objects of the stack's own data bucket; dataset names are chosen "
        "by users at run time.",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:s3:::[a-z0-9][a-z0-9.-]+[a-z0-9]/\S*\*$",
        "Read-only access to the objects of the user's own dataset buckets (or folders of them) named in cdk "
        "context data_buckets; dataset names are chosen by users at run time.",
    ),
    (
        r"^Resource::<\w*Data\w*\.Arn>/(incoming/\*|prepared/\*|incoming/\*/features\.json)$",
        "The Prepare function: it reads raw uploads under incoming/ of the data bucket and writes what it "
        "prepares under prepared/ and the pipeline's feature spec (incoming/<pipeline>/features.json); "
        "pipeline and version names are chosen by users at run time.",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:"
        r'\{"Fn::Select":\[6,\{"Fn::Split":\[":",\{"Ref":"\w*StateMachine\w*"\}\]\}\]\}(/\*)?:\*$',
        "Distributed Map: the state machine describes, stops and redrives the child executions it starts "
        "(execution names are generated at run time; the ARN is scoped to this state machine's name).",
    ),
    (
        r"^Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:<\w*StateMachine\w*\.Name>:\*$",
        "Chain: the planner describes an execution of this state machine that has the chained name "
        "already (is it running, or did it fail?); execution names are per run and round.",
    ),
    (
        r"^Resource::<\w*(Planner|Aggregate|Prepare|StudyController)\w*\.Arn>:\*$",
        "lambda:InvokeFunction on versions/aliases of the stack's own planner/aggregate/prepare/study controller "
        "functions "
        "(added by the CDK LambdaInvoke task next to the unqualified ARN).",
    ),
]

# Rule-level acknowledgments (no wildcard finding): (rule id, reason), applied by the constructs.
REASONS = {
    "AwsSolutions-S1": "This is the server access log bucket of the data and artifacts buckets; "
    "logging it into itself would recurse.",
    "AwsSolutions-L1": "Pinned runtime: the layer's compiled wheels (numpy, pydantic-core) are built for this "
    "exact Python version, which the train_step image also uses; bump it together with layers/.",
    "AwsSolutions-SQS3": "This queue is the dead-letter queue of the upload trigger's EventBridge target.",
    "AwsSolutions-AEC4": "The exchange holds only transient per-step gradients of the current round (deleted "
    "after it; models, records and checkpoints are in S3 and DynamoDB). One node halves the cost; if it "
    "fails, the round's workers fail, the round is retried (quorum retry) or the run resumed once "
    "ElastiCache has replaced the node.",
    "AwsSolutions-AEC6": "No AUTH token: a static token would sit in plain text in the functions' "
    "SMLT_EXCHANGE_URL. Access is confined by the network instead: isolated subnets without internet "
    "route, and a security group admitting only the smlt functions' security group on the cache port; "
    "traffic is TLS (mode required) and the data encrypted at rest.",
}


def acknowledge(construct: IConstruct, rule_id: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=rule_id, reason=REASONS[rule_id]))


def _flatten(node: Any) -> str:
    """cdk-nag's flattenCfnReference: intrinsics to `<LogicalId.Attr>` strings."""
    if node is None:
        return ""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if isinstance(node, dict):
        if "Fn::Join" in node:
            delimiter, items = node["Fn::Join"]
            return delimiter.join(_flatten(i) for i in items)
        if "Fn::Sub" in node:
            return _flatten(node["Fn::Sub"])
        if "Fn::GetAtt" in node:
            res, attr = node["Fn::GetAtt"]
            return f"<{_flatten(res)}.{_flatten(attr)}>"
        if "Fn::ImportValue" in node:
            return _flatten(node["Fn::ImportValue"])
        if "Ref" in node:
            return f"<{_flatten(node['Ref'])}>"
    import json

    return json.dumps(node, separators=(",", ":"))


def wildcard_findings(document: dict[str, Any]) -> list[str]:
    """The IAM5 findings cdk-nag reports for one resolved policy document."""
    found: list[str] = []
    for st in document.get("Statement", []):
        if st.get("Effect") != "Allow":
            continue
        actions = st.get("Action", [])
        for a in actions if isinstance(actions, list) else [actions]:
            if "*" in a:
                found.append(f"Action::{a}")
        resources = st.get("Resource", [])
        for r in resources if isinstance(resources, list) else [resources]:
            flat = _flatten(r)
            if "*" in flat:
                found.append(f"Resource::{flat}")
    return list(dict.fromkeys(found))


def star_actions(document: dict[str, Any]) -> list[str]:
    """The actions a policy document allows on Resource "*", sorted."""
    found: set[str] = set()
    for st in document.get("Statement", []):
        resources = st.get("Resource", [])
        if st.get("Effect") == "Allow" and "*" in (resources if isinstance(resources, list) else [resources]):
            actions = st.get("Action", [])
            found.update(actions if isinstance(actions, list) else [actions])
    return sorted(found)


def star_reason(actions: list[str]) -> str | None:
    """The reason of a `Resource::*` acknowledgment naming exactly `actions`, or None when one of
    them can be scoped to a resource (then the finding stands)."""
    if not actions or any(a not in STAR_RESOURCE_ACTIONS for a in actions):
        return None
    by_purpose: dict[str, list[str]] = {}
    for a in actions:
        by_purpose.setdefault(STAR_RESOURCE_ACTIONS[a], []).append(a)
    return "Resource::* only for actions that support no resource-level permissions: " + "; ".join(
        f"{', '.join(names)} ({purpose})" for purpose, names in by_purpose.items()
    )


def _reason(finding: str, document: dict[str, Any]) -> str | None:
    if finding == STAR:
        return star_reason(star_actions(document))
    return next((reason for pattern, reason in WILDCARD_ALLOWLIST if re.match(pattern, finding)), None)


def acknowledge_allowed_wildcards(stack: Stack) -> dict[str, list[str]]:
    """Acknowledge the allowed IAM5 findings on every IAM policy of the stack.

    Returns {construct path: [acknowledged finding]} (for tests and review)."""
    done: dict[str, list[str]] = {}
    for c in stack.node.find_all():
        if not (isinstance(c, iam.CfnPolicy) and CfnResource.is_cfn_resource(c)):
            continue
        document = stack.resolve(c.policy_document)
        acked = []
        for finding in wildcard_findings(document):
            reason = _reason(finding, document)
            if reason is not None:
                Validations.of(c).acknowledge(Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason))
                acked.append(finding)
        if acked:
            done[c.node.path] = acked
    return done
