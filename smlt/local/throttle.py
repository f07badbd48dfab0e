"""The account's Lambda concurrency limit on the local engine: what a new AWS account does.

Lambda runs at most the account's concurrency limit of invocations at once (a new account: 10)
and answers every invocation beyond it with HTTP 429 ``TooManyRequestsException`` (reason
``ConcurrentInvocationLimitExceeded``); Step Functions reports that as
``Lambda.TooManyRequestsException`` and retries it per the task's Retry. The local engine
counts its synchronous invocations in flight (queued in the handler pool included, as a
running Lambda environment counts) against :func:`limit` and throttles beyond it the same way.

``SMLT_LOCAL_ACCOUNT_CONCURRENCY`` sets the limit (read at every invocation, so a test can change
it on a running engine; `smlt run --local --concurrency N` and `smlt local up --concurrency N`
set it); unset, the limit is Lambda's standard 1,000. moto has no ``GetAccountSettings``: the
engine adds it to moto's Lambda routes and answers with the same limit, so the planner and
`smlt doctor` read the limit the invocations are held to.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

ENV = "SMLT_LOCAL_ACCOUNT_CONCURRENCY"
DEFAULT_LIMIT = 1000  # Lambda's standard concurrency per account and region
PATH = r"{0}/(?P<api_version>[^/]+)/account-settings/?$"

_lock = threading.Lock()
_in_flight = 0


def limit() -> int:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: a whole number of concurrent executions (a new account: 10)") from None
    if value < 1:
        raise ValueError(f"{ENV}={value}: at least 1")
    return value


def acquire() -> bool:
    """Take one concurrency slot; False: the account is at its limit (throttle the invocation)."""
    global _in_flight
    with _lock:
        if _in_flight >= limit():
            return False
        _in_flight += 1
        return True


def release() -> None:
    global _in_flight
    with _lock:
        _in_flight = max(0, _in_flight - 1)


def in_flight() -> int:
    return _in_flight


def account_settings(*_: Any) -> tuple[int, dict[str, str], str]:
    """moto route: Lambda's GetAccountSettings answer (no function reserves concurrency locally)."""
    n = limit()
    body = {
        "AccountLimit": {
            "TotalCodeSize": 80530636800,
            "CodeSizeUnzipped": 262144000,
            "CodeSizeZipped": 52428800,
            "ConcurrentExecutions": n,
            "UnreservedConcurrentExecutions": n,
        },
        "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": 0},
    }
    return 200, {"Content-Type": "application/json"}, json.dumps(body)


def install() -> None:
    """Add GetAccountSettings to moto's Lambda routes (before the server first serves Lambda)."""
    from moto.awslambda import urls

    urls.url_paths.setdefault(PATH, account_settings)
