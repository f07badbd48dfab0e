"""cdk-nag (AwsSolutions): zero unacknowledged findings; every acknowledgment has a reason."""

from __future__ import annotations

import re

import aws_cdk as cdk
import pytest
from aws_cdk import Validations
from cdk_nag import AwsSolutionsChecks

from infra.stacks.nag import REASONS, WILDCARD_ALLOWLIST

ACK_KEY = Validations.ACKNOWLEDGED_RULES_METADATA_KEY


def _acknowledgments(app):
    out = []
    for c in app.node.find_all():
        for entry in c.node.metadata:
            if entry.type == ACK_KEY:
                for rule, reason in (entry.data or {}).items():
                    out.append((c.node.path, re.sub(r"^annotation::", "", rule, flags=re.I), reason))
    return out


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
            assert any(re.match(p, finding) for p, _ in WILDCARD_ALLOWLIST), (path, rule)
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


def test_nag_runs_in_build_app_and_fails_synth(tmp_path):
    """The pack is wired the same way build_app wires it: an unacknowledged finding fails synth."""
    from aws_cdk import aws_sqs as sqs

    app = cdk.App(outdir=str(tmp_path), builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Bad")
    sqs.Queue(stack, "Plain")  # no SSL enforcement, no DLQ
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(Exception, match="AwsSolutions-SQS"):
        app.synth()
