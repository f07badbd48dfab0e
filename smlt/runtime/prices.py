"""The price table (cdk.json context `prices`, the one copy of the numbers; the functions get it
as `SMLT_PRICES`, see smlt.runtime.config) and Lambda's billing rule. What a round buys: smlt.runtime.bill."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smlt.runtime import deployed


def gb_seconds(memory_mb: Any, seconds: Any) -> Any:
    """GB-seconds of one invocation: Lambda bills per ms, at least 1 ms (numbers or arrays; plain
    numbers in Python floats, the same operations without numpy's overhead per call)."""
    if isinstance(memory_mb, (int, float)) and isinstance(seconds, (int, float)):
        return float(memory_mb) / 1024.0 * max(seconds, 0.001)
    return np.asarray(memory_mb, dtype=float) / 1024.0 * np.maximum(seconds, 0.001)


def _deployed(item: str) -> Any:
    return deployed.value("prices")[item]


class Prices(BaseModel):
    """A price table; `Prices()` is the deployed one (cdk.json), `SMLT_PRICES` in a function."""

    # Ignore what we do not price (e.g. "currency") so the table can carry notes.
    model_config = ConfigDict(extra="ignore", frozen=True)

    lambda_gb_second: dict[str, float] = Field(default_factory=lambda: _deployed("lambda_gb_second"))  # by architecture
    lambda_request: float = Field(default_factory=lambda: _deployed("lambda_request"))
    sfn_transition: float = Field(default_factory=lambda: _deployed("sfn_transition"))
    s3_put: float = Field(default_factory=lambda: _deployed("s3_put"))
    s3_get: float = Field(default_factory=lambda: _deployed("s3_get"))
    # DynamoDB on-demand request units.
    dynamodb_write_unit: float = Field(default_factory=lambda: _deployed("dynamodb_write_unit"))
    dynamodb_read_unit: float = Field(default_factory=lambda: _deployed("dynamodb_read_unit"))
    # CloudWatch Logs ingestion, standard class, per GB (CloudWatch pricing page, us-east-1).
    logs_ingestion_gb: float = Field(default_factory=lambda: _deployed("logs_ingestion_gb"))
    # X-Ray, per trace recorded beyond the free tier ($5.00 per million, aws.amazon.com/xray/pricing).
    xray_trace: float = Field(default_factory=lambda: _deployed("xray_trace"))

    def lambda_cost(self, memory_mb: Any, seconds: Any, architecture: str = "x86_64") -> Any:
        """One invocation: its GB-seconds plus the request fee."""
        return gb_seconds(memory_mb, seconds) * self.lambda_gb_second[architecture] + self.lambda_request
