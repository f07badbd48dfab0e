"""Answers botocore takes from a `before-send` handler instead of sending the request: the Invoke
seam (`invoke.py`) and the injected AWS conflicts (`conflicts.py`) both build them."""

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
