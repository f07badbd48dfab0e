"""Settings a function reads from its environment (set by the CDK stack, or the local engine)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from smlt.prices import Prices


@dataclass(frozen=True)
class Settings:
    artifacts_bucket: str
    data_bucket: str
    table: str
    architecture: str = "x86_64"
    memory_mb: int = 0
    train_functions: dict[int, str] = field(default_factory=dict)
    max_concurrency: int = 64
    # Set by the local engine: how many handlers run at once there (None on AWS).
    local_concurrency: int | None = None
    worker_timeout_s: int = 900
    prices: Prices = field(default_factory=Prices)
    # Per-step synchronous mode: where workers exchange gradients. "" = the artifacts bucket (S3);
    # a redis:// URL = Redis (ElastiCache), opened with smlt.store.open_store.
    exchange_url: str = ""
    # Sharded aggregation (smlt.aggregate.sharded.plan_slices): bytes one aggregator should read
    # per round, and the smallest slice worth its own aggregator.
    aggregator_read_bytes: int = 256 << 20
    min_slice_bytes: int = 4 << 20

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        fns = json.loads(env.get("SMLT_TRAIN_FUNCTIONS") or "{}")
        return cls(
            artifacts_bucket=env["SMLT_ARTIFACTS_BUCKET"],
            data_bucket=env.get("SMLT_DATA_BUCKET", ""),
            table=env["SMLT_TABLE"],
            architecture=env.get("SMLT_ARCHITECTURE", "x86_64"),
            memory_mb=int(env.get("SMLT_MEMORY_MB") or env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE") or 0),
            train_functions={int(k): v for k, v in fns.items()},
            max_concurrency=int(env.get("SMLT_MAX_CONCURRENCY", "64")),
            local_concurrency=int(env["SMLT_LOCAL_CONCURRENCY"]) if env.get("SMLT_LOCAL_CONCURRENCY") else None,
            worker_timeout_s=int(env.get("SMLT_WORKER_TIMEOUT_S", "900")),
            prices=Prices.from_env(),
            exchange_url=env.get("SMLT_EXCHANGE_URL", ""),
            aggregator_read_bytes=int(env.get("SMLT_AGGREGATOR_READ_BYTES") or 256 << 20),
            min_slice_bytes=int(env.get("SMLT_MIN_SLICE_BYTES") or 4 << 20),
        )

    def exchange_store(self):
        """The store of the per-step gradient exchange (sync mode)."""
        from smlt.store import S3Store, open_store

        return open_store(self.exchange_url) if self.exchange_url else S3Store(self.artifacts_bucket)
