"""Memory patches: what moto would keep in the engine's process for good, on disk instead.

*Histories* (``spilled-history``): a finished execution's history events leave moto's memory for a file.

moto keeps every execution's history events (the input and output of every state) for as long
as the server lives; a long run chains executions, so they add up round after round in the
engine's process (on AWS they live in the service). When an execution ends, its events are
pickled into one unlinked temporary file per process (appended, so one file handle however many
executions) and the in-memory list is emptied; GetExecutionHistory of that execution reads them
back from the file, the same events moto would have answered (moto deep-copies them per call
too). A running execution's history stays in memory (the history limit counts it; the console
reads it live). The file goes when the server stops (moto is reset then) or the process ends.

*S3 bodies* (``spilled-s3-bodies``): moto keeps an object's body in memory up to
``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE`` (5 MB by default), past it in a temporary file of its own (one
open file per object). Every body goes to one append-only spill file instead (one open file in
all); the object's metadata stays in moto. An overwritten or deleted body's bytes stay in the
file until the server stops. (A copy moto makes by pickling a key, rare, keeps its body in
memory. The files are per process and never shared with a fork: the handler processes start from
a fork server, which never holds one.)

*DynamoDB items* (``compact-dynamodb-items``): moto holds each item as an ``Item`` with a
``DynamoType`` object per attribute value (nested maps node by node): ~6 KB of small objects for
a ledger item whose JSON is ~0.5 KB, and a run keeps ~9 new items a round. The partitions of
tables with a sort key become :class:`CompactPartition`: the :data:`HOT_ITEMS` items read or
written most recently stay moto's objects; the others are stored as (type, value) tuples,
marshalled and appended to one unlinked spill file, :data:`ITEMS`, like the histories
(:class:`Frozen` keeps where they are: ~0.1 KB in memory an item, the ~0.8 KB of bytes on disk;
a re-frozen item is appended again, its old bytes stay in the file until the server stops). Any
read of one (``[]``, ``get``, ``values``, ``pop``...) gives moto the same Item again (same classes, same fields, as its own ``__deepcopy__`` builds them) and keeps
it as an object until it is cold again. Items are stored as bytes only under moto's DynamoDB lock
before an operation starts (``moto_fixes.BEFORE_OPERATION``), when no operation holds one it
could still change in place (an update changes the stored Item object). An item that is not a
plain Item / DynamoType tree stays an object.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import marshal
import os
import pickle
import tempfile
import threading
import weakref
from typing import IO, Any

_ATTR = "_smlt_spilled_history"  # (offset, length) in the spill file, on a finished Execution


class SpillFile:
    """Append-only bytes in one unlinked temporary file: ``put`` returns where, ``get`` reads it."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._end = 0
        self._lock = threading.Lock()

    def put(self, data: bytes) -> tuple[int, int]:
        with self._lock:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="smlt-spill-")
                self._end = 0
            os.pwrite(self._file.fileno(), data, self._end)
            where = (self._end, len(data))
            self._end += len(data)
            return where

    def get(self, where: tuple[int, int]) -> bytes:
        offset, length = where
        with self._lock:
            if self._file is None:
                raise LookupError("the spill file was reset: the data it held is gone")
            return os.pread(self._file.fileno(), length, offset)

    @property
    def size(self) -> int:
        """Bytes written since the last reset."""
        return self._end

    def reset(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._file, self._end = None, 0


HISTORIES = SpillFile()
BODIES = SpillFile()
ITEMS = SpillFile()  # DynamoDB items not used lately (compact-dynamodb-items)


def reset() -> None:
    """Forget everything spilled (moto was reset: nothing refers to it any more)."""
    HISTORIES.reset()
    BODIES.reset()
    ITEMS.reset()


def spill_history(execution: Any) -> None:
    """Move a finished execution's events from moto's memory to :data:`HISTORIES`."""
    worker = getattr(execution, "exec_worker", None)
    manager = getattr(getattr(worker, "env", None), "event_manager", None)
    if manager is None or getattr(execution, _ATTR, None) is not None:
        return
    with manager._mutex:  # no event is added after the end; the mutex orders us after the last one
        events = manager._history_event_list
        setattr(execution, _ATTR, HISTORIES.put(pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL)))
        events.clear()  # in place: moto's list is Final and held by the manager


def patch_spilled_history() -> None:
    from moto.stepfunctions.parser.api import GetExecutionHistoryOutput
    from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication, Execution

    orig_terminated = BaseExecutionWorkerCommunication.terminated
    orig_history = Execution.to_history_output

    @functools.wraps(orig_terminated)
    def terminated(self: Any) -> None:
        orig_terminated(self)  # status, output, error first: what describe_execution answers
        spill_history(self.execution)

    @functools.wraps(orig_history)
    def to_history_output(self: Any) -> Any:
        where = getattr(self, _ATTR, None)
        if where is None:
            out = orig_history(self)
            # The execution may have ended while moto copied its list: the spill empties the
            # list under the same mutex, so a copy taken after it is empty. Look again.
            where = getattr(self, _ATTR, None)
            if where is None:
                return out
        return GetExecutionHistoryOutput(events=pickle.loads(HISTORIES.get(where)))  # noqa: S301 - our own file

    BaseExecutionWorkerCommunication.terminated = terminated  # type: ignore[method-assign]
    Execution.to_history_output = to_history_output  # type: ignore[method-assign]


class SpilledBody:
    """A FakeKey's body in :data:`BODIES`, as the file-like object moto reads and writes it
    through (``seek``, ``tell``, ``read``, ``write``, ``truncate``, ``close``). moto writes a body
    whole, at position 0 after ``truncate()``; any other write rewrites the body."""

    __slots__ = ("_closed", "_pos", "_where")

    def __init__(self) -> None:
        self._where = BODIES.put(b"")
        self._pos = 0
        self._closed = False

    def _open(self) -> tuple[int, int]:
        if self._closed:
            raise ValueError("I/O operation on closed file.")  # what moto's SpooledTemporaryFile raises
        return self._where

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        size = self._open()[1]
        self._pos = max(0, pos if whence == os.SEEK_SET else (self._pos if whence == os.SEEK_CUR else size) + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        offset, size = self._open()
        end = size if n is None or n < 0 else min(size, self._pos + n)
        if end <= self._pos:
            return b""
        data = BODIES.get((offset + self._pos, end - self._pos))
        self._pos = end
        return data

    def write(self, data: Any) -> int:
        offset, size = self._open()
        data = bytes(data)
        if self._pos == 0 and size == 0:
            body = data
        else:  # not moto's way of writing: rewrite the whole body
            old = BODIES.get((offset, size))
            body = old[: self._pos].ljust(self._pos, b"\0") + data + old[self._pos + len(data) :]
        self._where = BODIES.put(body)
        self._pos += len(data)
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        offset, current = self._open()
        size = self._pos if size is None else size
        self._where = (offset, min(current, size))
        return size

    def close(self) -> None:
        self._closed = True


def patch_spilled_s3_bodies() -> None:
    from moto.s3.models import FakeKey

    orig_init = FakeKey.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)  # the body into moto's buffer (and its size), then moved
        buffer, body = self._value_buffer, SpilledBody()
        buffer.seek(0)
        body.write(buffer.read())
        buffer.close()
        self._value_buffer = body

    FakeKey.__init__ = __init__  # type: ignore[method-assign]


# --- compact DynamoDB items -------------------------------------------------------------------

HOT_ITEMS = 512  # items kept as moto's objects; the others as bytes (compact-dynamodb-items)


class Frozen:
    """A DynamoDB item stored as bytes in :data:`ITEMS`, where a :class:`CompactPartition` holds
    it (see :meth:`_Codec.freeze`): ~0.1 KB in memory whatever the item's size. Immutable, so its
    copies are itself (a rollback's copy of a partition shares them)."""

    __slots__ = ("where",)

    def __init__(self, data: bytes) -> None:
        self.where = ITEMS.put(data)

    def __len__(self) -> int:
        return self.where[1]

    def data(self) -> bytes:
        return ITEMS.get(self.where)

    def __copy__(self) -> Frozen:
        return self

    def __deepcopy__(self, memo: Any) -> Frozen:
        return self


class _NotPlain(Exception):
    """Not the plain Item / DynamoType tree :func:`freeze` knows: the item stays as it is."""


class _Codec:
    """An Item as nested (type, value) tuples, marshalled, and back: the same classes and fields
    moto's own ``Item.__deepcopy__`` copies (hash_key, range_key, attrs; a DynamoType's type and
    value, maps and lists node by node, set values as lists). moto's classes are passed in once."""

    def __init__(self) -> None:
        from moto.dynamodb.models.dynamo_type import DynamoType, Item, LimitedSizeDict

        self.DynamoType: Any = DynamoType
        self.Item: Any = Item
        self.LimitedSizeDict: Any = LimitedSizeDict

    def _plain(self, d: Any) -> Any:
        if type(d) is not self.DynamoType or vars(d).keys() != {"type", "value"}:
            raise _NotPlain
        t, v = d.type, d.value
        if t == "M":
            return (t, {k: self._plain(x) for k, x in v.items()})
        if t == "L":
            return (t, [self._plain(x) for x in v])
        return (t, v)

    def _node(self, plain: Any) -> Any:
        t, v = plain
        node = self.DynamoType.__new__(self.DynamoType)
        node.type = t
        if t == "M":
            node.value = {k: self._node(x) for k, x in v.items()}
        elif t == "L":
            node.value = [self._node(x) for x in v]
        else:
            node.value = v
        return node

    def freeze(self, item: Any) -> Frozen | None:
        """The item as bytes; None when it is not a plain Item (it stays an object)."""
        if (
            type(item) is not self.Item
            or vars(item).keys() != {"hash_key", "range_key", "attrs"}
            or type(item.attrs) is not self.LimitedSizeDict
        ):
            return None
        try:
            rng = None if item.range_key is None else self._plain(item.range_key)
            plain = (self._plain(item.hash_key), rng, [(k, self._plain(v)) for k, v in item.attrs.items()])
            return Frozen(marshal.dumps(plain))
        except (_NotPlain, ValueError):  # ValueError: a value marshal does not know
            return None

    def thaw(self, frozen: Frozen) -> Any:
        hash_key, rng, attrs = marshal.loads(frozen.data())  # noqa: S302 - our own bytes
        # the item moto made once, not a new one: not through BaseModel.__new__, which adds every
        # instance to a list for good (moto's dashboard; a read would add one per thawed item)
        item = object.__new__(self.Item)
        item.hash_key = self._node(hash_key)
        item.range_key = None if rng is None else self._node(rng)
        item.attrs = self.LimitedSizeDict.__new__(self.LimitedSizeDict)
        dict.__init__(item.attrs)
        for k, v in attrs:  # checked for size when it was stored (dict's own set, as moto's copy)
            dict.__setitem__(item.attrs, k, self._node(v))
        return item


_CODEC: list[_Codec] = []  # set at install
# (partition, key) of the items made objects, oldest first; a partition no longer in moto (a
# rollback's spare copy) is not kept alive by this
_HOT: collections.deque[tuple[weakref.ref[CompactPartition], Any]] = collections.deque()


def freeze_cold() -> None:
    """Store the items made objects longest ago as bytes, down to HOT_ITEMS objects. Called with
    moto's DynamoDB lock held, before an operation (none is under way: nobody holds one to change)."""
    if not _CODEC:
        return
    codec = _CODEC[0]
    while len(_HOT) > HOT_ITEMS:
        ref, key = _HOT.popleft()
        part = ref()
        if part is None:
            continue
        value = dict.get(part, key)
        if value is not None and type(value) is not Frozen:
            frozen = codec.freeze(value)
            if frozen is not None:
                dict.__setitem__(part, key, frozen)


class CompactPartition(dict[Any, Any]):
    """moto's partition dict ({range key: Item}) holding most items as :class:`Frozen` bytes:
    every read of an item (``[]``, get, values, items, pop...) gives moto the Item object, thawed
    and kept until :func:`freeze_cold` stores it as bytes again. Copies share the bytes."""

    def __init__(self, *args: Any) -> None:
        dict.__init__(self, *args)
        me = weakref.ref(self)
        _HOT.extend((me, k) for k, v in dict.items(self) if type(v) is not Frozen)

    def __reduce__(self) -> Any:  # copy, deepcopy, pickle: the same contents (bytes included)
        return (type(self), (dict(self),))

    def copy(self) -> Any:
        """The same contents, the bytes shared; its objects are made hot as they are here (without
        a pass over every item: a transaction's rollback copy is taken for every write)."""
        new = type(self).__new__(type(self))
        dict.update(new, self)
        theirs = weakref.ref(new)
        _HOT.extend([(theirs, k) for ref, k in _HOT if ref() is self])
        return new

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if type(value) is Frozen:
            value = _CODEC[0].thaw(value)
            dict.__setitem__(self, key, value)
            _HOT.append((weakref.ref(self), key))
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        _HOT.append((weakref.ref(self), key))

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def values(self) -> list[Any]:  # type: ignore[override]  # moto only iterates it
        return [self[k] for k in list(dict.keys(self))]

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]  # moto only iterates it
        return [(k, self[k]) for k in list(dict.keys(self))]

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            value = self[key]
            dict.__delitem__(self, key)
            return value
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[Any, Any]:
        if not len(self):
            return dict.popitem(self)  # KeyError, as dict's
        key = next(reversed(self))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __ior__(self, other: Any) -> CompactPartition:  # type: ignore[misc]  # dict's |= returns dict[Any, Any]
        self.update(other)
        return self


def patch_compact_dynamodb_items() -> None:
    from collections import defaultdict

    from moto.dynamodb.models.table import Table

    _CODEC[:] = [_Codec()]
    orig_init = Table.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        if self.range_key_attr and not self.items:
            self.items = defaultdict(CompactPartition)

    Table.__init__ = __init__  # type: ignore[method-assign]
    from . import moto_fixes

    moto_fixes.BEFORE_OPERATION.append(freeze_cold)


# --- the process's malloc arenas ---------------------------------------------------------------

MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas in this process (the engine's: moto and the runner) at `arenas`.

    glibc gives threads their own arenas, up to 8 per core. moto's server answers each connection
    on a thread of its own and the interpreter starts threads every round, so the process's heap
    was spread over 16 arenas, each keeping its free pieces: the RSS grew ~180 KB a round while
    what Python held grew ~35 KB (``bench/long_run.py``, 300 rounds: 325 -> 361 MB; capped at 2:
    313 -> 324 MB). The threads take turns on the GIL anyway. A MALLOC_ARENA_MAX set by the user
    wins; elsewhere than glibc nothing is set. Returns whether the cap was set."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))
