"""Per-request costs of moto 5.2.5 that the local engine pays on every round, removed with small,
documented monkeypatches (same answers, less work). Refused on any other moto version, and every
patched attribute is looked up first: an upgrade that moves them fails loudly.

Measured with ``bench/local_bench.py``'s overhead probe (8 workers, no-op compute) and py-spy on
the engine's process: about two thirds of that process's busy time was moto's HTTP server, and
every handler's S3/DynamoDB call waits on it.

1. *Service routing*: ``DomainDispatcherApplication.get_backend_for_host`` lists moto's package
   directory (``os.listdir`` + ``isdir`` of ~190 entries) and then tries hundreds of URL regexes
   on every request, under the dispatcher's lock, to map a host name to a backend. The mapping
   is a pure function of the host (the patterns are fixed when the app is built): it is
   memoised per dispatcher.
2. *Lambda clients of the interpreter*: ``boto_client_for`` builds a new boto3 client (service
   model, endpoint resolver, an SSL context...) for every Lambda task the interpreter runs. The
   client it builds depends only on (region, service, whether moto's in-process stubber is on,
   ``MOTO_PORT``), and botocore clients are thread-safe: one is kept per key. (The credentials
   argument is ignored by moto's function too.)
3. *JSONPath parsing*: ``jsonpath_ng.ext.parse`` builds a new PLY parser (reading its LR tables)
   for every path the interpreter evaluates (InputPath, Parameters ``.$`` fields, ResultSelector,
   ResultPath, Choice variables...). Parsed expressions are immutable; they are cached per path
   string in the two modules that parse.
4. *TransactWriteItems*: to roll back a cancelled transaction, moto deep-copies every table the
   transaction names, whole, before it starts: O(items in the table) per call, growing with every
   round (each worker records its result with one transaction) and under the DynamoDB write lock
   (``moto_fixes``), so every write of every handler waits for it. The copy is replaced by an
   equivalent snapshot for the rollback: a shallow copy of the table object with its own item
   containers, holding deep copies of exactly the items the transaction can change (its keys);
   items it does not name are never changed by it. Tables with a stream fall back to moto's full
   copy (their stream records are part of the state a rollback restores).
5. *Nagle*: werkzeug writes a response's headers and body with separate ``send`` calls on an
   unbuffered socket; with Nagle's algorithm on, the body waits for the client's (delayed) ACK of
   the headers. The server's accepted sockets get ``TCP_NODELAY`` (as urllib3 already sets on
   the client side); see :func:`nodelay` (applied by ``server.MotoServer.start``).
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from typing import Any

from .limits import MOTO_VERSION, MotoVersionError

_lock = threading.Lock()
_installed = False


def enabled() -> bool:
    """``SMLT_LOCAL_SPEEDUPS=0`` turns these patches off (to measure what they save; set it
    before the engine starts, in a fresh process)."""
    return os.environ.get("SMLT_LOCAL_SPEEDUPS", "1") != "0"


def _check_version() -> None:
    import moto

    if moto.__version__ != MOTO_VERSION:
        raise MotoVersionError(f"smlt.local.speed patches moto {MOTO_VERSION}; found moto "
                               f"{moto.__version__} (re-check the patched functions, then update)")


def install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _check_version()
        _patch_backend_for_host()
        _patch_boto_client_for()
        _patch_jsonpath_parse()
        _patch_transact_snapshot()
        _installed = True


def _patch_backend_for_host() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    orig = DomainDispatcherApplication.get_backend_for_host

    @functools.wraps(orig)
    def get_backend_for_host(self: Any, host: str | None) -> Any:
        if host is None:
            return None
        cache = self.__dict__.setdefault("_smlt_backend_for_host", {})
        try:
            return cache[host]
        except KeyError:
            backend = orig(self, host)
            cache[host] = backend
            return backend

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host


def _patch_boto_client_for() -> None:
    from moto.core.models import botocore_stubber
    from moto.settings import moto_server_port
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
    from moto.stepfunctions.parser.asl.utils import boto_client

    orig = boto_client.boto_client_for
    if lambda_eval_utils.boto_client_for is not orig:
        raise MotoVersionError("moto's lambda_eval_utils no longer uses boto_client_for")
    clients: dict[tuple[str, str, bool, str], Any] = {}
    clients_lock = threading.Lock()

    @functools.wraps(orig)
    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        key = (region, service, bool(botocore_stubber.enabled), str(moto_server_port()))
        c = clients.get(key)
        if c is None:
            with clients_lock:
                c = clients.get(key)
                if c is None:
                    c = clients[key] = orig(region=region, service=service,
                                            state_credentials=state_credentials)
        return c

    # Only the Lambda task path: other integrations keep moto's own behaviour.
    lambda_eval_utils.boto_client_for = boto_client_for


def _patch_jsonpath_parse() -> None:
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.utils import json_path

    for module in (json_path, result_path):
        orig = module.parse  # AttributeError if moto moved it: fail loudly
        module.parse = functools.lru_cache(maxsize=4096)(orig)


def _patch_transact_snapshot() -> None:
    import copy as real_copy
    from collections import defaultdict

    from moto.dynamodb import models as ddb_models
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    backend_cls = ddb_models.DynamoDBBackend
    orig = backend_cls.transact_write_items
    if ddb_models.copy is not real_copy:
        raise MotoVersionError("moto.dynamodb.models no longer uses the copy module as expected")
    local = threading.local()

    def snapshot(table: Any, keys: list[dict[str, Any]]) -> Any:
        if getattr(table, "stream_shard", None) is not None:
            return real_copy.deepcopy(table)
        snap = real_copy.copy(table)
        items: Any = defaultdict(dict)
        for h, v in table.items.items():
            items[h] = dict(v) if table.has_range_key else v
        snap.items = items
        for key in keys:
            try:
                h = DynamoType(key[table.hash_key_attr])
                r = DynamoType(key[table.range_key_attr]) if table.has_range_key else None
            except (KeyError, TypeError):
                return real_copy.deepcopy(table)  # malformed: moto raises later; copy as it did
            if table.has_range_key:
                if h in table.items and r in table.items[h]:
                    items[h][r] = real_copy.deepcopy(table.items[h][r])
            elif h in table.items:
                items[h] = real_copy.deepcopy(table.items[h])
        return snap

    class _CopyModule:
        """``copy`` as moto.dynamodb.models sees it: deepcopy of a Table inside
        transact_write_items takes the snapshot above; everything else is the real module."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real_copy, name)

        @staticmethod
        def deepcopy(x: Any, memo: Any = None) -> Any:
            touched = getattr(local, "touched", None)
            if touched is not None and isinstance(x, Table):
                return snapshot(x, touched.get(x.name, []))
            return real_copy.deepcopy(x, memo)

    @functools.wraps(orig)
    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        touched: dict[str, list[dict[str, Any]]] = {}
        for item in transact_items:
            for op_type, op in item.items():
                if not isinstance(op, dict) or not op.get("TableName"):
                    continue
                table = self.tables.get(op["TableName"])
                if op_type == "Put" and table is not None and isinstance(op.get("Item"), dict):
                    attrs = op["Item"]
                    key = {a: attrs[a] for a in (table.hash_key_attr, table.range_key_attr)
                           if a and a in attrs}
                else:
                    key = op.get("Key") or {}
                touched.setdefault(op["TableName"], []).append(key)
        local.touched = touched
        try:
            return orig(self, transact_items)
        finally:
            local.touched = None

    ddb_models.copy = _CopyModule()  # type: ignore[assignment]
    backend_cls.transact_write_items = transact_write_items


def nodelay(wsgi_server: Any) -> None:
    """Set TCP_NODELAY on every connection ``wsgi_server`` (a ``socketserver.TCPServer``) accepts."""
    orig = wsgi_server.get_request

    def get_request() -> tuple[socket.socket, Any]:
        conn, addr = orig()
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return conn, addr

    wsgi_server.get_request = get_request
