"""cdk-nag (AwsSolutions): zero unacknowledged findings; every acknowledgment has a reason."""

from __future__ import annotations

import re

import aws_cdk as cdk
import pytest
from aws_cdk import Stack, Validations
from aws_cdk import aws_iam as iam
from cdk_nag import AwsSolutionsChecks

from infra.stacks.nag import (
    REASONS,
    STAR,
    STAR_RESOURCE_ACTIONS,
    WILDCARD_ALLOWLIST,
    acknowledge_allowed_wildcards,
    star_actions,
)
from tests.infra.test_iam import STAR_RESOURCE_ACTIONS as AWS_STAR_ONLY

ACK_KEY = Validations.ACKNOWLEDGED_RULES_METADATA_KEY


def _acknowledgments(app):
    out = []
    for c in app.node.find_all():
        for entry in c.node.metadata:
            if entry.type == ACK_KEY:
                for rule, reason in (entry.data or {}).items():
                    out.append((c.node.path, re.sub(r"^annotation::", "", rule, flags=re.I), reason))
    return out


def _policy_document(app, path: str) -> dict:
    (policy,) = [c for c in app.node.find_all() if c.node.path == path]
    return Stack.of(policy).resolve(policy.policy_document)


def expected_wildcard(app, path: str, finding: str, reason: str) -> bool:
    """An IAM5 acknowledgment is expected: a scoped wildcard of the allowlist, or `Resource::*`
    on a policy that grants only actions AWS cannot scope, with a reason naming each of them."""
    if finding != STAR:
        return any(re.match(p, finding) for p, _ in WILDCARD_ALLOWLIST)
    actions = star_actions(_policy_document(app, path))
    return bool(actions) and set(actions) <= set(STAR_RESOURCE_ACTIONS) and all(a in reason for a in actions)


def test_no_unacknowledged_findings(synth):
    # The synth itself would have failed on a finding; re-run the pack on the tree to be explicit.
    report = AwsSolutionsChecks().validate_scope(synth.app)
    findings = [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations]
    assert findings == []
    assert report.success


def test_every_acknowledgment_has_a_reason_and_is_expected(synth):
    acks = _acknowledgments(synth.app)
    assert acks, "expected the documented acknowledgments"
    for path, rule, reason in acks:
        assert isinstance(reason, str) and len(reason.strip()) >= 20, (path, rule)
        if rule.startswith("AwsSolutions-IAM5["):
            finding = rule[len("AwsSolutions-IAM5[") : -1]
            assert expected_wildcard(synth.app, path, finding, reason), (path, rule, reason)
        else:
            assert rule in REASONS, (path, rule)
    rules = {r for _, r, _ in acks}
    # No blanket acknowledgments: IAM5 always per finding, and never on the stack or app.
    assert "AwsSolutions-IAM5" not in rules
    assert all(p.count("/") >= 1 for p, _, _ in acks)


def test_wildcard_acknowledgments_are_narrow(synth):
    acked = {f for findings in synth.stack.acknowledged_wildcards.values() for f in findings}
    assert acked, "the stack has expected wildcard findings (X-Ray, runs/*)"
    for f in acked:
        # Only Resource wildcards; never a wildcard action.
        assert f.startswith("Resource::"), f


def test_star_actions_are_those_aws_cannot_scope():
    """The allowlist's actions on `*`: tracing and vended logs (test_iam's list), and the two ENI
    describes Lambda needs in the exchange's VPC (redis_reducer)."""
    assert set(STAR_RESOURCE_ACTIONS) == AWS_STAR_ONLY | {"ec2:DescribeNetworkInterfaces", "ec2:DescribeSubnets"}


def _role_with(tmp_path, *statements: iam.PolicyStatement) -> cdk.App:
    app = cdk.App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Grants")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    for st in statements:
        role.add_to_principal_policy(st)
    acknowledge_allowed_wildcards(stack)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


TRACING = iam.PolicyStatement(actions=["xray:PutTraceSegments", "xray:PutTelemetryRecords"], resources=["*"])


def test_resource_star_is_acknowledged_for_exactly_the_actions_that_need_it(tmp_path):
    app = _role_with(tmp_path, TRACING)
    app.synth()  # acknowledged
    ((path, rule, reason),) = [a for a in _acknowledgments(app) if a[1].startswith("AwsSolutions-IAM5")]
    assert rule == f"AwsSolutions-IAM5[{STAR}]" and path == "Grants/Role/DefaultPolicy/Resource"
    assert "xray:PutTelemetryRecords, xray:PutTraceSegments (X-Ray active tracing" in reason
    assert "logs:" not in reason and "ec2:" not in reason  # names only what this policy grants


def test_a_new_star_grant_fails_the_synth(tmp_path):
    """Any other action on `*` (here s3:GetObject, next to the tracing actions) is not acknowledged."""
    app = _role_with(tmp_path, TRACING, iam.PolicyStatement(actions=["s3:GetObject"], resources=["*"]))
    with pytest.raises(Exception, match=re.escape("AwsSolutions-IAM5[Resource::*]")):
        app.synth()


def test_nag_runs_in_build_app_and_fails_synth(tmp_path):
    """The pack is wired the same way build_app wires it: an unacknowledged finding fails synth."""
    from aws_cdk import aws_sqs as sqs

    app = cdk.App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Bad")
    sqs.Queue(stack, "Plain")  # no SSL enforcement, no DLQ
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(Exception, match="AwsSolutions-SQS"):
        app.synth()
