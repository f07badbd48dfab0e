"""botocore `before-send` handlers that answer instead of sending the request: how to put one
first, and the raw body its answer carries. The Invoke seam (`invoke.py`) and the injected AWS
conflicts (`conflicts.py`) both use them."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import botocore.handlers


class RawBody(io.BytesIO):
    """What botocore expects as ``AWSResponse.raw`` (a urllib3-like stream)."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        chunk = self.read()
        while chunk:
            yield chunk
            chunk = self.read()


def put_first(event: str, handler: Any, unique_id: str) -> None:
    """Make `handler` the first of `event`'s handlers: in botocore's built-in handlers (sessions
    created from now on) and on boto3's default session if it already exists (created before the
    insertion, it lacks it). Call once per process: botocore calls *every* handler of an event
    (the first non-None answer wins), so a second registration would answer twice."""
    entry = (event, handler)
    if entry not in botocore.handlers.BUILTIN_HANDLERS:
        botocore.handlers.BUILTIN_HANDLERS.insert(0, entry)
    import boto3

    if boto3.DEFAULT_SESSION is not None:
        boto3.DEFAULT_SESSION.events.register_first(event, handler, unique_id=unique_id)
