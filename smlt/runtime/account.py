"""The account's Lambda limits, inputs of the plan: read at each run's first plan (the planner)
and by `smlt doctor` (the client).

A new account runs 10 Lambda invocations at once (an established one 1,000); every invocation
beyond the limit is throttled (`TooManyRequestsException`). The smlt functions reserve no
concurrency, so the pool they share is the account's *unreserved* concurrency
(`GetAccountSettings` -> `AccountLimit.UnreservedConcurrentExecutions`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger(__name__)

# Service Quotas: AWS Lambda, "Concurrent executions".
QUOTA_CODE = "L-B99A9384"


def lambda_client() -> Any:
    from smlt.runtime import clients

    return clients.client("lambda")


@dataclass(frozen=True)
class AccountLimits:
    concurrent: int  # AccountLimit.ConcurrentExecutions: the account's limit in this region
    unreserved: int  # AccountLimit.UnreservedConcurrentExecutions: what functions without a reservation share


def read_limits(client: Any = None) -> AccountLimits:
    """The account's Lambda concurrency (raises botocore's errors: the caller decides)."""
    limit = (client or lambda_client()).get_account_settings()["AccountLimit"]
    concurrent = int(limit["ConcurrentExecutions"])
    return AccountLimits(concurrent, int(limit.get("UnreservedConcurrentExecutions", concurrent)))


def try_read_limits(client: Any = None) -> AccountLimits | None:
    """`read_limits`, or None (logged) when the account cannot be asked (a stack deployed before
    the planner's role could, a network error): the planner then plans with `max_concurrency`."""
    try:
        return read_limits(client)
    except (ClientError, BotoCoreError, KeyError, ValueError) as e:
        log.warning("could not read the account's Lambda concurrency (GetAccountSettings): %s", e)
        return None


def raise_hint(needed: int | None = None) -> str:
    """How to raise the limit, for an error or a report."""
    value = f" --desired-value {max(needed, 1000) if needed else 1000}"
    return (
        f"raise the Service Quotas quota 'AWS Lambda / Concurrent executions' ({QUOTA_CODE}): "
        f"aws service-quotas request-service-quota-increase --service-code lambda --quota-code {QUOTA_CODE}{value}"
    )


def run_share(account_unreserved: int, runs: int = 1) -> int:
    """The part of the account's unreserved concurrency one of `runs` runs running at once may
    fill with workers. One run: all of it (its Plan and Aggregate never run beside its workers).
    Several (a study's trials): what is left after the study controller's watcher, split evenly,
    so that each trial's workers, or its one control step, and the watcher never pass the limit."""
    if runs <= 1:
        return account_unreserved
    return (account_unreserved - 1) // runs


def worker_slots(max_concurrency: int, account_unreserved: int | None, runs: int = 1) -> int:
    """How many workers of a round may run at once: the stack's `max_concurrency` (the Map's
    MaxConcurrency) and this run's share of the account's unreserved concurrency (`run_share`:
    all of it unless `runs` runs share it), whichever is lower (at least 1)."""
    if account_unreserved is None:
        return max(1, max_concurrency)
    return max(1, min(max_concurrency, run_share(account_unreserved, runs)))
