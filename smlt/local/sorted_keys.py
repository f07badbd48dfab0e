"""A DynamoDB partition that keeps its sort keys in order, so a Query reads only its key range.

moto keeps a table's items as ``{hash key: {range key: Item}}`` and answers every Query by
sorting the whole partition and testing each item against the key condition: O(partition) per
request, while DynamoDB reads a range of the sort key's B-tree (cost grows with the items
returned). A run keeps all of its items in one partition (~9 a round), so each round's Queries
got slower as the run went on (``bench/long_run.py``).

:class:`SortedPartition` is that inner dict with the range keys' ``cast_value`` (what
``DynamoType.__lt__`` compares) in ascending order beside it, built at the first query and kept
up to date by every insert and delete (any other change drops it; the next query rebuilds it).
:func:`key_range` bisects it to the indices a key condition selects. The answer's order, paging,
limits and filters stay moto's own: :mod:`smlt.local.speed` runs moto's loop over that range.
"""

from __future__ import annotations

import bisect
from typing import Any

from .memory import CompactPartition

# moto's comparison functions (comparisons.COMPARISON_FUNCS), by the interval each selects
_KINDS: dict[Any, str] = {}


def _kinds() -> dict[Any, str]:
    if not _KINDS:
        from moto.dynamodb.comparisons import COMPARISON_FUNCS as F

        _KINDS.update(
            {
                F["EQ"]: "EQ",
                F["LT"]: "LT",
                F["LE"]: "LE",
                F["GT"]: "GT",
                F["GE"]: "GE",
                F["BETWEEN"]: "BETWEEN",
                F["BEGINS_WITH"]: "BEGINS_WITH",
            }
        )
    return _KINDS


class Unordered(Exception):
    """These keys have no one order (mixed types, not a key type): let moto answer."""


def _dropping_order(name: str) -> Any:
    """The partition's method `name`, which forgets the order first (rebuilt when next needed)."""
    base = getattr(CompactPartition, name)

    def method(self: SortedPartition, *args: Any, **kwargs: Any) -> Any:
        self._order = None
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


class SortedPartition(CompactPartition):
    """moto's partition dict (items stored compactly, :mod:`smlt.local.memory`) with its keys in
    sort order beside it (see the module's doc)."""

    _order: tuple[list[Any], list[Any]] | None = None  # (cast values, keys), ascending; None: not built

    def copy(self) -> SortedPartition:  # with its order (deepcopy and pickle rebuild it)
        new: SortedPartition = CompactPartition.copy(self)
        if self._order is not None:
            new._order = (list(self._order[0]), list(self._order[1]))
        return new

    def order(self) -> tuple[list[Any], list[Any]]:
        """(cast values, keys) in ascending order; the same stable order as moto's sort."""
        if self._order is None:
            keys = list(dict.keys(self))
            for k in keys:
                if getattr(k, "type", None) not in ("S", "N", "B"):
                    raise Unordered
            casts = [k.cast_value for k in keys]
            try:
                idx = sorted(range(len(keys)), key=casts.__getitem__)
            except TypeError:
                raise Unordered from None
            self._order = ([casts[i] for i in idx], [keys[i] for i in idx])
        return self._order

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._order is not None and key not in self:
            casts, keys = self._order
            try:
                cast = key.cast_value
                i = bisect.bisect_right(casts, cast)  # after equal casts: moto's stable sort of insertion order
            except (AttributeError, TypeError):
                self._order = None
            else:
                casts.insert(i, cast)
                keys.insert(i, key)
        CompactPartition.__setitem__(self, key, value)

    def _forget(self, key: Any) -> None:
        if self._order is None or key not in self:
            return
        casts, keys = self._order
        cast = key.cast_value
        i = bisect.bisect_left(casts, cast)
        while i < len(keys) and casts[i] == cast:
            if keys[i] == key:
                del casts[i], keys[i]
                return
            i += 1
        self._order = None  # not where it should be: rebuild

    def __delitem__(self, key: Any) -> None:
        self._forget(key)
        CompactPartition.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._forget(key)
        return CompactPartition.pop(self, key, *default)

    popitem = _dropping_order("popitem")
    clear = _dropping_order("clear")
    update = _dropping_order("update")
    setdefault = _dropping_order("setdefault")
    __ior__ = _dropping_order("__ior__")


def first_true(n: int, pred: Any) -> int:
    """The first i in [0, n) with pred(i), for a pred that is False up to some i, then True."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def key_range(casts: list[Any], compare: Any, values: list[Any]) -> tuple[int, int]:
    """[lo, hi) of the ascending ``casts`` a key condition selects: moto's ``compare`` (a
    comparison function) against ``values`` (cast values). Every key condition DynamoDB allows
    selects one interval of the sort order. Raises :class:`Unordered` for anything else."""
    kind = _kinds().get(compare)
    n = len(casts)
    try:
        if kind == "EQ":
            return bisect.bisect_left(casts, values[0]), bisect.bisect_right(casts, values[0])
        if kind == "LT":
            return 0, bisect.bisect_left(casts, values[0])
        if kind == "LE":
            return 0, bisect.bisect_right(casts, values[0])
        if kind == "GT":
            return bisect.bisect_right(casts, values[0]), n
        if kind == "GE":
            return bisect.bisect_left(casts, values[0]), n
        if kind == "BETWEEN":
            lo, hi = bisect.bisect_left(casts, values[0]), bisect.bisect_right(casts, values[1])
            return lo, max(lo, hi)
        if kind == "BEGINS_WITH":
            prefix = values[0]
            if not isinstance(prefix, (str, bytes)):
                raise Unordered
            lo = bisect.bisect_left(casts, prefix)
            # from lo on, the keys starting with the prefix come first
            return lo, lo + first_true(n - lo, lambda i: not casts[lo + i].startswith(prefix))
    except (TypeError, IndexError, AttributeError):
        raise Unordered from None
    raise Unordered
