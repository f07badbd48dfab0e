"""Retrying writes that lost a race: S3's 409 ConditionalRequestConflict and DynamoDB's
transaction conflicts. AWS documents both as "retry the request"; botocore retries neither
(only TransactionInProgressException), and moto never answers them.

A request still throttled after botocore's own attempts (S3's 503 SlowDown, DynamoDB's
throughput errors, Step Functions' ThrottlingException: Chain's StartExecution) is not retried here: `named_throttles` turns it into `Throttled`, naming the
service, the request and the object or table, and the state machine retries the control step
after a pause (infra/stacks/workflow.py, THROTTLED).

Backoff is "full jitter" (a uniform draw below an exponential cap), so writers that collided
once do not collide again in lockstep; attempts are bounded so a stuck key still surfaces.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from smlt.runtime import clients
from smlt.runtime.errors import Throttled

T = TypeVar("T")

ATTEMPTS = 8
BASE_S = 0.02
CAP_S = 1.0

# Codes of a write refused because another write or transaction held the key at that moment.
S3_CONFLICTS = frozenset({"ConditionalRequestConflict"})
DYNAMODB_CONFLICTS = frozenset({"TransactionConflictException", "TransactionInProgressException"})
# Cancellation reasons of a TransactWriteItems that say the same of one of its items.
TRANSACTION_CONFLICT_REASONS = frozenset({"TransactionConflict"})

# Codes of a request refused for its rate, which botocore retries (its max_attempts, 8 here, counts retries:
# smlt.runtime.clients) before raising. S3 answers a HEAD's 503 without a body: its code is "503".
S3_THROTTLES = frozenset({"SlowDown", "503"})
DYNAMODB_THROTTLES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)
# Step Functions throttles each API action with its own token bucket per account and Region
# (StartExecution, DescribeExecution, ...: docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html,
# "Quotas related to API action throttling") and answers HTTP 400 ThrottlingException (the API
# reference's common errors); botocore's standard mode retries it (5 attempts, smlt.runtime.clients).
SFN_THROTTLES = frozenset({"ThrottlingException"})
THROTTLES = {"s3": S3_THROTTLES, "dynamodb": DYNAMODB_THROTTLES, "sfn": SFN_THROTTLES}
SERVICE_NAMES = {"s3": "S3", "dynamodb": "DynamoDB", "sfn": "Step Functions"}
_WHERE = "smlt_where"  # the request's parameters, kept in botocore's request context

# Its own generator: jitter must not consume draws of the global one a handler may have seeded.
_jitter = random.Random()


class Conflict(Exception):
    """Raised by a retried operation to ask for another attempt (it lost a race, nothing else)."""

    def __init__(self, cause: BaseException | None = None) -> None:
        super().__init__(str(cause) if cause else "conflict")
        self.cause = cause


def error_code(e: ClientError) -> str | None:
    return e.response.get("Error", {}).get("Code")


def backoff_s(attempt: int, base_s: float = BASE_S, cap_s: float = CAP_S) -> float:
    """The pause before retry number `attempt` (1-based)."""
    return _jitter.uniform(0, min(cap_s, base_s * 2**attempt))


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


def _where(params: dict[str, Any]) -> str:
    """The object (s3://bucket/key, or the bucket and prefix) or the table(s) a request names."""
    if "Bucket" in params:
        rest = params.get("Key") or params.get("Prefix") or ""
        return f"s3://{params['Bucket']}/{rest}"
    if "TableName" in params:
        return f"table {params['TableName']}"
    if "executionArn" in params or "stateMachineArn" in params:  # Step Functions
        arn = params.get("executionArn") or params["stateMachineArn"]
        return f"execution {params['name']} of {arn}" if params.get("name") else arn
    tables = list(params.get("RequestItems") or {})
    for item in params.get("TransactItems") or []:
        tables += [op["TableName"] for op in item.values() if isinstance(op, dict) and "TableName" in op]
    return "table " + ", ".join(dict.fromkeys(tables)) if tables else "?"


def _on_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """botocore `before-parameter-build`: the request's parameters, kept in its context (named
    only when the answer is a throttle: this runs on every request)."""
    context[_WHERE] = params


def _on_answer(parsed: dict[str, Any], context: dict[str, Any], event_name: str = "", **_: Any) -> None:
    """botocore `after-call` (after its retries): a throttled answer keeps what the request named
    (the exception botocore raises next carries `parsed` as its `response`)."""
    service = event_name.split(".")[1] if event_name.count(".") >= 2 else ""
    if parsed.get("Error", {}).get("Code") in THROTTLES.get(service, ()):
        parsed["SmltWhere"] = _where(context.get(_WHERE) or {})
        parsed["SmltService"] = service  # ThrottlingException is DynamoDB's code as well as Step Functions'


def throttled(e: ClientError, service: str) -> Throttled | None:
    """`e` as a named error when it is a request of `service` still throttled after botocore's
    attempts; None for any other error."""
    code = error_code(e)
    if code not in THROTTLES.get(service, ()):
        return None
    where = e.response.get("SmltWhere", "?")
    retries = int(e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0))
    advice = "fewer workers at once, workers.max, send fewer requests"
    if service == "s3":
        cause = "S3 serves a prefix up to 3,500 writes or 5,500 reads a second, fewer while it scales the prefix up"
    elif service == "sfn":
        advice = "fewer runs and studies at once, or a higher Step Functions quota through Service Quotas"
        cause = (
            "Step Functions serves each API action (StartExecution, DescribeExecution, ...) from a token bucket "
            "per account and Region, shared with every other caller in the account (other runs, studies, consoles)"
        )
    else:
        cause = (
            "a run's items share one partition, which serves up to 1,000 write and 3,000 read units a "
            "second (and an on-demand table its maximum throughput, the account its table quotas)"
        )
    return Throttled(
        f"{SERVICE_NAMES[service]} {e.operation_name} of {where} stayed throttled ({code}) "
        f"after botocore's {retries} {'retry' if retries == 1 else 'retries'}: {cause}. The state machine runs the step again after a pause; if the "
        f"run fails with this, resume it a little later ({advice})"
    )


def named_throttles(fn: Callable[..., T]) -> Callable[..., T]:
    """A control step's handler whose S3, DynamoDB or Step Functions request stayed throttled raises `Throttled`
    (the state machine's retry takes it) instead of botocore's ClientError."""
    clients.on_every_client("before-parameter-build", _on_params, "smlt-throttle-where")
    clients.on_every_client("after-call", _on_answer, "smlt-throttle-answer")

    @functools.wraps(fn)
    def handler(*args: Any, **kw: Any) -> T:
        try:
            return fn(*args, **kw)
        except ClientError as e:
            service = e.response.get("SmltService")
            named = throttled(e, service) if service else throttled(e, "s3") or throttled(e, "dynamodb")
            if named is None:
                raise
            raise named from e

    return handler
