"""Retrying writes that lost a race: S3's 409 ConditionalRequestConflict and DynamoDB's
transaction conflicts. AWS documents both as "retry the request"; botocore retries neither
(only TransactionInProgressException), and moto never answers them.

Backoff is "full jitter" (a uniform draw below an exponential cap), so writers that collided
once do not collide again in lockstep; attempts are bounded so a stuck key still surfaces.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from botocore.exceptions import ClientError

T = TypeVar("T")

ATTEMPTS = 8
BASE_S = 0.02
CAP_S = 1.0

# Codes of a write refused because another write or transaction held the key at that moment.
S3_CONFLICTS = frozenset({"ConditionalRequestConflict"})
DYNAMODB_CONFLICTS = frozenset({"TransactionConflictException", "TransactionInProgressException"})
# Cancellation reasons of a TransactWriteItems that say the same of one of its items.
TRANSACTION_CONFLICT_REASONS = frozenset({"TransactionConflict"})

# Its own generator: jitter must not consume draws of the global one a handler may have seeded.
_jitter = random.Random()


class Conflict(Exception):
    """Raised by a retried operation to ask for another attempt (it lost a race, nothing else)."""

    def __init__(self, cause: BaseException | None = None) -> None:
        super().__init__(str(cause) if cause else "conflict")
        self.cause = cause


def error_code(e: ClientError) -> str | None:
    return e.response.get("Error", {}).get("Code")


def backoff_s(attempt: int) -> float:
    """The pause before retry number `attempt` (1-based)."""
    return _jitter.uniform(0, min(CAP_S, BASE_S * 2**attempt))


def on_conflict(fn: Callable[[], T], codes: frozenset[str], attempts: int = ATTEMPTS) -> T:
    """`fn()`, again after a jittered pause whenever it raises a ClientError with one of `codes`
    or `Conflict`; after `attempts` tries the last error propagates."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except ClientError as e:
            if error_code(e) not in codes or attempt == attempts:
                raise
        except Conflict as e:
            if attempt == attempts:
                if isinstance(e.cause, BaseException):
                    raise e.cause from None
                raise
        time.sleep(backoff_s(attempt))
    raise AssertionError("unreachable")  # the loop returns or raises
