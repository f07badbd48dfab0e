"""Thread-safety for moto's DynamoDB under the threaded server.

moto's `transact_write_items` deep-copies the table to roll back on failure; a concurrent
`put_item` from another request thread changes the table during the copy ("dictionary changed
size during iteration", a 500 that botocore then retries), and a query iterating a partition
while another thread inserts into it fails the same way. DynamoDB itself is consistent under
concurrency; here every table operation takes one lock (they are short next to the HTTP hop).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_lock = threading.RLock()

OPERATIONS = (
    "put_item",
    "update_item",
    "delete_item",
    "transact_write_items",
    "batch_write_item",
    "get_item",
    "query",
    "scan",
    "batch_get_item",
    "transact_get_items",
)


def patch_dynamodb_lock() -> None:
    from moto.dynamodb.models import DynamoDBBackend

    for name in OPERATIONS:
        orig = getattr(DynamoDBBackend, name)

        @functools.wraps(orig)
        def locked(self: Any, *args: Any, __orig: Any = orig, **kwargs: Any) -> Any:
            with _lock:
                return __orig(self, *args, **kwargs)

        setattr(DynamoDBBackend, name, locked)
