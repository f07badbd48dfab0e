"""`cdk deploy` after `cdk destroy`: no retained resource with a fixed name is left to clash
with the next create (AlreadyExists), and docs/deploy.md lists exactly what is kept."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The property that names a resource, for the types that take an explicit name.
NAME_PROPERTY = {
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::S3::Bucket": "BucketName",
    "AWS::DynamoDB::Table": "TableName",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::IAM::Role": "RoleName",
    "AWS::StepFunctions::StateMachine": "StateMachineName",
    "AWS::CloudWatch::Dashboard": "DashboardName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::ElastiCache::ServerlessCache": "ServerlessCacheName",
    "AWS::ElastiCache::ReplicationGroup": "ReplicationGroupId",
}


def retained(template):
    return {
        lid: res
        for lid, res in template["Resources"].items()
        if res.get("DeletionPolicy", "Delete") in ("Retain", "RetainExceptOnCreate")
    }


def fixed_names(template):
    """Retained resources whose explicit name does not change with the stack instance."""
    out = {}
    for lid, res in retained(template).items():
        prop = NAME_PROPERTY.get(res["Type"])
        name = (res.get("Properties") or {}).get(prop) if prop else None
        if name is not None and "AWS::StackId" not in json.dumps(name):
            out[lid] = name
    return out


def test_no_retained_resource_has_a_fixed_name(synth, redis_synth):
    for s in (synth, redis_synth):
        assert fixed_names(s.template) == {}


def test_the_check_catches_a_fixed_name(synth):
    template = json.loads(json.dumps(synth.template))
    lid = next(
        k for k, r in template["Resources"].items() if r["Type"] == "AWS::Logs::LogGroup" and k in retained(template)
    )
    template["Resources"][lid]["Properties"]["LogGroupName"] = "/aws/vendedlogs/states/Smlt-training"
    assert list(fixed_names(template)) == [lid]


def test_the_state_machines_log_groups_are_named_per_stack_instance(synth):
    groups = [
        r["Properties"]["LogGroupName"]
        for r in synth.resources("AWS::Logs::LogGroup").values()
        if "LogGroupName" in r.get("Properties", {})
    ]
    assert len(groups) == 2  # the training machine's and the study's
    for name in groups:
        text = json.dumps(name)
        assert "/aws/vendedlogs/states/" in text and "AWS::StackId" in text


def _kept_in_docs():
    """The logical-id prefixes docs/deploy.md's "Destroy" table lists as kept."""
    text = (ROOT / "docs/deploy.md").read_text()
    section = text.split("## Destroy", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| [^|]+ \| `(\w+)`", section, re.M))


def test_docs_list_exactly_what_is_kept(synth):
    kept = _kept_in_docs()
    ids = set(retained(synth.template))
    # every retained resource is listed (its logical id starts with a listed prefix) ...
    assert {lid for lid in ids if not any(lid.startswith(p) for p in kept)} == set()
    # ... and every listed prefix is a retained resource (no stale row)
    assert {p for p in kept if not any(lid.startswith(p) for lid in ids)} == set()
