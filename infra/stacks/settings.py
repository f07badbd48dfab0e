"""Stack settings read from CDK context (cdk.json, `-c key=value`, or `build_app(context=...)`).

`cdk.json` holds the defaults, the one copy of them: `infra.app.build_app` loads them so an
in-process caller (the local engine) gets the same values as the CDK CLI, and a caller whose app
has no such context (a bare `cdk.App()`) gets them from the same file (`smlt.runtime.deployed`). Values given on the command line arrive as
strings (`-c max_concurrency=32`), so every non-string setting is JSON-decoded when it is a string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from constructs import Construct
from pydantic import ValidationError

from smlt.runtime import deployed
from smlt.runtime.fanout import Fanout
from smlt.runtime.validation import field_errors

ARCHITECTURES = ("x86_64", "arm64")
# Lambda's Python runtimes on Amazon Linux 2023 (glibc 2.34). python3.11 runs on Amazon Linux 2
# (glibc 2.26), where numpy 2.4.x (manylinux_2_27) and torch 2.13 (manylinux_2_28) cannot load.
LAMBDA_PYTHONS = ("3.12", "3.13")
# ElastiCache node types: cache.<family>.<size> (cache.r7g.large, cache.m7g.xlarge, ...).
NODE_TYPE = re.compile(r"^cache\.[a-z][a-z0-9-]*\.[a-z0-9]+$")
# A standard SNS topic's ARN: arn:<partition>:sns:<region>:<account>:<name> (a FIFO topic's name
# ends in .fifo, and its publishers must give a message group: not one smlt publishes to).
TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")
# `data_buckets`: a bucket of the user's own ("BUCKET") or a folder of it ("BUCKET/PREFIX/") the
# functions that read datasets may read (S3's bucket naming rules: 3-63 of a-z 0-9 . -).
DATA_BUCKET = re.compile(r"^(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>\S*))?$")
# `data_kms_keys`: a customer-managed KMS key's ARN (an alias is not what IAM authorizes kms:Decrypt on).
KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+$")


def _data_buckets(value: list[Any]) -> tuple[str, ...]:
    out = []
    for entry in value:
        text = str(entry).removeprefix("s3://") if isinstance(entry, str) else entry
        if not isinstance(text, str) or not DATA_BUCKET.match(text):
            raise ValueError(
                f"context 'data_buckets': each entry a bucket name or BUCKET/PREFIX/ (as in "
                f'-c data_buckets=\'["my-datasets", "shared-bucket/team-a/"]\'), got {entry!r}'
            )
        out.append(text)
    return tuple(out)


def _kms_keys(value: list[Any]) -> tuple[str, ...]:
    for entry in value:
        if not isinstance(entry, str) or not KMS_KEY_ARN.match(entry):
            raise ValueError(
                "context 'data_kms_keys': each entry a KMS key's ARN (arn:aws:kms:REGION:ACCOUNT:key/KEY_ID, "
                f"as `aws kms describe-key --key-id alias/NAME` prints it; not an alias), got {entry!r}"
            )
    return tuple(value)


def _decode(key: str, value: Any, expected: type | tuple[type, ...]) -> Any:
    if isinstance(value, str) and expected is not str:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"context {key!r}: expected JSON, got {value!r}") from None
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ValueError(f"context {key!r}: expected {expected}, got {value!r}")
    return value


@dataclass(frozen=True)
class Settings:
    memory_tiers: tuple[int, ...]
    max_concurrency: int
    architecture: str
    lambda_python: str
    prices: dict[str, Any]
    redis_reducer: bool
    redis_node_type: str
    update_expiry_days: int
    log_retention_days: int
    train_ephemeral_mb: int
    execution_timeout_hours: int
    # Set once here for the functions, and written to the ones that price or plan with them.
    planner_memory_mb: int
    aggregate_memory_mb: int
    worker_timeout_s: int
    fanout: dict[str, Any]
    alarm_topic_arn: str | None = None
    # The team's SNS topic for the gate's decisions (smlt.runtime.notify); the planner may publish there.
    notify_topic_arn: str | None = None
    # The user's own buckets (or folders of them) datasets are read from, and the customer-managed
    # KMS keys their objects are encrypted with: read grants of the functions that read datasets.
    data_buckets: tuple[str, ...] = ()
    data_kms_keys: tuple[str, ...] = ()

    @staticmethod
    def from_context(scope: Construct) -> Settings:
        defaults = deployed.context()

        def get(key: str, expected: type | tuple[type, ...]) -> Any:
            raw = scope.node.try_get_context(key)
            if raw is None:
                raw = defaults.get(key)
            if raw is None:
                return None
            return _decode(key, raw, expected)

        tiers = get("memory_tiers", list)
        if not tiers or any(isinstance(t, bool) or not isinstance(t, int) or not 128 <= t <= 10240 for t in tiers):
            raise ValueError(f"context 'memory_tiers': need a list of integers in 128..10240 MB, got {tiers!r}")
        if len(set(tiers)) != len(tiers):
            raise ValueError(f"context 'memory_tiers': duplicate tier in {tiers!r}")
        arch = get("architecture", str)
        if arch not in ARCHITECTURES:
            raise ValueError(f"context 'architecture': one of {ARCHITECTURES}, got {arch!r}")
        py = str(get("lambda_python", (str, float)))
        if py not in LAMBDA_PYTHONS:
            raise ValueError(f"context 'lambda_python': one of {LAMBDA_PYTHONS}, got {py!r}")
        max_conc = get("max_concurrency", int)
        if not 1 <= max_conc <= 10000:
            raise ValueError(f"context 'max_concurrency': 1..10000, got {max_conc}")
        prices = get("prices", dict)
        gbs = prices.get("lambda_gb_second")
        if not isinstance(gbs, dict) or arch not in gbs:
            raise ValueError(f"context 'prices.lambda_gb_second' needs a price for {arch!r}")
        # true: an ElastiCache (Valkey) exchange in a VPC of its own, see infra/stacks/exchange.py.
        redis = get("redis_reducer", bool)
        node_type = get("redis_node_type", str)
        if not NODE_TYPE.match(node_type):
            raise ValueError(
                f"context 'redis_node_type': an ElastiCache node type like cache.r7g.large, got {node_type!r}"
            )
        topic = get("alarm_topic_arn", str)
        notify = get("notify_topic_arn", str) or None
        if notify is not None and not TOPIC_ARN.match(notify):
            raise ValueError(
                f"context 'notify_topic_arn': a standard SNS topic's ARN (arn:aws:sns:REGION:ACCOUNT:NAME, "
                f"not a .fifo topic), got {notify!r}"
            )
        data_buckets = _data_buckets(get("data_buckets", list) or [])
        data_kms_keys = _kms_keys(get("data_kms_keys", list) or [])
        fanout = get("fanout", dict)
        try:
            Fanout.model_validate(fanout)
        except ValidationError as e:
            err = field_errors(e)[0]
            raise ValueError(f"context {'.'.join(filter(None, ('fanout', err.path)))!r}: {err.message}") from None
        return Settings(
            memory_tiers=tuple(sorted(tiers)),
            max_concurrency=max_conc,
            architecture=arch,
            lambda_python=py,
            prices=prices,
            redis_reducer=redis,
            redis_node_type=node_type,
            update_expiry_days=get("update_expiry_days", int),
            log_retention_days=get("log_retention_days", int),
            train_ephemeral_mb=get("train_ephemeral_mb", int),
            execution_timeout_hours=get("execution_timeout_hours", int),
            planner_memory_mb=get("planner_memory_mb", int),
            aggregate_memory_mb=get("aggregate_memory_mb", int),
            worker_timeout_s=get("worker_timeout_s", int),
            fanout=fanout,
            alarm_topic_arn=topic or None,
            notify_topic_arn=notify,
            data_buckets=data_buckets,
            data_kms_keys=data_kms_keys,
        )
