"""The queue's backlog per namespace, kept as Pods arrive and leave: how many wait, and since when the one
waiting longest has (webhook.queue.waiting: `Waiting.backlog`, which the metrics report once a second).

Per namespace, the number of waiting Pods and two heaps: the creation times of those whose
creationTimestamp is an RFC 3339 time with a zone, and the times this process first saw waiting the
others (the queue's clock). The oldest of each is the heap's first entry that still stands for a waiting
Pod (an entry is stale once its Pod left or changed: dropped when it reaches the top, and the heaps are
built again once they hold more than twice their Pods), so a look costs one entry per namespace, not one
per Pod, and a Pod arriving or leaving costs a push. Not thread-safe: `Waiting` calls it under its lock.
"""

from __future__ import annotations

import heapq
from datetime import datetime
from typing import NamedTuple, TypeVar

from webhook.domain.model import PodKey

T = TypeVar("T", datetime, float)
Since = tuple[datetime | None, float]  # a Pod's creation time (None: unreadable), and when first seen waiting


class Backlog(NamedTuple):
    """A namespace's waiting Pods, as the metrics report them."""

    pods: int
    oldest_seconds: float


def created_at(created: str) -> datetime | None:
    """A creationTimestamp as a time with a zone; None when it is not one."""
    try:
        then = datetime.fromisoformat(created)
    except ValueError:
        return None
    return then if then.tzinfo is not None else None


class _Namespace:
    __slots__ = ("created", "keys", "seen")

    def __init__(self) -> None:
        self.keys: set[PodKey] = set()
        self.created: list[tuple[datetime, PodKey]] = []
        self.seen: list[tuple[float, PodKey]] = []


class Backlogs:
    """The waiting Pods' `Since`, by Pod, and per namespace the heaps of them."""

    def __init__(self) -> None:
        self._since: dict[PodKey, Since] = {}
        self._namespaces: dict[str, _Namespace] = {}

    def add(self, key: PodKey, since: Since) -> None:
        """The Pod waits, since `since` (again: a Pod that changed)."""
        if self._since.get(key) == since:
            return
        entry = self._namespaces.get(key[0])
        if entry is None:
            entry = self._namespaces[key[0]] = _Namespace()
        entry.keys.add(key)
        self._since[key] = since
        created, seen = since
        if created is not None:
            heapq.heappush(entry.created, (created, key))
        else:
            heapq.heappush(entry.seen, (seen, key))
        if len(entry.created) + len(entry.seen) > 2 * len(entry.keys) + 16:
            self._rebuild(entry)

    def drop(self, key: PodKey) -> None:
        """The Pod no longer waits."""
        if self._since.pop(key, None) is None:
            return
        entry = self._namespaces[key[0]]
        entry.keys.discard(key)
        if not entry.keys:
            del self._namespaces[key[0]]

    def backlog(self, now: datetime, mono: float) -> dict[str, Backlog]:
        """Per namespace with waiting Pods: how many, and how long the one waiting longest has, in seconds
        from its creation to `now`, or from when this process first saw it (`mono`, the queue's clock) when
        its creation time is unreadable; never below zero, whatever the clocks say."""
        found = {}
        for namespace, entry in self._namespaces.items():
            oldest = 0.0
            if self._top(entry.created, 0) is not None:
                oldest = max(oldest, (now - entry.created[0][0]).total_seconds())
            if self._top(entry.seen, 1) is not None:
                oldest = max(oldest, mono - entry.seen[0][0])
            found[namespace] = Backlog(len(entry.keys), oldest)
        return found

    def _top(self, heap: list[tuple[T, PodKey]], at: int) -> PodKey | None:
        """The Pod of the heap's first entry that stands (the stale ones before it dropped); None: none."""
        while heap:
            value, key = heap[0]
            since = self._since.get(key)
            if since is not None and since[at] == value and (at == 0 or since[0] is None):
                return key
            heapq.heappop(heap)
        return None

    def _rebuild(self, entry: _Namespace) -> None:
        mine = [(key, self._since[key]) for key in entry.keys]
        entry.created = [(c, key) for key, (c, _) in mine if c is not None]
        entry.seen = [(s, key) for key, (c, s) in mine if c is None]
        heapq.heapify(entry.created)
        heapq.heapify(entry.seen)
