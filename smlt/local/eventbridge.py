"""The stack's upload trigger on the local engine: what S3 and EventBridge do on AWS.

moto's S3 does not emit "Object Created" events to EventBridge, and moto's EventBridge cannot
start a Step Functions execution. So this module builds the event S3 would send, matches it
against every ``AWS::Events::Rule`` of the synthesized template with moto's own EventBridge
pattern matcher (``moto.events.models.EventPattern``), renders each matching target's input and
starts the target state machine. The rule is the stack's own: change it in CDK and the local
trigger changes with it.

The input is rendered here, not by moto's ``EventTemplateParser``: moto inserts a string value
at an unquoted placeholder (``"bucket": <detail-bucket-name>``, the form CDK's
``RuleTargetInput.fromObject`` writes) without quotes, which is not JSON, and it requires an
``ingestion-time`` field S3's events do not carry. AWS inserts the value as JSON there.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from smlt.runtime import keys
from smlt.runtime.progress import notice


def object_created_event(bucket: str, key: str, size: int, etag: str) -> dict[str, Any]:
    """The event S3 sends to EventBridge (the fields smlt and its rule use)."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": "123456789012",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": "us-east-1",
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {
            "version": "0",
            "bucket": {"name": bucket},
            "object": {"key": key, "size": size, "etag": etag, "sequencer": f"{time.time_ns():X}"},
            "request-id": uuid.uuid4().hex[:16],
            "requester": "123456789012",
            "reason": "PutObject",
        },
    }


def matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """EventBridge's pattern matching, as moto implements it."""
    from moto.events.models import EventPattern

    message: Any = event  # moto types it as its own TypedDict of the PutEvents fields
    return bool(EventPattern.load(json.dumps(pattern)).matches_event(message))


def _path(event: dict[str, Any], path: str) -> Any:
    value: Any = event
    for part in path.removeprefix("$").strip(".").split("."):
        if part:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def render_target_input(target: dict[str, Any], event: dict[str, Any]) -> str:
    """The input EventBridge would send this target (Input, InputPath or InputTransformer)."""
    if "Input" in target:
        return str(target["Input"])
    if "InputPath" in target:
        return json.dumps(_path(event, target["InputPath"]))
    tr = target.get("InputTransformer")
    if not tr:
        return json.dumps(event)
    values = {name: _path(event, path) for name, path in tr.get("InputPathsMap", {}).items()}

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name == "aws.events.event.json":
            return json.dumps(event)
        v = values.get(name)
        if m.group(1) and m.group(3):  # "<name>" inside quotes: the raw string
            return json.dumps(v if isinstance(v, str) else json.dumps(v))
        return json.dumps(v)

    return re.sub(r'("?)<([\w.-]+)>("?)', sub, str(tr["InputTemplate"]))


def deliver(engine: Any, event: dict[str, Any]) -> list[str]:
    """Start every state machine whose enabled rule matches the event; returns the execution ARNs."""
    template, resolver = engine.synthesized.template, engine.resolver
    arns = []
    for lid, res in template["Resources"].items():
        if res["Type"] != "AWS::Events::Rule":
            continue
        props = resolver.resolve(res["Properties"], f"Resources.{lid}")
        if props.get("State", "ENABLED") != "ENABLED" or not matches(props.get("EventPattern", {}), event):
            continue
        for target in props.get("Targets", []):
            if ":states:" in target["Arn"] and ":stateMachine:" in target["Arn"]:
                sfn = engine.client("stepfunctions")
                # EventBridge names the execution itself (a fresh id): it cannot be deterministic.
                arns.append(
                    sfn.start_execution(
                        stateMachineArn=target["Arn"], name=str(uuid.uuid4()), input=render_target_input(target, event)
                    )["executionArn"]
                )
    return arns


class UploadTrigger:
    """S3 → EventBridge for the data bucket: each object new since the last poll (or uploaded
    again: a new ETag or LastModified) is sent as an "Object Created" event to the stack's rules
    (:func:`deliver`), which start a retraining run for `incoming/*/*/manifest.json` and
    `incoming/*/*/_SUCCESS` and ignore the rest."""

    def __init__(self, engine: Any, bucket: str) -> None:
        self.engine, self.bucket = engine, bucket
        self.seen: dict[str, tuple[str, str]] = {}
        self.sent: dict[str, dict[str, Any]] = {}  # the last event sent per key (to deliver it again in tests)

    def _listing(self) -> dict[str, tuple[str, int, str]]:
        found: dict[str, tuple[str, int, str]] = {}
        s3 = self.engine.client("s3")
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            found.update(
                {
                    o["Key"]: (o["ETag"].strip('"'), int(o["Size"]), o["LastModified"].isoformat())
                    for o in page.get("Contents", [])
                }
            )
        return found

    def prime(self) -> None:
        """What is already there (restored state) fires nothing."""
        self.seen = {k: (etag, at) for k, (etag, _, at) in self._listing().items()}

    def poll(self) -> list[str]:
        started: list[str] = []
        for key, (etag, size, at) in sorted(self._listing().items()):
            if self.seen.get(key) == (etag, at):
                continue
            self.seen[key] = (etag, at)
            self.sent[key] = event = object_created_event(self.bucket, key, size, etag)
            for arn in deliver(self.engine, event):
                notice.info(f"s3://{self.bucket}/{key}: started execution {arn.rsplit(':', 1)[-1]}")
                started.append(arn)
        return started


def upload_version(trigger: UploadTrigger, folder: Path, root: Path, last: str = keys.MANIFEST) -> list[str]:
    """Upload a version's folder under DIR/incoming/ plus the pipeline's job.json and
    features.json into the trigger's bucket, the object that starts the run (`last`: a prepared
    version's manifest.json, as `smlt data prepare` writes it after its shards, or a raw version's
    _SUCCESS marker, after its data) last; then let the trigger see the new objects as S3 would
    (one detector of uploads: `smlt local up`'s)."""
    s3 = trigger.engine.client("s3")
    rel = folder.relative_to(root).as_posix()
    for name in ("job.json", "features.json"):  # the pipeline's job, and its features (smlt.runtime.pipeline)
        path = root / "/".join(rel.split("/")[:2]) / name
        if path.exists():
            s3.put_object(Bucket=trigger.bucket, Key=path.relative_to(root).as_posix(), Body=path.read_bytes())
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f != folder / last:
            s3.put_object(Bucket=trigger.bucket, Key=f"{rel}/{f.relative_to(folder).as_posix()}", Body=f.read_bytes())
    s3.put_object(Bucket=trigger.bucket, Key=f"{rel}/{last}", Body=(folder / last).read_bytes())
    return trigger.poll()
