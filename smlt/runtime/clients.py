"""The process's AWS clients: one per service, made on first use and kept (a warm Lambda sandbox
reuses them between invocations), each with the retry policy its service needs; the CLI makes its
own per command with the same policies (`make`). The endpoint
comes from AWS_ENDPOINT_URL (the local engine sets it); `reset()` forgets them when it changes."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

# Adaptive retries for the stores every round hits (throttling under a wide fan-out); standard for
# the rest. S3 keeps up to 32 connections: the aggregator and the workers fetch in parallel.
CONFIGS: dict[str, dict[str, Any]] = {
    "s3": {"retries": {"max_attempts": 8, "mode": "adaptive"}, "max_pool_connections": 32},
    "dynamodb": {"retries": {"max_attempts": 8, "mode": "adaptive"}},
    # Finalize's notification (smlt.runtime.notify): a few quick tries, never a stalled Finalize.
    "sns": {"retries": {"max_attempts": 3, "mode": "standard"}, "connect_timeout": 5, "read_timeout": 10},
}
STANDARD: dict[str, Any] = {"retries": {"mode": "standard", "max_attempts": 5}}
# The AWS SDKs' own setting, when the operator sets it (on the functions or the CLI's shell), counts
# over these defaults: AWS_MAX_ATTEMPTS, every attempt included.
MAX_ATTEMPTS_ENV = "AWS_MAX_ATTEMPTS"


def _config(service: str) -> dict[str, Any]:
    """`service`'s default client settings, with AWS_MAX_ATTEMPTS when it is set."""
    config = CONFIGS.get(service, STANDARD)
    attempts = os.environ.get(MAX_ATTEMPTS_ENV, "").strip()
    if not attempts.isdigit() or int(attempts) < 1:
        return config
    mode = config["retries"]["mode"]
    return {**config, "retries": {"mode": mode, "total_max_attempts": int(attempts)}}


# botocore event handlers every client gets (the ledger's request meter, smlt.runtime.ledger).
_HOOKS: list[tuple[str, Callable[..., Any], str]] = []


def on_every_client(event: str, handler: Callable[..., Any], unique_id: str) -> None:
    """Register `handler` for `event` on every client made here, before and after this call."""
    if any(h[2] == unique_id for h in _HOOKS):
        return
    _HOOKS.append((event, handler, unique_id))
    for made in list(_clients.values()):
        made.meta.events.register(event, handler, unique_id=unique_id)
    for service in list(_made_unretried):
        unretried(service).meta.events.register(event, handler, unique_id=unique_id)


_clients: dict[tuple[str, str], Any] = {}  # by service and AWS_MAX_ATTEMPTS when it was made
_made_unretried: set[str] = set()


def make(service: str, session: Any = None, config: dict[str, Any] | None = None, **kw: Any) -> Any:
    """A new client of `service` with its retry policy, or `config` (from `session`, default
    boto3's; `kw`: endpoint_url, region_name, ...): what the CLI makes per command."""
    import boto3
    from botocore.config import Config

    if session is None and "region_name" not in kw and os.environ.get("AWS_REGION"):
        # AWS_REGION first, as the AWS CLI v2 and Lambda read it; botocore reads only AWS_DEFAULT_REGION
        kw["region_name"] = os.environ["AWS_REGION"]
    c = (session or boto3).client(service, config=Config(**(config or _config(service))), **kw)
    for event, handler, unique_id in _HOOKS:
        c.meta.events.register(event, handler, unique_id=unique_id)
    return c


def client(service: str) -> Any:
    """The process's client of `service` (a handler's, kept while the sandbox is warm; made again
    when AWS_MAX_ATTEMPTS changes, as the local engine's faults change it between invocations)."""
    key = (service, os.environ.get(MAX_ATTEMPTS_ENV, ""))
    made = _clients.get(key)
    if made is None:
        made = _clients[key] = make(service)
    return made


@functools.cache
def unretried(service: str) -> Any:
    """The process's client of `service` without botocore's retries: for a caller that retries
    on its own terms (the ledger's ATTEMPT write, smlt.runtime.ledger)."""
    _made_unretried.add(service)
    return make(service, config={"retries": {"total_max_attempts": 1, "mode": "standard"}})


def reset() -> None:
    """Forget every client (a test or a benchmark that moved AWS_ENDPOINT_URL)."""
    _clients.clear()
    unretried.cache_clear()
    _made_unretried.clear()
