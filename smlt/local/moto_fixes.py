"""Thread-safety for moto's DynamoDB and S3 conditional writes under the threaded server.

moto's `transact_write_items` deep-copies the table to roll back on failure; a concurrent
`put_item` from another request thread changes the table during the copy ("dictionary changed
size during iteration", a 500 that botocore then retries), and a query iterating a partition
while another thread inserts into it fails the same way. DynamoDB itself is consistent under
concurrency; here every table operation takes one lock (they are short next to the HTTP hop).

S3's conditional PutObject (``If-None-Match: *``, ``If-Match``) is atomic on AWS: of racing writers
one wins, the others get 412 (or 409, ``smlt.local.conflicts``). moto checks the key and then
writes it in two steps, so two racing writers can both win once writing a body takes a moment (a
spilled body is a file write, ``memory.py``); conditional puts take one lock around both steps.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
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
    "execute_statement",
    "execute_transaction",
    "batch_execute_statement",
)
# Called with the lock held before each outermost operation, when no operation is under way
# (memory.freeze_cold: items may be stored as bytes only while nobody holds one to change).
BEFORE_OPERATION: list[Callable[[], None]] = []
_depth = [0]  # operations under way in the thread holding the lock (they nest: a batch calls put_item)


def patch_dynamodb_lock() -> None:
    from moto.dynamodb.models import DynamoDBBackend

    for name in OPERATIONS:
        orig = getattr(DynamoDBBackend, name)

        @functools.wraps(orig)
        def locked(self: Any, *args: Any, __orig: Any = orig, **kwargs: Any) -> Any:
            with _lock:
                if not _depth[0]:
                    for hook in BEFORE_OPERATION:
                        hook()
                _depth[0] += 1
                try:
                    return __orig(self, *args, **kwargs)
                finally:
                    _depth[0] -= 1

        setattr(DynamoDBBackend, name, locked)


def _cased(obj: Any, first: Any) -> Any:
    if not isinstance(obj, dict):
        return obj
    for key in [k for k in obj if isinstance(k, str) and k]:
        obj[first(key[0]) + key[1:]] = obj.pop(key)
    return obj


def patch_sfn_start_execution_case() -> None:
    """`states:startExecution(.sync/.sync:2)` tasks: moto hands the ASL's parameters (StateMachineArn,
    Name, Input) to boto3 as written and returns boto3's answer (executionArn, ...) as is, where AWS
    maps both between the ASL's PascalCase and the API's camelCase; its own .sync resolver then
    looks for ExecutionArn. The study state machine starts the training machine's executions so."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sfn import (
        StateTaskServiceSfn,
    )

    orig = StateTaskServiceSfn._normalise_parameters

    def params(self: Any, parameters: dict, boto_service_name: Any = None, service_action_name: Any = None) -> None:
        orig(self, parameters, boto_service_name, service_action_name)
        _cased(parameters, str.lower)

    def response(self: Any, response: Any, boto_service_name: Any = None, service_action_name: Any = None) -> None:
        _cased(response, str.upper)

    StateTaskServiceSfn._normalise_parameters = params  # type: ignore[method-assign]
    StateTaskServiceSfn._normalise_response = response  # type: ignore[method-assign]


_s3_lock = threading.Lock()


def patch_s3_conditional_put() -> None:
    from moto.s3.responses import S3Response

    orig = S3Response.put_object

    @functools.wraps(orig)
    def put_object(self: Any) -> Any:
        if "If-None-Match" in self.headers or "If-Match" in self.headers:
            with _s3_lock:
                return orig(self)
        return orig(self)

    S3Response.put_object = put_object  # type: ignore[method-assign]  # the one replacement
