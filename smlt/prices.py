"""Price table and the billed items of a round.

Prices are configuration (cdk.json context `prices`, passed to functions as `SMLT_PRICES`);
these defaults are us-east-1 list prices from shared/facts.md.
"""

from __future__ import annotations

import json
import os

from pydantic import BaseModel, ConfigDict


class Prices(BaseModel):
    # Ignore what we do not price (e.g. "currency") so the table can carry notes.
    model_config = ConfigDict(extra="ignore")

    lambda_gb_second: dict[str, float] = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
    lambda_request: float = 0.20 / 1_000_000
    sfn_transition: float = 0.025 / 1_000
    s3_put: float = 0.005 / 1_000
    s3_get: float = 0.0004 / 1_000

    @classmethod
    def from_env(cls) -> "Prices":
        raw = os.environ.get("SMLT_PRICES")
        return cls.model_validate(json.loads(raw)) if raw else cls()

    def lambda_cost(self, memory_mb: float, seconds: float, architecture: str = "x86_64") -> float:
        """One invocation: GB-seconds (billed per ms, at least 1 ms) plus the request fee."""
        billed = max(seconds, 0.001)
        return memory_mb / 1024.0 * billed * self.lambda_gb_second[architecture] + self.lambda_request

    def round_overhead(self, workers: int, s3_puts: int, s3_gets: int) -> float:
        """Step Functions transitions and S3 requests of one round.

        Transitions per round: Plan, ShouldTrain, Train (Map start/end), per worker the child
        execution's start + task + end, Aggregate, Continue.
        """
        transitions = 6 + 3 * workers
        return transitions * self.sfn_transition + s3_puts * self.s3_put + s3_gets * self.s3_get
