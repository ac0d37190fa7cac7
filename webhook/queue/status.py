"""What the leader tells the pools' GPUPool objects (webhook.pools.statuses, written by
webhook.sources.poolstatus): after its passes, each pool's figures from its index and the Pods of its
queue that wait for the pool.

A Pod counts for the first pool of those it waits for (`Wait.pools`: the pools whose room or quota it
waits for, best first); a Pod that waits for no pool in particular (an invalid request, a gang still
short of members) counts for none. The statuses are worked out at most every STATUS_SECONDS, from the
last pass's waits and the index as it is then, and only while this replica leads: a leader that stops
leading `forget`s, so that it writes nothing more.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from webhook.pools.statuses import pool_statuses
from webhook.queue.release import Wait

STATUS_SECONDS = 1.0


class StatusSink(Protocol):
    """Where the statuses go (webhook.sources.poolstatus.PoolStatusWriter)."""

    def publish(self, wanted: Mapping[str, dict[str, Any]]) -> None: ...

    def forget(self) -> None: ...


class StatusFeed:
    def __init__(self, sink: StatusSink, clock: Callable[[], float] = time.monotonic) -> None:
        self._sink, self._clock = sink, clock
        self._waits: list[Wait] | None = None  # the last pass's, not told yet
        self._at = float("-inf")
        self._publishing = False

    def passed(self, waits: list[Wait]) -> None:
        """A pass decided: these Pods wait (kept, not copied: a pass makes a new list)."""
        self._waits = waits

    def look(self, leading: bool, read: Callable[[], Any]) -> None:
        """On each look of the leader's loop: publish what the last pass left, once STATUS_SECONDS have
        gone by since the last time; or, no longer leading, forget. `read` is the inventory's read()."""
        if not leading:
            if self._publishing:
                self._sink.forget()
                self._publishing = False
            self._waits = None
            return
        waits = self._waits
        if waits is None or self._clock() - self._at < STATUS_SECONDS:
            return
        queued = Counter(w.pools[0] for w in waits if w.pools)
        with read() as index:
            stats = index.capacity.pool_stats()
        self._sink.publish(pool_statuses(stats, queued))
        self._waits, self._at, self._publishing = None, self._clock(), True
