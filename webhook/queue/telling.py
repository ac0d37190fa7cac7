"""What the leader tells the Pods of the queue, as Events: that one waits and for what, that it is released.

A Pod is told `Queued` the first time this leader sees it wait, saying what it waits for; again when its
gang is parked (a Warning `GangParked`: it can never go whole) or being completed (`GangRepair`: members
released already, the rest wait with their pool held); `Released` with the pool once it is. A Pod told
is not told the same again while it waits (by uid: a Pod of the same name created anew is told again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from webhook.domain.model import PodKey
from webhook.queue.ports import Events, QueueMetrics
from webhook.queue.release import Release, Wait
from webhook.queue.waiting import Queued
from webhook.sources.eventqueue import Event

GANG_EVENTS = {"parked": ("GangParked", "Warning"), "repair": ("GangRepair", "Normal")}  # Wait.code -> Event


class Teller:
    """The Events of the queue's Pods, and which Pods were told they wait (uid, Event reason)."""

    def __init__(self, events: Events, metrics: QueueMetrics) -> None:
        self._events, self._metrics = events, metrics
        self._told: dict[PodKey, tuple[str, str]] = {}

    def record(self, event: Event) -> None:
        self._events.record(event)

    def queued(self, waits: Iterable[Wait]) -> None:
        """Tell the Pods of `waits` they wait, unless told so already."""
        for wait in waits:
            q = wait.queued
            reason, kind = GANG_EVENTS.get(wait.code, ("Queued", "Normal"))
            if self._told.get(q.key) != (q.uid, reason):
                self._told[q.key] = (q.uid, reason)
                self._events.record(Event(q.key[0], q.key[1], q.uid, reason, f"gpupool queue: {wait.reason}", kind))

    def left(self, keys: Iterable[PodKey], waiting: Callable[[PodKey], Queued | None]) -> None:
        """Forget the Pods among `keys` that no longer wait (`waiting`: the queue's look-up)."""
        for key in keys:
            if key in self._told and waiting(key) is None:
                del self._told[key]

    def only(self, waits: Iterable[Wait], waiting: Callable[[PodKey], Queued | None]) -> None:
        """After a pass over the whole queue: forget the Pods told that neither wait in it nor are queued."""
        seen = {w.queued.key for w in waits}
        self.left([k for k in self._told if k not in seen], waiting)

    def released(self, release: Release, outcome: str) -> None:
        q = release.queued
        self._told.pop(q.key, None)
        self._metrics.queue_released(outcome, _since(q.created))
        self._events.record(
            Event(q.key[0], q.key[1], q.uid, "Released", f"gpupool released the Pod to pool {release.pool}")
        )


def _since(created: str) -> float | None:
    """Seconds since an RFC 3339 time (the Pod's creation); None when unreadable."""
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max((datetime.now(UTC) - then).total_seconds(), 0.0)
