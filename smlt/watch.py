"""The stack's upload trigger, locally: `smlt run --local --watch DIR`.

On AWS, S3 sends "Object Created" to EventBridge and the stack's rule starts the state machine.
moto does neither, so this module does what EventBridge would, from the synthesized template:
it builds the event S3 would send, matches it against every rule's EventPattern and renders
each matching target's InputTransformer, then starts the target state machine. The rule is the
stack's own: change it in CDK and the local trigger changes with it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any


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


def _match_value(rule: Any, value: Any) -> bool:
    if isinstance(rule, dict):
        if "prefix" in rule:
            return isinstance(value, str) and value.startswith(rule["prefix"])
        if "suffix" in rule:
            return isinstance(value, str) and value.endswith(rule["suffix"])
        if "wildcard" in rule:
            pattern = "^" + ".*".join(re.escape(p) for p in rule["wildcard"].split("*")) + "$"
            return isinstance(value, str) and re.match(pattern, value) is not None
        if "exists" in rule:
            return (value is not None) == bool(rule["exists"])
        if "anything-but" in rule:
            but = rule["anything-but"]
            return value not in (but if isinstance(but, list) else [but])
        raise ValueError(f"event pattern operator not supported locally: {rule}")
    return rule == value


def matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """EventBridge matching for the operators rules use here (values, prefix, suffix, wildcard,
    exists, anything-but): every field in the pattern must match, a list means any of."""
    for field, rule in pattern.items():
        value = event.get(field) if isinstance(event, dict) else None
        if isinstance(rule, dict) and not any(
            k in rule for k in ("prefix", "suffix", "wildcard", "exists", "anything-but")
        ):
            if not isinstance(value, dict) or not matches(rule, value):
                return False
        elif isinstance(rule, list):
            values = value if isinstance(value, list) else [value]
            if not any(_match_value(r, v) for r in rule for v in values):
                return False
        elif not _match_value(rule, value):
            return False
    return True


def _path(event: dict[str, Any], path: str) -> Any:
    value: Any = event
    for part in path.removeprefix("$").strip(".").split("."):
        if part:
            value = value.get(part) if isinstance(value, dict) else None
    return value


def render_target_input(target: dict[str, Any], event: dict[str, Any]) -> str:
    """The input EventBridge would send this target (Input, InputPath or InputTransformer)."""
    if "Input" in target:
        return target["Input"]
    if "InputPath" in target:
        return json.dumps(_path(event, target["InputPath"]))
    tr = target.get("InputTransformer")
    if not tr:
        return json.dumps(event)
    values = {name: _path(event, path) for name, path in tr.get("InputPathsMap", {}).items()}
    text = tr["InputTemplate"]

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name == "aws.events.event.json":
            return json.dumps(event)
        v = values.get(name)
        if m.group(1) and m.group(3):  # "<name>" inside quotes: the raw string
            return json.dumps(v if isinstance(v, str) else json.dumps(v))
        return json.dumps(v)

    return re.sub(r'("?)<([\w.-]+)>("?)', sub, text)


def deliver(engine, event: dict[str, Any]) -> list[str]:
    """Start every state machine whose rule matches the event; returns the execution ARNs."""
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


def upload_version(engine, names, folder: Path, root: Path) -> list[str]:
    """Upload a prepared dataset folder under DIR/incoming/ (shards first, manifest last, as
    `smlt data prepare` writes them) plus the pipeline's job.json, and fire the trigger."""
    s3 = engine.client("s3")
    rel = folder.relative_to(root).as_posix()
    pipeline_job = root / "/".join(rel.split("/")[:2]) / "job.json"
    if pipeline_job.exists():
        s3.put_object(
            Bucket=names.data_bucket, Key=pipeline_job.relative_to(root).as_posix(), Body=pipeline_job.read_bytes()
        )
    manifest = folder / "manifest.json"
    for f in sorted(folder.iterdir()):
        if f.is_file() and f != manifest:
            s3.put_object(Bucket=names.data_bucket, Key=f"{rel}/{f.name}", Body=f.read_bytes())
    body = manifest.read_bytes()
    key = f"{rel}/manifest.json"
    s3.put_object(Bucket=names.data_bucket, Key=key, Body=body)
    return deliver(engine, object_created_event(names.data_bucket, key, len(body), hashlib.md5(body).hexdigest()))


def watch_folder(
    root: Path, out: Path, faults: str | None = None, quiet: bool = False, once: bool = False, interval: float = 1.0
) -> int:
    """Watch ROOT/incoming/<pipeline>/<version>/manifest.json; each new one starts a retraining
    run through the stack's rule. Runs until interrupted (or, with once, until idle)."""
    from smlt.runner import Follower, start_engine

    engine, names, _ = start_engine(faults, quiet)
    seen: set[Path] = set()
    try:
        print(f"watching {root}/incoming/<pipeline>/<version>/manifest.json (Ctrl-C to stop)")
        while True:
            fresh = sorted(p for p in root.glob("incoming/*/*/manifest.json") if p not in seen)
            for manifest in fresh:
                seen.add(manifest)
                for arn in upload_version(engine, names, manifest.parent, root):
                    print(f"{manifest.parent.relative_to(root)}: started execution {arn.rsplit(':', 1)[-1]}")
                    desc = engine.wait(arn, interval=0.25)
                    output = json.loads(desc.get("output") or "{}")
                    plan = output.get("plan", {})
                    run_id = plan.get("run_id")
                    if desc["status"] != "SUCCEEDED" or not run_id:
                        print(f"  {desc['status']}: {desc.get('error', '')} {desc.get('cause', '')[:300]}")
                        continue
                    if plan.get("action") == "duplicate":
                        print(f"  {plan['reason']}")
                        continue
                    from smlt.outputs import fetch_outputs
                    from smlt.store import S3Store

                    follower = Follower(engine, names, run_id, out / run_id / ".state", quiet)
                    follower.poll()
                    if output.get("chain"):  # a long run continues in chained executions
                        follower.follow(output["chain"]["execution_arn"])
                    m = fetch_outputs(
                        S3Store(names.artifacts_bucket, client=engine.client("s3")),
                        run_id,
                        out / run_id,
                        engine.history(arn),
                    )
                    print(
                        f"  run {run_id}: val accuracy {m['final']['val_accuracy']}, warm start "
                        f"{m['job'].get('warm_start') or 'none'} -> {out / run_id}"
                    )
            if once and not fresh:
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    finally:
        engine.stop()
