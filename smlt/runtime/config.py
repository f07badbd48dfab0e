"""The environment contract: every variable a function reads, in one model (`Settings`).

The stack (infra/stacks/functions.py) writes each function's environment from this model
(`Settings.environment`: field names become variable names here and nowhere else), the handlers
read it back (`Settings.from_env`), and the local engine passes on what the template says.

Deployment settings (prices, the tier list, memory sizes, the worker timeout) have one source,
cdk.json's context (`smlt.runtime.deployed`): the stack reads them from there and writes them to the
functions; a caller without the environment (tests, the simulators) gets them from the same file.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from smlt.runtime import deployed
from smlt.runtime.fanout import Fanout
from smlt.runtime.prices import Prices

# Which functions read a variable ("read_by"); "optional": written only when configured (the
# exchange URL) or set by the local engine only (its concurrency), never by the stack's defaults.
# A field whose default is cdk.json's is read by every function: a deployed function has no
# cdk.json, so the stack must write it everywhere.
PLANNER, AGGREGATE, TRAIN = "planner", "aggregate", "train_step"
ALL = (PLANNER, AGGREGATE, TRAIN)
STUDY = "study"  # the study controller (smlt.runtime.study): the table and the artifacts bucket only
PREPARE = "prepare"  # a raw upload's Prepare step (smlt.runtime.steps.prepare): data bucket, table, team's topic


def _read_by(*functions: str, optional: bool = False) -> dict[str, Any]:
    return {"read_by": list(functions), "optional": optional}


ENV = SettingsConfigDict(env_prefix="SMLT_", env_ignore_empty=True, frozen=True, extra="ignore")


class FunctionSizes(BaseSettings):
    """The deployed sizes the ledger and the planner price and plan with (set once in the stack;
    defaults from cdk.json). `Settings` has them too: pass a function's settings where these go."""

    model_config = ENV

    planner_memory_mb: int = Field(
        default_factory=lambda: deployed.value("planner_memory_mb"), json_schema_extra=_read_by(*ALL)
    )
    aggregate_memory_mb: int = Field(
        default_factory=lambda: deployed.value("aggregate_memory_mb"), json_schema_extra=_read_by(*ALL)
    )
    worker_timeout_s: int = Field(
        default_factory=lambda: deployed.value("worker_timeout_s"), json_schema_extra=_read_by(*ALL)
    )
    # The round's Map: inline or Distributed, and its start-up latency priors (smlt.runtime.fanout).
    fanout: Fanout = Field(
        default_factory=lambda: Fanout.model_validate(deployed.value("fanout")), json_schema_extra=_read_by(*ALL)
    )


class Settings(FunctionSizes):
    """A function's settings, from its environment (`from_env`)."""

    artifacts_bucket: str = Field(json_schema_extra=_read_by(*ALL, STUDY))
    data_bucket: str = Field("", json_schema_extra=_read_by(*ALL, PREPARE))
    table: str = Field(json_schema_extra=_read_by(*ALL, STUDY, PREPARE))
    architecture: str = Field(default_factory=lambda: deployed.value("architecture"), json_schema_extra=_read_by(*ALL))
    prices: Prices = Field(default_factory=Prices, json_schema_extra=_read_by(*ALL))
    # A train_step function's own memory tier.
    memory_mb: int = Field(
        0,
        validation_alias=AliasChoices("SMLT_MEMORY_MB", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"),
        json_schema_extra=_read_by(TRAIN),
    )
    train_functions: dict[int, str] = Field(default_factory=dict, json_schema_extra=_read_by(PLANNER))
    max_concurrency: int = Field(
        default_factory=lambda: deployed.value("max_concurrency"), json_schema_extra=_read_by(*ALL)
    )
    # Sharded aggregation (smlt.runtime.aggregate.reduce.plan_slices): bytes one aggregator should read
    # per round, and the smallest slice worth its own aggregator. Tuning knobs: written only when
    # configured, so a local run's own environment can set them.
    aggregator_read_bytes: int = Field(256 << 20, json_schema_extra=_read_by(PLANNER, optional=True))
    min_slice_bytes: int = Field(4 << 20, json_schema_extra=_read_by(PLANNER, optional=True))
    # The workers' /tmp shard cache (smlt.runtime.data.shards.ShardCache): at most this many MB, least
    # recently used shards evicted. The default leaves room in Lambda's default 512 MB /tmp; a
    # stack with more ephemeral storage may write a larger cap.
    shard_cache_mb: int = Field(384, ge=0, json_schema_extra=_read_by(TRAIN, optional=True))
    # Set by the local engine: how many handlers run at once there (None on AWS).
    local_concurrency: int | None = Field(None, json_schema_extra=_read_by(PLANNER, optional=True))
    # Per-step synchronous mode: where workers exchange gradients. "" = the artifacts bucket (S3);
    # a redis:// URL = Redis (ElastiCache), opened with smlt.runtime.store.open_store.
    exchange_url: str = Field("", json_schema_extra=_read_by(TRAIN, AGGREGATE, optional=True))
    # An SNS topic the team owns (cdk.json `notify_topic_arn`): Finalize publishes the gate's
    # decision on a pipeline version there, PrepareData and the first Plan a version's refusal
    # (smlt.runtime.notify).
    # Written only when configured.
    notify_topic_arn: str = Field("", json_schema_extra=_read_by(PLANNER, PREPARE, optional=True))
    # The user's own buckets ("BUCKET") or folders ("BUCKET/PREFIX/") the stack's roles may read
    # datasets from (cdk.json `data_buckets`): the planner's check of a job's dataset.uri. Written
    # only when configured.
    data_buckets: list[str] = Field(default_factory=list, json_schema_extra=_read_by(PLANNER, optional=True))
    # true when the train functions run in the exchange's VPC (redis_reducer), whose S3 gateway
    # endpoint serves this region's buckets only: the planner's check of the dataset's region.
    workers_in_vpc: bool = Field(False, json_schema_extra=_read_by(PLANNER, optional=True))
    # Read by Powertools (logger, metrics), not by smlt.
    service_name: str = Field(
        "smlt",
        validation_alias=AliasChoices("POWERTOOLS_SERVICE_NAME"),
        json_schema_extra=_read_by(*ALL, STUDY, PREPARE),
    )

    @classmethod
    def from_env(cls) -> Settings:
        return cls()  # the required fields come from the environment

    @staticmethod
    def variable(field: str) -> str:
        """The environment variable of a field."""
        alias = Settings.model_fields[field].validation_alias
        if isinstance(alias, AliasChoices):
            return str(alias.choices[0])
        return f"SMLT_{field.upper()}"

    @staticmethod
    def contract(function: str) -> tuple[set[str], set[str]]:
        """The variables `function` reads: (always written by the stack, written only when configured)."""
        always: set[str] = set()
        optional: set[str] = set()
        for name, info in Settings.model_fields.items():
            extra = info.json_schema_extra
            assert isinstance(extra, dict)
            if function in extra["read_by"]:  # type: ignore[operator]  # a list, see _read_by
                (optional if extra["optional"] else always).add(Settings.variable(name))
        return always, optional

    @staticmethod
    def environment(function: str, **values: Any) -> dict[str, str]:
        """The environment the stack writes for `function`: every variable it reads, from `values`
        (field names; strings pass through, so CDK tokens stay tokens; JSON for the rest)."""
        always, optional = Settings.contract(function)
        env = {Settings.variable(k): v if isinstance(v, str) else _dump(v) for k, v in values.items() if v is not None}
        unknown = set(env) - always - optional
        missing = always - set(env)
        if unknown or missing:
            raise ValueError(f"{function}: unknown variables {sorted(unknown)}, missing {sorted(missing)}")
        return env

    def exchange_store(self):
        """The store of the per-step gradient exchange (sync mode)."""
        from smlt.runtime.store import S3Store, open_store

        return open_store(self.exchange_url) if self.exchange_url else S3Store(self.artifacts_bucket)


def _dump(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, bool):
        return json.dumps(value)
    return str(value)
