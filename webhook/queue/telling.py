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
from webhook.queue.lines import Waits
from webhook.queue.ports import Events, QueueMetrics
from webhook.queue.release import Release, Wait
from webhook.queue.waiting import Changed, Queued
from webhook.sources.eventqueue import Event

GANG_EVENTS = {"parked": ("GangParked", "Warning"), "repair": ("GangRepair", "Normal")}  # Wait.code -> Event


class Teller:
    """The Events of the queue's Pods, and which Pods were told they wait (uid, Event reason)."""

    def __init__(self, events: Events, metrics: QueueMetrics) -> None:
        self._events, self._metrics = events, metrics
        self._told: dict[PodKey, tuple[str, str]] = {}
        self._every = True  # the next pass over the whole queue tells every Pod it lists (none told yet)
        self._again: set[PodKey] = set()  # Pods that may wait untold (a release not made): looked up each pass

    def afresh(self) -> None:
        """The next pass over the whole queue looks at every Pod it lists (a new term, or a new queue)."""
        self._every = True

    def look_again(self, key: PodKey) -> None:
        """The Pod's release was not made (undone, refused, in conflict): tell it it waits once it does."""
        self._again.add(key)

    def passed(
        self, waits: Waits, changed: Changed | None, waiting: Callable[[PodKey], Queued | None], *, whole: bool
    ) -> None:
        """After a pass: tell the Pods that wait untold (a pass that went on lists only the Pods it walked), and
        forget those that left. A pass over the whole queue looks at the Pods decided one by one and those
        that arrived or changed since the last pass (`changed`) or may wait untold, not at every Pod of the
        runs they wait in (webhook.queue.lines): the others were listed by the passes before, and told."""
        if not whole:
            self.queued(waits)
        elif self._every or changed is None:
            self.queued(waits)
            self.only(waits, waiting)
            self._every = False
            self._again.clear()
            return
        else:
            self.queued(waits.one_by_one())
            for key in [*(changed or ()), *self._again]:
                q = waiting(key)
                wait = waits.wait_of(q) if q is not None else None
                if wait is not None:
                    self.queued((wait,))
                if q is None or wait is not None:
                    self._again.discard(key)
        if changed:
            self.left(changed, waiting)

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
