"""The inventory interface: where the pool state comes from (snapshot file or live watch cache).

Both sources keep a `PoolIndex` (webhook.pools.index) up to date and hand it out, locked, for the length
of one decision under `read()`. An admission reads the index and at most records one reservation in it,
so it costs the same whether the cluster has 50 Pods or 150,000.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Protocol

from webhook.pools.index import PoolIndex, PoolStats

__all__ = ["Inventory", "LockedIndex", "PoolIndex", "PoolStats"]


class Inventory(Protocol):
    """A source of pool state. Implementations: SnapshotInventory (a file), LiveInventory (the API)."""

    def read(self) -> AbstractContextManager[PoolIndex]:
        """Hold a consistent view for the length of one decision."""
        ...

    @property
    def ready(self) -> bool:
        """True once the first full load or sync is done."""
        ...

    def age_seconds(self) -> float:
        """Seconds since the view was last known to be current (0 for a snapshot file)."""
        ...

    def current_since(self) -> float | None:
        """Since when (monotonic clock) the view of Pods has been current without a break: a Pod created
        since then is seen within moments. None when that is not known (a snapshot never sees one)."""
        ...

    def close(self) -> None:
        """Stop background work (watches); a no-op for a snapshot."""
        ...


class LockedIndex:
    """A PoolIndex behind a lock: what both inventories hand to a decision. Writers (the watch threads,
    reservations) and readers (admissions) take the same lock for one event or one decision."""

    def __init__(self, index: PoolIndex) -> None:
        self._index = index
        self._lock = threading.Lock()
        self._view = _Held(self._lock, index)

    def read(self) -> AbstractContextManager[PoolIndex]:
        return self._view


class _Held(AbstractContextManager[PoolIndex]):
    """`with` holds the lock and gives the index. One object serves every caller (it keeps no state of
    its own); a plain class rather than @contextmanager, which builds a generator per admission."""

    __slots__ = ("_index", "_lock")

    def __init__(self, lock: threading.Lock, index: PoolIndex) -> None:
        self._lock = lock
        self._index = index

    def __enter__(self) -> PoolIndex:
        self._lock.acquire()
        return self._index

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
