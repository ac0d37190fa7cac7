"""What the last pass of the queue left, kept so that a pass nothing changed for walks no Pod.

Parked shapes (webhook.queue.parking) spare a pass the decisions of what waits as it did; the walk of
the waiting Pods, building each one's Wait, was still one step per Pod. `Standing` keeps the last
pass's Waits, one per waiting Pod, and where that pass stood after its last Pod (`release.Carried`:
what the Pods decided wait for, each shape's wait, the gangs judged). The next pass goes on from there,
deciding only the Pods that arrived, when nothing any Pod of the last pass read has changed:

- the Pods that changed since (`Waiting.take_changed`, which leaves out the changes a pass does not read:
  kube-scheduler marking a gated Pod SchedulingGated) are Pods that arrived behind every Pod the last
  pass went over (a Pod's place depends only on the Pods before it), or Pods that left or changed
  without having waited (released meanwhile: they left nothing to the Pods behind them);
- no parked answer was woken (`Parking.woken`: a counter it read moved) and no wait's bound passed
  (webhook.queue.backfill);
- no Pod of a workload group has waited `queueHoldAfterSeconds` since the last pass over the whole queue
  (`due`): each of a group's Pods is decided by its own wait, where the parked answers keep one bound per
  shape and group (a Pod of a shape that is no group takes the wait of the first of its shape, as a pass
  over the whole queue does);
- none of the Pods that arrived is a member of a gang the last pass judged (a gang is judged whole, at its
  first member: the runner decides the whole queue then);
- the last pass went over every Pod (no `limit`), no answer it took was woken later in it (by its own
  releases, or the watch while it let go of the lock: `Parking.stale`), its releases were not undone or
  settled otherwise than released, the parked answers were not all forgotten (`Parking.generation`: a
  node came or went) and the policy is the same (the runner `forget`s otherwise);
- no Pod backs off (webhook.queue.refusals) and no MIG re-cut follows the waits (the runner decides the
  whole queue then).

Else the pass decides the whole queue, as before. Either way the Waits come out the same: the Pods
before decide as they did, and what they leave to the later ones is as it was. Not thread-safe: the
leader's loop alone uses it.
"""

from __future__ import annotations

import heapq
import operator

from webhook.domain.model import PodKey
from webhook.queue.lines import Waits
from webhook.queue.release import Carried, Plan
from webhook.queue.waiting import VERSIONS, Changed, Queued, Waiting

Order = tuple[int, str, str, str]  # waiting.order_of
_ORDER = operator.attrgetter("order")


class Standing:
    """The last pass's Waits (`waits`, one per Pod that waits, in the order the passes found them) and
    where it ended, if a pass may go on from it."""

    def __init__(self) -> None:
        self.waits = Waits()
        # Moves whenever `waits` does (webhook.queue.status works out its figures again), to a number no
        # other Standing or Waiting has had (a new leader's, or a rebound one's, never reads as the last one's).
        self.version = next(VERSIONS)
        self._end: Carried | None = None
        self._last: Order | None = None  # the release order of the last Pod the last pass went over
        # When the waiting Pods of workload groups will have waited long (the queue's clock), as a heap; those
        # up to `_judged` (the last pass over the whole queue) were judged by it.
        self._bounds: list[tuple[float, PodKey]] = []
        self._judged = float("-inf")
        self._grouped: set[PodKey] = set()  # the waiting Pods of workload groups, as the passes left them
        # Which Pods the Waits hold, without a walk of them: those decided one by one, and per shape where the
        # first of its runs begins (its later Pods all wait in one: webhook.queue.lines).
        self._one_by_one: set[PodKey] = set()
        self._runs: dict[int, Order] = {}

    def _waited(self, q: Queued) -> bool:
        """Do the Waits hold the Pod (as it was when they were made)?"""
        start = self._runs.get(id(q.view.shape))
        return q.key in self._one_by_one or (start is not None and q.order >= start)

    def _hold(self, waits: Waits) -> None:
        self._one_by_one.update(w.queued.key for w in waits.one_by_one())
        for wait, line, start in waits.runs():
            shape = id(wait.queued.view.shape)
            begins = line[start].order
            if shape not in self._runs or begins < self._runs[shape]:
                self._runs[shape] = begins

    def forget(self) -> None:
        """The next pass decides the whole queue (the last one did not end, or what it read changed)."""
        self._end = None

    def tail(self, changed: Changed | None, waiting: Waiting, bound: float | None) -> list[Queued] | None:
        """The Pods to decide, in order, when the queue changed only behind the last pass (those that
        arrived there; none when nothing changed); None: decide the whole queue. `changed`: the Pods that
        arrived, changed or left since the last pass, each as it waited then, or None when it did not
        (`Waiting.take_changed`; `changed` None: any may have); `bound`: when the next parked answer's bound
        passes (`Parking.wake_at`), then a Pod may hold a pool (webhook.queue.backfill)."""
        now = waiting.now()
        if self._end is None or changed is None or (bound is not None and now >= bound) or self.due(now):
            return None
        new = []
        for key, before in changed.items():
            if before is not None and self._waited(before):
                return None  # a Pod that waited changed or left: the Pods behind it may decide otherwise
            q = waiting.get(key)
            if q is None:
                continue  # left without having waited (released, or held no place)
            if self._last is not None and q.order <= self._last:
                return None  # arrived (or came back) among the Pods the last pass went over
            new.append(q)
        new.sort(key=_ORDER)
        return new

    def due(self, now: float) -> bool:
        """Has a Pod of a workload group waited long since the last pass over the whole queue, at `now`?"""
        bounds = self._bounds
        while bounds and bounds[0][1] not in self._grouped:
            heapq.heappop(bounds)  # it no longer waits
        return bool(bounds) and bounds[0][0] <= now

    def judged(self, waits: Waits, now: float, hold: float, *, whole: bool) -> None:
        """A pass at `now` (the queue's clock) judged these Waits, and every wait's bound up to `now` when
        `whole`: keep the bounds (`hold` after each Pod was first seen) of the workload groups' Pods (each
        decided one by one: webhook.queue.lines)."""
        if whole:
            waits, self._bounds, self._judged, self._grouped = self.waits, [], now, set()
        for w in waits.one_by_one():
            if w.queued.view.group:
                self._grouped.add(w.queued.key)
                if w.queued.since + hold > now:
                    self._bounds.append((w.queued.since + hold, w.queued.key))
        heapq.heapify(self._bounds)

    def carried(self) -> Carried | None:
        """Where the last pass ended, to go on from (taken over by the pass that goes on)."""
        return self._end

    def took(self, plan: Plan, last: Order | None, *, whole: bool) -> None:
        """A pass decided the whole queue (its Pods up to `last`, in order): its Waits stand."""
        self.waits = plan.waits
        self._one_by_one, self._runs = set(), {}
        self._hold(plan.waits)
        self._end, self._last = (plan.end if whole else None), last
        self.version = next(VERSIONS)

    def went_on(self, plan: Plan, last: Order | None) -> None:
        """A pass went on from the last one's end with the Pods up to `last`: its Waits join the others."""
        if plan.waits:
            self.waits.extend(plan.waits)
            self._hold(plan.waits)
            self.version = next(VERSIONS)
        self._end = plan.end
        if last is not None:
            self._last = last
