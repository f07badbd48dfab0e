"""cdk.json `notify_topic_arn`: the planner (which runs Finalize: the gate's decisions) and the
Prepare function (a refused upload) get the team's topic in their environment and may publish
there, nowhere else; without it, no function has either."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from cdk_nag import AwsSolutionsChecks

from infra.stacks.settings import Settings
from tests.infra.conftest import synthesize

TOPIC = "arn:aws:sns:eu-west-1:111122223333:ml-team"
VARIABLE = "SMLT_NOTIFY_TOPIC_ARN"


@pytest.fixture(scope="module")
def notify_synth(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("cdk-out-notify"), {"notify_topic_arn": TOPIC})


def _sns_grants(synth):
    """(policy logical id, action, resource) of every sns: action any policy grants."""
    for lid, pol in synth.resources("AWS::IAM::Policy").items():
        for st in pol["Properties"]["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            for action in actions:
                if action.startswith("sns:"):
                    yield lid, action, st["Resource"]


NOTIFYING = ("FunctionsPlanner", "FunctionsPrepare")


def test_the_planner_and_prepare_alone_get_the_topic_and_may_publish_there_only(notify_synth):
    told = set()
    for lid, fn in notify_synth.resources("AWS::Lambda::Function").items():
        env = fn["Properties"]["Environment"]["Variables"]
        assert env.get(VARIABLE) == (TOPIC if lid.startswith(NOTIFYING) else None), lid
        told |= {lid} if VARIABLE in env else set()
    assert len(told) == 2
    grants = list(_sns_grants(notify_synth))
    assert [(g[1], g[2]) for g in grants] == [("sns:Publish", TOPIC)] * 2
    assert sorted(g[0].split("Role")[0] for g in grants) == ["FunctionsPlanner", "FunctionsPrepare"]
    report = AwsSolutionsChecks().validate_scope(notify_synth.app)  # the synth ran it too
    assert report.success and not report.violations


def test_without_a_topic_no_function_has_one(synth):
    assert not list(_sns_grants(synth))
    for fn in synth.resources("AWS::Lambda::Function").values():
        assert VARIABLE not in fn["Properties"]["Environment"]["Variables"]


@pytest.mark.parametrize(
    "value", ["ml-team", "arn:aws:sqs:eu-west-1:111122223333:q", "arn:aws:sns:eu-west-1:1:t", f"{TOPIC}.fifo"]
)
def test_a_value_that_is_not_a_topic_arn_is_named(value):
    app = cdk.App(context={"notify_topic_arn": value})
    with pytest.raises(ValueError, match=r"context 'notify_topic_arn': a standard SNS topic's ARN"):
        Settings.from_context(app)
