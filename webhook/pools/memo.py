"""A bounded memo for values derived on the admission path (request shapes, decision plans).

Its keys and values come from Pods, and any tenant can send as many distinct Pods as it likes (a server-side
dry run costs nothing), so the memo is bounded in bytes, not only in entries: each entry is weighed when it
is made, an entry heavier than a small share of the budget is never kept (a Pod with a thousand long
tolerations is computed each time, as it would be on a miss anyway), and when the budget or the entry limit
is reached everything is dropped at once. Shapes in use come back at the next call, so memory never follows
the attacker, and the common case (a few hundred shapes of ordinary Pods) never notices.

Once a memo has filled up, it is seeing a stream of values it will not see again (a burst of distinct
Pods, or someone sending them): from then on a key is kept only the second time it is computed (its hash
is noted the first time, in a set bounded like the memo). Keeping every one of them cost more than
computing them: each entry is some twenty objects that every full garbage collection walks, and with the
memo full those collections took tens of milliseconds, landing on whichever admission allocated at that
moment (the p99 with every Pod a new shape, docs/performance.md), and emptying the full memo took
milliseconds more. A key in use is computed once more and then kept as before.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")
MEMO_LIMIT = 4096  # entries; a cluster has far fewer distinct Pod or request shapes at any one time
MEMO_BYTES = 32 * 1024 * 1024  # what one memo's entries may hold, as they are weighed
ENTRY_SHARE = 256  # an entry may weigh at most this share of the budget: 128 KiB of 32 MiB
ENTRY_BYTES = 512  # what an entry costs beyond its weight: its slot in the table, the key's tuple
_DEFAULT_SIZE = sys.getsizeof(0)


class Memo:
    """A bounded memo: at most `limit` entries weighing at most `max_bytes` together, all dropped at once
    when full (cheap, and shapes in use come back at the next call); once it has been full, a key is kept
    the second time it is computed. Safe across threads: a hit is one dict lookup; making an entry takes
    a lock for a few dict operations, and a race only computes one value twice."""

    def __init__(self, limit: int = MEMO_LIMIT, max_bytes: int = MEMO_BYTES) -> None:
        self._limit = limit
        self._max_bytes = max_bytes
        self._max_entry = max_bytes // ENTRY_SHARE
        self._values: dict[Hashable, Any] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._overflowed = False  # it has been full: keys are kept the second time they are computed
        self._seen: set[int] = set()  # hashes of keys computed once since then, at most `limit`

    @property
    def remembers(self) -> bool:
        """False for NO_MEMO, which computes every value every time."""
        return self._limit > 0

    @property
    def held_bytes(self) -> int:
        """What the entries weigh together (their weights, plus ENTRY_BYTES each)."""
        return self._bytes

    def get(self, key: Hashable | None, compute: Callable[[], T], size: Callable[[T], int] | None = None) -> T:
        """The value for `key`, computed once; with no key (or in NO_MEMO), computed every time.

        `size(value)` weighs the entry: the bytes its key and value hold (an estimate that must not be
        below what they really hold), asked only when the entry is made. Without it the entry is weighed
        by `held_bytes`."""
        if key is None or not self._limit:
            return compute()
        try:
            value: T = self._values[key]
        except KeyError:
            value = compute()
            if self._overflowed and self._first_time(key):
                return value
            weight = ENTRY_BYTES + (size(value) if size is not None else held_bytes((key, value), self._max_entry))
            if weight > self._max_entry:
                return value  # not kept: it would let one Pod take a share of the budget few Pods need
            with self._lock:
                if len(self._values) >= self._limit or self._bytes + weight > self._max_bytes:
                    self._values.clear()
                    self._bytes = 0
                    self._overflowed = True
                if key not in self._values:
                    self._values[key] = value
                    self._bytes += weight
        return value

    def _first_time(self, key: Hashable) -> bool:
        """Whether `key` is computed for the first time since the memo overflowed (noting it if so). Two
        keys of one hash only make the second kept a call early."""
        digest = hash(key)
        with self._lock:
            if digest in self._seen:
                self._seen.discard(digest)
                return False
            if len(self._seen) >= self._limit:
                self._seen.clear()
            self._seen.add(digest)
            return True

    def clear(self) -> None:
        """Forget everything, whether it had been full included."""
        with self._lock:
            self._values.clear()
            self._bytes = 0
            self._overflowed = False
            self._seen.clear()

    def __len__(self) -> int:
        return len(self._values)


NO_MEMO = Memo(limit=0)  # for callers that remember nothing


def held_bytes(obj: object, limit: int = sys.maxsize) -> int:
    """The bytes `obj` holds, each object counted once: what sys.getsizeof says of it and of everything
    reachable through tuples (NamedTuples included), lists, dicts, sets and the fields of frozen
    dataclasses and other slotted values. Mutable dataclasses (the pool index's groups and pools, which a
    decision plan points into) are shared state, counted as themselves only. Stops, returning more than
    `limit`, as soon as the count passes it."""
    seen: set[int] = set()
    stack = [obj]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item, _DEFAULT_SIZE)
        if total > limit:
            return total
        if isinstance(item, str | bytes | int | float | bool) or item is None:
            continue
        if isinstance(item, tuple | list | set | frozenset):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif dataclasses.is_dataclass(item):
            if getattr(item, "__dataclass_params__").frozen:  # noqa: B009 (not in typeshed)
                stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        else:
            stack.extend(getattr(item, name) for name in getattr(type(item), "__slots__", ()) if hasattr(item, name))
    return total
