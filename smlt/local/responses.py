"""botocore `before-send` handlers that answer instead of sending the request: how to register
one first (botocore's event API, on a session), and the raw body its answer carries. The Invoke seam (`invoke.py`) and the injected AWS
conflicts (`conflicts.py`) both use them."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any


class RawBody(io.BytesIO):
    """What botocore expects as ``AWSResponse.raw`` (a urllib3-like stream)."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        chunk = self.read()
        while chunk:
            yield chunk
            chunk = self.read()


def put_first(event: str, handler: Any, unique_id: str, session: Any = None) -> None:
    """Register `handler` as the first of `event`'s handlers through botocore's event API
    (``session.events.register_first``): on `session` (a boto3 Session) or, by default, on boto3's
    default session, made now if there is none. ``boto3.client()`` builds its clients from that
    session: the runtime's clients, and moto's ASL interpreter's (``boto_client_for``). A client
    copies its session's handlers when it is made, so register before making clients.
    `unique_id` makes a second registration a no-op: botocore calls *every* handler of an event
    (the first non-None answer wins), so a handler registered twice would answer twice."""
    if session is None:
        import boto3

        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        session = boto3.DEFAULT_SESSION
    session.events.register_first(event, handler, unique_id=unique_id)
