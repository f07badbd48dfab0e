"""Per-request costs of moto 5.2 that the local engine pays on every round, removed with small,
documented monkeypatches (same answers, less work). Listed in :mod:`smlt.local.patches` with
the tests that compare each one's answers with moto's own (the gate of a moto upgrade).

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

Item-sized costs (``bench/moto_calls.py`` measures them, patched against unpatched):

6. *DynamoDB responses*: moto 5.2's generic serializer walks every AttributeValue of every
   returned item through the botocore model, trying each of the 10 members of the structure
   through 6 alias providers (new botocore Shape objects at every level: the shape is recursive):
   ~0.1 ms per value, 15 ms for one 2 KB item, ~1 s for a 75-item Query. The values are already
   in their wire form ({type: value}, from ``dynamo_to_dict``); the patch writes that form
   directly, with the serializer's own conversions (base64 for B/BS), and leaves anything else
   (a None, an unknown key, a wrong type) to moto. Its ``dynamo_to_dict`` (run on every response
   before that) re-imports DynamoType and tests datetime/to_json/dict/list at every node: the
   same conversion is done by exact type, anything unusual going to moto's function.
7. *Query*: ``Table.query`` sorts the whole table (every partition) by (hash, range) key to pick
   one partition, computes ``Item.size()`` of every item of the partition (matching the key
   condition or not; ``DynamoType.size`` re-wraps every map value, copying its subtree), and
   deep-copies the results with ``copy.deepcopy``. The patch takes the partition from the
   table's dict, sorts it by range key in C (same comparisons, same stable order), runs moto's
   Limit / 1 MB / range-condition loop unchanged except that an item's size is computed only
   when it can decide something (items are at most 405,000 bytes: LimitedSizeDict checks every
   write, and the two ways to grow an item past it in place, nested updates, are watched: one
   oversized item turns this off), and copies the results like Item/DynamoType.__deepcopy__ do
   without deepcopy's per-node dispatch. Index queries and QueryFilter go to moto's function.
   Sorting and testing the whole partition still made a Query O(partition): a run keeps all of
   its items in one partition (~9 a round), so a 1,000-round run's Queries went from 13 to 120 ms
   (``bench/long_run.py``); DynamoDB reads a range of the sort key. The partition now keeps its
   keys in order (``sorted_keys.SortedPartition``, updated by every write), a key condition is
   bisected to its interval, and moto's loop runs over that interval and the item after it, with
   the same answer (see ``_key_range_query`` for why nothing outside can change a page).
8. *S3 ranged GET*: ``get_object`` reads the whole value (``FakeKey.value``: the spooled file,
   44 MB for a model) and ``_handle_range_header`` then slices it. During a ranged GET the value
   is handed over as a view that reads only the requested bytes (seek + read, under the key's
   lock, as ``FakeKey.value`` reads); moto's own range logic (suffix, open-ended, clamping,
   multi-range or unparsable -> 200, 416) is unchanged, and a view it does not slice is read
   whole before it leaves.
9. *S3 large PUT*: a value larger than the key's SpooledTemporaryFile threshold is written to
   its BytesIO, copied out (getvalue) and written again to the rolled-over file; the patch rolls
   the (empty) buffer over first, so the value is written once, to the same kind of file.
10. *Model instance tracking*: every moto model object (``BaseModel``) is appended, on creation,
   to its class's ``instances_tracked`` list, for moto's dashboard, and never removed: each
   transaction's rollback snapshot (4 above: a Table with its own copies of the partitions) and
   every copied query result stay in memory for good, so a long run's engine grew by ~0.5 MB a
   round, faster as the table grew (``bench/long_run.py``). Only S3's keys and multipart uploads
   are still tracked: moto's S3 reset closes the files of the keys it tracked.
11. *Interpreter threads*: the ASL interpreter appends every thread it starts (an execution, a
   Map iteration, a branch: ~9 a round) to ``TMP_THREADS`` and never removes one, keeping each
   finished thread and what its target holds. The list drops finished threads as it grows.
12. *S3 listing*: ``list_objects_v2`` walks every key of the bucket (copying the key store and
   testing each name against the prefix), then sorts the matches and drops those up to
   StartAfter: O(bucket) per request, 2.3 -> 6.2 ms from 300 to 3,000 keys, and a run adds ~5
   keys a round while the local state's save lists the run's prefix after its last key every
   round. S3 reads a key range. Without a delimiter, the patch bisects a sorted copy of the
   bucket's key names (built once, then a name added or removed is inserted or taken out) to the names after
   StartAfter (or the continuation token's key) under the prefix, and hands moto's own
   truncation the same sorted keys moto would have (delete markers left out, as moto does);
   with a delimiter, or a token moto does not know, moto answers.
"""

from __future__ import annotations

import bisect
import copy
import functools
import itertools
import os
import socket
import threading
from typing import Any

from .errors import MotoVersionError

# (owner, attribute, what moto had) for the patches that go through _replace (the tests put
# moto's back for a moment to compare answers)
_ORIGINALS: list[tuple[Any, str, Any]] = []


def _replace(owner: Any, name: str, new: Any) -> None:
    """``owner.name = new``; moto's own attribute is recorded (None: inherited, not owner's)."""
    if not hasattr(owner, name):
        raise MotoVersionError(f"moto's {owner.__name__}.{name} is gone")
    _ORIGINALS.append((owner, name, vars(owner).get(name)))
    setattr(owner, name, new)


def enabled() -> bool:
    """``SMLT_LOCAL_SPEEDUPS=0`` turns these patches off (to measure what they save; set it
    before the engine starts, in a fresh process)."""
    return os.environ.get("SMLT_LOCAL_SPEEDUPS", "1") != "0"


def patch_backend_for_host() -> None:
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

    dispatcher: Any = DomainDispatcherApplication
    dispatcher.get_backend_for_host = get_backend_for_host


def patch_boto_client_for() -> None:
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
                    c = clients[key] = orig(region=region, service=service, state_credentials=state_credentials)
        return c

    # Only the Lambda task path: other integrations keep moto's own behaviour.
    lambda_eval_utils.boto_client_for = boto_client_for


def patch_jsonpath_parse() -> None:
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.utils import json_path

    modules: tuple[Any, ...] = (json_path, result_path)
    for module in modules:
        module.parse = functools.lru_cache(maxsize=4096)(module.parse)


def _table_snapshot(table: Any, keys: list[dict[str, Any]]) -> Any:
    """What a rollback of a transaction naming ``keys`` needs of ``table``: a shallow copy with its
    own item containers and deep copies of exactly those items (the full copy for a table with a
    stream or a malformed key, as moto makes it)."""
    import copy as real_copy
    from collections import defaultdict

    from moto.dynamodb.models.dynamo_type import DynamoType

    from .memory import CompactPartition

    if getattr(table, "stream_shard", None) is not None:
        return real_copy.deepcopy(table)
    snap = real_copy.copy(table)
    items: Any = defaultdict(dict)
    for h, v in table.items.items():
        # a partition whose keys are kept in order (sorted_keys) is copied with its order
        items[h] = (v.copy() if isinstance(v, CompactPartition) else dict(v)) if table.has_range_key else v
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


def _touched_keys(backend: Any, transact_items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Table name -> the keys a TransactWriteItems request names in it."""
    touched: dict[str, list[dict[str, Any]]] = {}
    for item in transact_items:
        for op_type, op in item.items():
            if not isinstance(op, dict) or not op.get("TableName"):
                continue
            table = backend.tables.get(op["TableName"])
            if op_type == "Put" and table is not None and isinstance(op.get("Item"), dict):
                attrs = op["Item"]
                key = {a: attrs[a] for a in (table.hash_key_attr, table.range_key_attr) if a and a in attrs}
            else:
                key = op.get("Key") or {}
            touched.setdefault(op["TableName"], []).append(key)
    return touched


def patch_instance_tracking() -> None:
    from moto.core.common_models import BaseModel
    from moto.s3.models import FakeKey, FakeMultipart

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        instance = super(BaseModel, cls).__new__(cls)
        if issubclass(cls, (FakeKey, FakeMultipart)):
            cls.instances_tracked.append(instance)
        return instance

    _replace(BaseModel, "__new__", staticmethod(__new__))


class _LiveThreads(list):
    """moto's TMP_THREADS: a new thread first drops the finished ones (nothing reads the list)."""

    def append(self, thread: Any) -> None:
        self[:] = [t for t in self if t.is_alive()]
        super().append(thread)


def patch_finished_threads() -> None:
    import importlib
    import sys

    utils: Any = importlib.import_module("moto.stepfunctions.parser.utils")
    old, live = utils.TMP_THREADS, _LiveThreads(utils.TMP_THREADS)
    # The interpreter's modules import the list by name: each one imported already gets the new one.
    for module in list(sys.modules.values()):
        if getattr(module, "TMP_THREADS", None) is old:
            setattr(module, "TMP_THREADS", live)  # noqa: B010 - a module attribute


def patch_transact_snapshot() -> None:
    import copy as real_copy

    from moto.dynamodb import models as ddb_models
    from moto.dynamodb.models.table import Table

    backend_cls: Any = ddb_models.DynamoDBBackend
    orig = backend_cls.transact_write_items
    if ddb_models.copy is not real_copy:
        raise MotoVersionError("moto.dynamodb.models no longer uses the copy module as expected")
    local = threading.local()

    class _CopyModule:
        """``copy`` as moto.dynamodb.models sees it: deepcopy of a Table inside
        transact_write_items takes the snapshot above; everything else is the real module."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real_copy, name)

        @staticmethod
        def deepcopy(x: Any, memo: Any = None) -> Any:
            touched = getattr(local, "touched", None)
            if touched is not None and isinstance(x, Table):
                return _table_snapshot(x, touched.get(x.name, []))
            return real_copy.deepcopy(x, memo)

    @functools.wraps(orig)
    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        touched = _touched_keys(self, transact_items)
        local.touched = touched
        try:
            return orig(self, transact_items)
        finally:
            local.touched = None

    models: Any = ddb_models  # its ``copy`` is the module's name for the stdlib module
    models.copy = _CopyModule()
    backend_cls.transact_write_items = transact_write_items


_HELPERS: dict[str, Any] = {}  # item_size, copy_items (for the tests)
_ITEM_SIZE_BOUND = 405000  # moto's item size limit (LimitedSizeDict)
_OVERSIZED = threading.Event()  # some item passed it (see _patch_table_query)


class _Generic(Exception):
    """This value is not in the canonical form the fast path handles: let moto serialize it."""


def _sets_and_binaries(serializer: Any, t: str, v: Any, tv: type) -> Any:
    """The wire form of an SS/NS/B/BS value (base64 by the serializer's own function)."""
    if t == "SS" or t == "NS":
        if tv is not list or any(type(x) is not str for x in v):
            raise _Generic
        return list(v)
    if t == "B":
        if tv is not bytes and tv is not str:
            raise _Generic
        return serializer._base64(v)
    if t == "BS":
        if tv is not list or any(type(x) is not bytes and type(x) is not str for x in v):
            raise _Generic
        return [serializer._base64(x) for x in v]
    raise _Generic


def patch_attribute_value_serializer() -> None:
    from moto.core import serialize

    orig = serialize.BaseJSONSerializer._serialize_type_structure

    def attribute_value(self: Any, value: Any) -> dict[str, Any]:
        if type(value) is not dict or len(value) != 1:
            raise _Generic
        ((t, v),) = value.items()
        tv = type(v)
        if t == "S" or t == "N":
            if tv is not str:
                raise _Generic
        elif t == "M":
            if tv is not dict:
                raise _Generic
            v = {k: attribute_value(self, x) for k, x in v.items()}
        elif t == "L":
            if tv is not list:
                raise _Generic
            v = [attribute_value(self, x) for x in v]
        elif t == "BOOL" or t == "NULL":
            if tv is not bool:
                raise _Generic
        else:
            v = _sets_and_binaries(self, t, v, tv)
        return {t: v}

    @functools.wraps(orig)
    def _serialize_type_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == "AttributeValue" and self.service_model.service_name == "dynamodb":
            try:
                serialized[key] = attribute_value(self, value)
                return
            except _Generic:
                pass
        orig(self, serialized, value, shape, key)

    _replace(serialize.JSONSerializer, "_serialize_type_structure", _serialize_type_structure)


def _blank(cls: Any) -> Any:
    """An instance of ``cls`` without __init__, through the class's own __new__ (moto's BaseModel
    tracks its instances there), as moto's __deepcopy__ makes them."""
    return cls.__new__(cls)


class _ItemOps:
    """Item copies as moto makes them, without deepcopy's per-node costs (moto's classes are
    passed in once, at install)."""

    def __init__(self) -> None:
        from moto.dynamodb.models.dynamo_type import DynamoType, Item, LimitedSizeDict

        # moto's classes, typed Any: instances are built field by field (``__new__``), as moto's
        # own __deepcopy__ does
        self.DynamoType: Any = DynamoType
        self.Item: Any = Item
        self.LimitedSizeDict: Any = LimitedSizeDict

    @staticmethod
    def item_size(item: Any) -> int:
        return int(item.size())  # moto's own (only computed when a size can decide something)

    def copy_items(self, items: list[Any]) -> list[Any]:
        """``copy.deepcopy(items)`` as Item.__deepcopy__ and DynamoType.__deepcopy__ make it (new
        Item, key and attribute values; list and map values copied, set values as new lists,
        scalars shared), without deepcopy's per-node dispatch and memo. The memo only kept
        objects shared between items shared in the copy; query results are only read."""
        return [self._copy_item(item) for item in items]

    def _copy_item(self, item: Any) -> Any:
        Item = self.Item
        if type(item) is not Item:
            return copy.deepcopy(item)
        try:
            new = _blank(Item)
            new.hash_key = self._copy_av(item.hash_key)
            new.range_key = None if item.range_key is None else self._copy_av(item.range_key)
            attrs = self.LimitedSizeDict.__new__(self.LimitedSizeDict)
            dict.__init__(attrs)
            for k, v in item.attrs.items():
                dict.__setitem__(attrs, k, self._copy_av(v))
            new.attrs = attrs
        except _Generic:
            new = copy.deepcopy(item)
        return new

    def _copy_av(self, d: Any) -> Any:
        DynamoType = self.DynamoType
        if type(d) is not DynamoType:
            raise _Generic
        new = _blank(DynamoType)
        t = new.type = d.type
        v = d.value
        if t == "L":
            new.value = [self._copy_av(x) for x in v]
        elif t == "M":
            new.value = {k: self._copy_av(x) for k, x in v.items()}
        elif t == "SS" or t == "NS" or t == "BS":
            new.value = list(v)
        else:
            new.value = v
        return new


def _watch(fn: Any, item_of: Any, item_size: Any) -> Any:
    """``fn``, followed by a size check of the item it changed: past the bound, set _OVERSIZED."""

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        finally:
            item = item_of(self, args, kwargs)
            if item is not None:
                try:
                    if item_size(item) > _ITEM_SIZE_BOUND:
                        _OVERSIZED.set()
                except Exception:
                    _OVERSIZED.set()

    return wrapper


def _partition(table: Any, hash_key: Any, scan_index_forward: Any) -> list[Any]:
    """The items moto's Table.query considers, in its order. moto sorts every item of the table
    by (hash, range) key, keeps those whose hash key equals hash_key, and sorts them (stably) by
    range key: that is the one partition holding hash_key (dict keys are unique under DynamoType
    equality), in its own order, sorted stably by range key. Sorting by ``cast_value`` makes the
    same ``<`` comparisons as DynamoType.__lt__, in C."""
    from moto.dynamodb.models.dynamo_type import Item

    part = table.items.get(hash_key)
    if part is None:
        candidates: list[Any] = []
    elif table.range_key_attr:
        candidates = [i for i in part.values() if isinstance(i, Item) and i.hash_key == hash_key]
    else:
        candidates = [i for i in [part] if isinstance(i, Item) and i.hash_key == hash_key]
    if len(candidates) > 1:
        candidates.sort(key=lambda i: i.range_key.cast_value)
    if scan_index_forward is False:
        candidates.reverse()
    return candidates


def _range_matcher(range_comparison: Any, range_objs: Any, range_key_conditions: Any) -> Any:
    """moto's range-key test of an item (None: no range condition)."""
    if not range_comparison:
        return None
    from moto.dynamodb import comparisons
    from moto.dynamodb.models.dynamo_type import DynamoType

    last_range_key_name = range_key_conditions[-1][0] if range_key_conditions else None
    compare = comparisons.get_comparison_func(range_comparison)
    range_values = [o.cast_value for o in range_objs]

    def matches(result: Any) -> bool:
        value = result.attrs.get(last_range_key_name) if last_range_key_name else None
        if not value:
            value = result.range_key
        if type(value) is DynamoType:
            return bool(compare(value.cast_value, *range_values))
        return bool(value.compare(range_comparison, range_objs))

    return matches


def _query_loop(
    table: Any, candidates: list[Any], matches: Any, limit: Any, exclusive_start_key: Any, scan_index_forward: Any
) -> tuple[list[Any], int, Any, int]:
    """moto's loop for a table (not index) query without QueryFilter. It checks the Limit and the
    1 MB result size (adding the size of the item in hand, matching or not) before the range
    condition; the size is computed only when it can decide something. Also returns the results'
    size as far as it was computed (exact whenever it could decide something)."""
    from moto.dynamodb.models import table as table_module

    item_size = _HELPERS["item_size"]
    hash_attrs, range_attrs = [table.hash_key_attr], [table.range_key_attr]
    size_limit = table_module.RESULT_SIZE_LIMIT
    bounded = not _OVERSIZED.is_set()
    results: list[Any] = []
    result_size = 0
    scanned_count = 0
    last_evaluated_key = None
    processing_previous_page = exclusive_start_key is not None
    for result in candidates:
        if processing_previous_page:
            if table._item_comes_before_dct(result, exclusive_start_key, hash_attrs, range_attrs, scan_index_forward):
                continue
            processing_previous_page = False
        size = None if bounded and result_size + _ITEM_SIZE_BOUND <= size_limit else item_size(result)
        if len(results) == limit or (size is not None and result_size + size > size_limit):
            last_evaluated_key = table._get_last_evaluated_key(results[-1], None)
            break
        if matches is not None and not matches(result):
            continue
        results.append(result)
        result_size += item_size(result) if size is None else size
        scanned_count += 1
    return results, scanned_count, last_evaluated_key, result_size


def _key_range_query(
    table: Any, hash_key: Any, condition: tuple[Any, Any, Any], matches: Any, page: tuple[Any, Any, bool]
) -> tuple[list[Any], int, Any] | None:
    """moto's loop of a table Query run over the items of its key range only (the partition's
    keys kept in order, :mod:`smlt.local.sorted_keys`), with the same results, count and
    LastEvaluatedKey as over the whole sorted partition. The matching items are one interval of
    the order. Before it, moto's loop only passes over items: none can end a page there (Limit
    >= 1, no result yet, every item within the size bound), and the ExclusiveStartKey's place is
    found by bisecting with moto's own test. After it, the first item decides the Limit check and
    the others can end the page by size only, which is checked over them when it could. None: a
    case left to moto's loop over the whole partition."""
    from moto.dynamodb import comparisons
    from moto.dynamodb.models import table as table_module
    from moto.dynamodb.models.dynamo_type import Item

    from .memory import CompactPartition
    from .sorted_keys import SortedPartition, Unordered, first_true, key_range

    range_comparison, range_objs, range_key_conditions = condition
    limit, esk, forward = page
    size_limit = table_module.RESULT_SIZE_LIMIT
    last_name = range_key_conditions[-1][0] if range_key_conditions else None
    if (
        not table.range_key_attr
        or last_name not in (None, table.range_key_attr)
        or _OVERSIZED.is_set()
        or size_limit < _ITEM_SIZE_BOUND
        or (limit is not None and not (type(limit) is int and limit >= 1))
    ):
        return None
    part = table.items.get(hash_key)
    if type(part) in (dict, CompactPartition):  # moto's (or restored by a rollback): the same items, in order
        part = table.items[hash_key] = SortedPartition(dict(part))
    if type(part) is not SortedPartition:
        return None
    try:
        casts, keys = part.order()
        lo, hi = 0, len(keys)
        if range_comparison:
            compare = comparisons.get_comparison_func(range_comparison)
            lo, hi = key_range(casts, compare, [o.cast_value for o in range_objs])
    except Unordered:
        return None
    n = len(keys)

    def at(j: int) -> Any:  # the j-th item in the scan's direction
        return part[keys[j] if forward else keys[n - 1 - j]]

    start = 0
    if esk is not None:
        attrs = [table.hash_key_attr], [table.range_key_attr]
        start = first_true(n, lambda j: not table._item_comes_before_dct(at(j), esk, *attrs, forward))
    first, end = (lo, hi) if forward else (n - hi, n - lo)
    a, b = max(start, first), min(n, end + 1)  # the range, and the item after it (moto's Limit check)
    candidates = [at(j) for j in range(a, b)]
    if not all(type(i) is Item and i.hash_key == hash_key for i in candidates):
        return None
    results, scanned, last_key, size = _query_loop(table, candidates, matches, limit, None, forward)
    if last_key is None and b < n and size + _ITEM_SIZE_BOUND > size_limit:
        # near 1 MB: an item after the range could still end the page by its size, as in moto
        results, scanned, last_key, _ = _query_loop(table, [at(j) for j in range(a, n)], matches, limit, None, forward)
    return results, scanned, last_key


def patch_table_query() -> None:
    from moto.dynamodb.models.dynamo_type import DynamoType, Item
    from moto.dynamodb.models.table import Table
    from moto.dynamodb.parsing.executors import UpdateExpressionExecutor

    ops = _ItemOps()
    orig = Table.query

    # Every item's size is at most _ITEM_SIZE_BOUND: LimitedSizeDict checks the whole item on
    # every top-level set (Item() builds its attrs that way; PartiQL and transactions write
    # through put_item/update_item). Only an update expression or AttributeUpdates changing a
    # nested value in place can pass it: those two are watched, and one oversized item turns the
    # shortcut in _query_loop off for good.
    _replace(
        UpdateExpressionExecutor,
        "execute",
        _watch(
            UpdateExpressionExecutor.execute,
            lambda ex, args, kwargs: ex.item if not args and kwargs.get("node") is None else None,
            ops.item_size,
        ),
    )
    _replace(
        Item,
        "update_with_attribute_updates",
        _watch(Item.update_with_attribute_updates, lambda item, args, kwargs: item, ops.item_size),
    )

    @functools.wraps(orig)
    def query(
        self: Any,
        hash_key: Any,
        range_comparison: Any,
        range_objs: Any,
        limit: Any,
        exclusive_start_key: Any,
        scan_index_forward: Any,
        projection_expressions: Any,
        index_name: Any = None,
        consistent_read: bool = False,
        filter_expression: Any = None,
        hash_key_conditions: Any = None,
        range_key_conditions: Any = None,
        **filter_kwargs: Any,
    ) -> Any:
        if index_name or filter_kwargs or type(hash_key) is not DynamoType or hash_key.type not in ("S", "N", "B"):
            return orig(
                self,
                hash_key,
                range_comparison,
                range_objs,
                limit,
                exclusive_start_key,
                scan_index_forward,
                projection_expressions,
                index_name,
                consistent_read,
                filter_expression,
                hash_key_conditions=hash_key_conditions,
                range_key_conditions=range_key_conditions,
                **filter_kwargs,
            )
        matches = _range_matcher(range_comparison, range_objs, range_key_conditions)
        found = (
            _key_range_query(
                self,
                hash_key,
                (range_comparison, range_objs, range_key_conditions),
                matches,
                (limit, exclusive_start_key, scan_index_forward),
            )
            if type(scan_index_forward) is bool
            else None
        )
        if found is None:
            candidates = _partition(self, hash_key, scan_index_forward)
            found = _query_loop(self, candidates, matches, limit, exclusive_start_key, scan_index_forward)[:3]
        results, scanned_count, last_evaluated_key = found
        results = ops.copy_items(results)
        if filter_expression is not None:
            results = [item for item in results if filter_expression.expr(item)]
        if projection_expressions:
            results = [r.project(projection_expressions) for r in results]
        return results, scanned_count, last_evaluated_key

    _HELPERS.update(item_size=ops.item_size, copy_items=ops.copy_items)
    _replace(Table, "query", query)


def patch_dynamo_to_dict() -> None:
    import base64

    from moto.dynamodb import responses as ddb_responses
    from moto.dynamodb.models.dynamo_type import DynamoType, LimitedSizeDict
    from moto.dynamodb.models.utilities import dynamo_to_dict as orig

    plain = (str, int, float, bool, bytes, type(None))

    @functools.wraps(orig)
    def dynamo_to_dict(obj: Any) -> Any:
        """moto's conversion of a response (DynamoType -> {type: value}, B/BS values decoded to
        bytes) with its checks (datetime? has to_json? dict? list?) made once per node by exact
        type; any other type goes to moto's function."""
        t = type(obj)
        if t is DynamoType:
            k, v = obj.type, obj.value
            if k == "B":
                return {"B": v if isinstance(v, bytes) else base64.b64decode(v)}
            if k == "BS":
                return {"BS": [x if isinstance(x, bytes) else base64.b64decode(x) for x in v]}
            return {k: dynamo_to_dict(v)}
        if t is dict or t is LimitedSizeDict:
            return {k: dynamo_to_dict(v) for k, v in obj.items()}
        if t is list:
            return [dynamo_to_dict(x) for x in obj]
        if t in plain:
            return obj
        return orig(obj)

    _replace(ddb_responses, "dynamo_to_dict", dynamo_to_dict)


class _KeyBytes:
    """An S3 key's value as ``S3Response._handle_range_header`` uses it (``len``, truth, one
    slice), read from the key's buffer on demand: a range costs its own bytes, not the object's."""

    __slots__ = ("key", "read_all")

    def __init__(self, key: Any, read_all: Any) -> None:
        self.key = key
        self.read_all = read_all  # moto's FakeKey.value getter: the whole value, as moto reads it

    def __len__(self) -> int:
        with self.key.lock:
            buf = self.key._value_buffer
            return buf.seek(0, os.SEEK_END)

    def __getitem__(self, index: Any) -> bytes:
        if not isinstance(index, slice):
            return self.read_all(self.key)[index]
        start, stop, step = index.indices(len(self))
        if step != 1:
            return self.read_all(self.key)[index]
        with self.key.lock:
            buf = self.key._value_buffer
            buf.seek(start)
            return buf.read(max(0, stop - start))


def patch_ranged_get() -> None:
    from moto.s3 import responses as s3_responses
    from moto.s3.models import FakeKey

    prop: Any = vars(FakeKey)["value"]  # a property: the body read from / written to its buffer
    S3Response = s3_responses.S3Response
    orig_get_object = S3Response.get_object
    orig_key_response = S3Response.key_response
    read_all = prop.fget
    local = threading.local()

    def value(self: Any) -> Any:
        if getattr(local, "lazy", False):
            local.lazy = False  # only the body get_object returns
            return _KeyBytes(self, read_all)
        return read_all(self)

    @functools.wraps(orig_get_object)
    def get_object(self: Any) -> Any:
        if self.method != "GET" or not self.headers.get("range"):
            return orig_get_object(self)
        local.lazy = True
        try:
            return orig_get_object(self)
        finally:
            local.lazy = False

    @functools.wraps(orig_key_response)
    def key_response(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        response = orig_key_response(self, request, full_url, headers)
        if isinstance(response, tuple) and len(response) == 3 and isinstance(response[2], _KeyBytes):
            # moto answered without slicing (no usable range, partNumber...): the whole value
            status, response_headers, body = response
            return status, response_headers, body.read_all(body.key)
        return response

    write = prop.fset

    def set_value(self: Any, new_value: Any) -> None:
        # moto writes the value into a SpooledTemporaryFile: into its BytesIO first, then (past
        # max_size) copies it all out (getvalue) into a real file. A value that will roll over
        # anyway is written straight to the file: the same file, one copy instead of three.
        buf = self._value_buffer
        max_size = getattr(buf, "_max_size", 0)
        if (
            max_size
            and isinstance(new_value, (bytes, bytearray))
            and len(new_value) > max_size
            and not getattr(buf, "_rolled", True)
        ):
            buf.seek(0)
            buf.truncate()
            buf.rollover()
        write(self, new_value)

    _replace(FakeKey, "value", property(value, set_value, prop.fdel, prop.__doc__))
    _replace(S3Response, "get_object", get_object)
    _replace(S3Response, "key_response", key_response)


# Guards each key store's sorted names: a write replaces the list (readers keep the one they hold,
# never mutated) and a build never interleaves with a write.
_NAMES_LOCK = threading.Lock()


def _names_changed(method: Any) -> Any:
    """``method`` of moto's key store, keeping the store's sorted names (if built) in step when a
    name comes or goes: one insertion, not a new sort of every name (a run adds ~5 keys a round
    and lists after each round, so a rebuild per change was a sort of the whole bucket a round)."""

    @functools.wraps(method)
    def changed(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = args[0] if args else None
        with _NAMES_LOCK:
            had = isinstance(key, str) and key in self
            out = method(self, *args, **kwargs)
            built = self.__dict__.get("_smlt_sorted")
            if built is None:
                return out
            if not isinstance(key, str):
                del self.__dict__["_smlt_sorted"]  # not a change by name: the next reader rebuilds
            elif had != (key in self):
                i = bisect.bisect_left(built, key)
                self.__dict__["_smlt_sorted"] = built[:i] + [key] + built[i:] if not had else built[:i] + built[i + 1 :]
        return out

    return changed


def _sorted_names(store: Any) -> list[str]:
    """The store's key names in order (built once, then kept in step by `_names_changed`)."""
    built = store.__dict__.get("_smlt_sorted")
    if built is not None:
        return built
    with _NAMES_LOCK:
        names = sorted(dict.copy(store))  # one C call, as moto's own copy of the store for its walk
        store.__dict__["_smlt_sorted"] = names
    return names


def patch_list_objects_v2() -> None:
    from moto.s3.models import FakeDeleteMarker, FakeTableStorageBucket, S3Backend
    from moto.s3.utils import _VersionedKeyStore

    orig = S3Backend.list_objects_v2

    @functools.wraps(orig)
    def list_objects_v2(
        self: Any,
        bucket: Any,
        prefix: str | None,
        delimiter: str | None,
        continuation_token: str | None,
        start_after: str | None,
        max_keys: int,
    ) -> Any:
        if delimiter or isinstance(bucket, FakeTableStorageBucket):
            return orig(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
        after = self._pagination_tokens.get(continuation_token) if continuation_token else start_after
        if continuation_token and after is None:
            return orig(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
        store, prefix = bucket.keys, prefix or ""
        names = _sorted_names(store)
        i = bisect.bisect_left(names, prefix)
        if after:
            i = max(i, bisect.bisect_right(names, after))
        found = []
        for name in itertools.islice(names, i, None):
            if not name.startswith(prefix):
                break
            versions = store.getlist(name)
            if not versions or versions[-1].name != name:  # gone since, or not what moto sorts by
                return orig(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
            if not isinstance(versions[-1], FakeDeleteMarker):
                found.append(versions[-1])
        return self._truncate_result(found, max_keys)

    for name in ("__setitem__", "setlist", "pop"):
        _replace(_VersionedKeyStore, name, _names_changed(getattr(_VersionedKeyStore, name)))
    for name in ("__delitem__", "clear", "update", "popitem", "setdefault"):
        _replace(_VersionedKeyStore, name, _names_changed(getattr(dict, name)))
    _replace(S3Backend, "list_objects_v2", list_objects_v2)


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
