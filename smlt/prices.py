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
    # DynamoDB on-demand request units (us-east-1 since November 2024).
    dynamodb_write_unit: float = 0.625 / 1_000_000
    dynamodb_read_unit: float = 0.125 / 1_000_000

    @classmethod
    def from_env(cls) -> Prices:
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
        return (
            transitions * self.sfn_transition
            + s3_puts * self.s3_put
            + s3_gets * self.s3_get
            + self.dynamodb_round(workers)
        )

    def dynamodb_round(self, workers):
        """The table's request units in one round of n workers (docs/architecture.md, "Requests
        per round"; items rounded up to 1 KB written, 4 KB read, transactions at twice the rate).

        Writes: each worker's record in a transaction with the seal's condition check (2 + 2 per
        ~1 KB item), the seal (1), the ROUND item (~0.7 KB + 0.3 KB per worker) and the PLAN item
        (~4 KB). Reads, strongly consistent: each worker's BatchGetItem of 3 items, the
        aggregator's of 4 and its Query of the records (~0.7 KB each), the planner's Query and
        BatchGetItem of 3. Works on numbers and numpy arrays alike."""
        writes = 4 * workers + 1 + (1 + 0.3 * workers) + 4
        reads = 3 * workers + 4 + (1 + 0.2 * workers) + 1 + 3
        return writes * self.dynamodb_write_unit + reads * self.dynamodb_read_unit
