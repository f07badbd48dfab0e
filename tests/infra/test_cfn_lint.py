"""cfn-lint on the synthesized template, and on the resolved state-machine definition.

CDK templates only give W3005 (DependsOn next to a GetAtt that already implies it). The
definition is a JSON string inside Fn::Join in the real template, which cfn-lint cannot look
into; resolved with placeholder ARNs and embedded as a `Definition` object in a minimal template,
cfn-lint's Step Functions rules (ASL schema, states, Next targets) check it.
"""

from __future__ import annotations

import json

import pytest

from tests.infra import asl

ALLOWED_WARNINGS = {"W3005"}


def _lint(template: dict) -> list:
    from cfnlint.api import ManualArgs, lint

    return lint(json.dumps(template), config=ManualArgs(regions=["us-east-1"]))


def _describe(matches) -> list[str]:
    return [f"{m.rule.id} {'/'.join(map(str, getattr(m, 'path', []) or []))}: {m.message}" for m in matches]


@pytest.fixture(scope="module")
def template_matches(synth):
    return _lint(synth.template)


def test_template_has_no_cfn_lint_errors(template_matches):
    errors = [m for m in template_matches if m.rule.id.startswith("E")]
    assert _describe(errors) == []


def test_template_has_only_expected_warnings(template_matches):
    unexpected = [m for m in template_matches if m.rule.id.startswith("W") and m.rule.id not in ALLOWED_WARNINGS]
    assert _describe(unexpected) == []


def _definition_template(definition: dict) -> dict:
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Resources": {
            "Machine": {
                "Type": "AWS::StepFunctions::StateMachine",
                "Properties": {
                    "StateMachineType": "STANDARD",
                    "RoleArn": f"arn:aws:iam::{asl.ACCOUNT}:role/placeholder",
                    "Definition": definition,
                },
            }
        },
    }


def test_resolved_definition_passes_cfn_lint(synth):
    matches = _lint(_definition_template(asl.definition(synth.template)))
    assert _describe([m for m in matches if m.rule.id[0] in "EW"]) == []


def test_cfn_lint_checks_definitions_at_all():
    """Guard: the embedded-definition trick must make cfn-lint look at the ASL."""
    broken = {"StartAt": "A", "States": {"A": {"Type": "Task", "Resource": 42, "Next": "Nowhere"}}}
    matches = _lint(_definition_template(broken))
    assert any(m.rule.id.startswith("E") for m in matches), _describe(matches)
