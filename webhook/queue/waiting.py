"""The Pods waiting in the queue, kept from the inventory's own watch (no list of their own), in order.

A Pod waits while it has the scheduling gate `gpupool.io/queue` that admission gave it
(webhook.admission.queued); it leaves when the gate is gone (released, by this leader or another), or
the Pod is deleted or being deleted (`metadata.deletionTimestamp`: a finalizer may keep it stored, but it
is never released and holds no place). The order is the one the leader releases in: `spec.priority`
descending, then creation time, then namespace and name.

The inventory calls `replace` and `apply` for every page and event of every kind, inside its own lock
(webhook.sources.live.Observer), so the queue and the pool index always agree; anything that changes may
make room, so every call wakes the leader, except the events of Pods that hold no devices the pools count
(most of a cluster's Pod events: they free no room, and a pass over a long queue is not free).
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from webhook.admission.pod import PodError, PodShape, PodView, read_pod, shape_digest
from webhook.domain.cut import Cut, FleetLabels
from webhook.domain.model import POOL_ANNOTATION, QUEUE_GATE, PodInfo, PodKey
from webhook.domain.policy import Policy
from webhook.pools.kubeobj import as_list, as_map, own, pod_from_obj, pod_gpu_requests, shared
from webhook.queue.backlog import Backlog, Backlogs, created_at
from webhook.queue.cutting import cut_queued
from webhook.queue.lines import Line, Lines, last_of

log = logging.getLogger("gpupool.queue")

Obj = Mapping[str, Any]
PODS = "pods"
_ORDER = operator.attrgetter("order")
Order = tuple[int, str, str, str]  # a Pod's place in the release order (`order_of`)
VERSIONS = itertools.count(1)
# The Pods that arrived, changed or left (take_changed), each as it waited before (None: it did not)
Changed = dict[PodKey, "Queued | None"]  # the versions of the queue and of the leader's Waits (webhook.queue.standing)


class Queued(NamedTuple):
    """One waiting Pod: who it is, where it stands, and the views admission and the inventory have of it."""

    key: PodKey
    uid: str
    resource_version: str  # the version the release is decided on (a precondition of its PATCH)
    priority: int
    created: str  # metadata.creationTimestamp (RFC 3339, UTC: ordered as text)
    view: PodView  # as admission reads it
    info: PodInfo  # as the pool index counts it (nothing while queued; its claim once released)
    since: float  # when this process first saw it waiting (monotonic), for the wait time
    order: tuple[int, str, str, str]  # the release order's key (`order_of`)
    digest: bytes = b""  # the shape's (pod.shape_digest), set by `Waiting`; b"": not known (nothing is parked)
    cut: Cut | None = None  # its long node-affinity lists are kept cut (webhook.queue.cutting)

    def age(self, now: datetime) -> float | None:
        """Seconds from the Pod's creation to `now` (below zero when the clocks disagree); None when its
        creationTimestamp is not an RFC 3339 time with a zone."""
        try:
            then = datetime.fromisoformat(self.created)
        except ValueError:
            return None
        return (now - then).total_seconds() if then.tzinfo is not None else None


def is_queued(obj: Obj) -> bool:
    """Does the raw Pod still wait behind gpupool's gate? (Asked of every Pod of every list page: a Pod
    with no gates, nearly all of them, costs two lookups.)"""
    gates = as_map(obj.get("spec")).get("schedulingGates")
    if not gates:
        return False
    return any(as_map(g).get("name") == QUEUE_GATE for g in as_list(gates))


def read_queued(obj: Obj, policy: Policy, since: float) -> Queued | None:
    """The raw Pod as the queue holds it, first seen waiting at `since`; None when it does not wait behind
    the gate, holds no GPU request or is being deleted (`PodInfo.holds_nothing`: it is never released and
    keeps no place). PodError when admission cannot read it."""
    if not is_queued(obj):
        return None
    view = read_pod(obj)
    info = pod_from_obj(obj, policy.gpu_resources, policy.partition_prefixes)
    if info is None or info.holds_nothing:
        return None
    meta, spec = as_map(obj.get("metadata")), as_map(obj.get("spec"))
    raw_priority = spec.get("priority")
    priority = raw_priority if isinstance(raw_priority, int) and not isinstance(raw_priority, bool) else 0
    # The index's strings of its key, and one string per creation second: not copies of each per Pod.
    key, created = (info.namespace, info.name), shared(meta.get("creationTimestamp", ""))
    return Queued(
        key=key,
        # Copies, not the decoded event's strings: one of those kept alive keeps the allocator's pool it
        # lies in alive, so each queued Pod held on to memory of its whole decoded event.
        uid=own(meta.get("uid", "")),
        resource_version=own(meta.get("resourceVersion", "")),
        priority=priority,
        created=created,
        view=view,
        info=info,
        since=since,
        order=order_of(priority, created, key),
    )


def order_of(priority: int, created: str, key: PodKey) -> tuple[int, str, str, str]:
    """The release order's key: `spec.priority` descending, then creation time, then namespace and name.
    Kept in each Queued rather than built per comparison: the queue is sorted again whenever it changes."""
    return (-priority, created, key[0], key[1])


class Waiting:
    """The queued Pods. Thread-safe: the inventory writes from its watch threads, the leader reads."""

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[PodKey, Queued] = {}
        self._listing: set[PodKey] | None = None
        # One object per distinct shape among the waiting Pods, with its digest: a pass decides each shape
        # once, and tells them apart by identity (a shape's hash walks all its tuples; a pass would pay it
        # per Pod), and across passes by digest (webhook.queue.parking), worked out once per shape here.
        self._shapes: dict[PodShape | bytes, tuple[PodShape, bytes]] = {}  # a cut one's by its digest
        self._labels: FleetLabels | None = None  # the nodes' label values, to cut long lists to (`cut_against`)
        self._cut: set[PodKey] = set()  # the Pods kept cut: while stale, decided by nothing (`ordered`)
        self._backlogs = Backlogs()
        # The waiting Pods by line (webhook.queue.lines.Line), each kept in release order as Pods come and go:
        # per shape (by digest) those of no workload group, and those of groups; each line's tuple is made
        # again only once it changed, so a pass over a long queue copies none of the lines nothing changed in.
        self._lines: dict[bytes, Line] = {}
        self._grouped = Line()
        self.version = next(VERSIONS)  # moves with every Pod that arrives, changes or leaves
        # The Pods that arrived, changed or left since the leader last took them (`take_changed`); None once
        # more changed than it is worth keeping apart (a follower never takes them): then, all of them.
        self._changed: Changed | None = {}
        self._created: tuple[str, datetime | None] = ("", None)  # the last creationTimestamp read (they repeat)
        self.wake = threading.Event()  # set by every change: room may have appeared, or a Pod queued

    # --- fed by the inventory (webhook.sources.live.Observer) -----------------------------------------

    def replace(self, kind: str, objects: list[Obj], first: bool, final: bool) -> None:
        if kind == PODS:
            with self._lock:
                if first:
                    self._listing = set()
                for obj in objects:
                    key = self._take(obj)
                    if key is not None and self._listing is not None:
                        self._listing.add(key)
                if final:
                    for gone in set(self._pods) - (self._listing or set()):
                        self._drop(gone)
                    self._listing = None
        self.wake.set()

    def cut_against(self, labels: FleetLabels) -> None:
        """Keep long node-affinity lists cut to `labels` (the live inventory's, webhook.domain.cut)."""
        self._labels = labels

    def now(self) -> float:
        """The queue's clock now: what `Queued.since` is measured on."""
        return self._clock()

    def apply(self, kind: str, event: str, obj: Obj) -> None:
        if kind == PODS:
            with self._lock:
                if event == "DELETED":
                    self._drop(_key(obj))
                else:
                    self._take(obj)
            if not self._counts(obj):
                return  # a Pod that holds no GPU frees none: no pass (each holds the inventory's lock)
        self.wake.set()

    def _counts(self, obj: Obj) -> bool:
        """Does the Pod hold (or want) devices the pools count? The same test as the pool index's."""
        spec, meta = as_map(obj.get("spec")), as_map(obj.get("metadata"))
        if POOL_ANNOTATION in as_map(meta.get("annotations")):
            return True
        return bool(pod_gpu_requests(spec, self.policy.gpu_resources, self.policy.partition_prefixes))

    def _take(self, obj: Obj) -> PodKey | None:
        if not is_queued(obj):
            if self._pods:  # else there is nothing to drop, and no key to work out
                self._drop(_key(obj))
            return None
        key = _key(obj)
        try:
            queued = read_queued(obj, self.policy, self._clock())
        except PodError as exc:  # kube-apiserver stores valid Pods; one gpupool cannot read stays gated
            log.warning("queued Pod %s/%s cannot be read: %s", key[0], key[1], exc)
            queued = None
        if queued is None:
            self._drop(key)
            return None
        old = self._pods.get(key)
        if old is not None and old.uid == queued.uid:
            queued = queued._replace(since=old.since)
        if self._labels is not None:
            queued = cut_queued(queued, self._labels)
        (self._cut.add if queued.cut is not None else self._cut.discard)(key)
        queued = self._interned(queued)
        if old is not None:
            self._unline(old)
        self._pods[queued.key] = queued  # its key's strings, not the decoded object's
        self._line(queued)
        if old is not None and _same(old, queued):
            # Only its resourceVersion or status moved (kube-scheduler's SchedulingGated): a pass decides it as
            # it did, so it is no change for the leader (which reads the new version when it releases it).
            self.version = next(VERSIONS)
        else:
            self._changes(key, old)
        if self._created[0] != queued.created:
            self._created = (queued.created, created_at(queued.created))
        self._backlogs.add(key, (self._created[1], queued.since))
        return key

    def _interned(self, queued: Queued) -> Queued:
        """The Pod with its shape as the one object all waiting Pods of that shape share. The table is
        rebuilt from the waiting Pods once it holds more than twice their shapes (Pods come and go)."""
        if len(self._shapes) > 2 * len(self._pods) + 64:
            self._shapes = {
                (q.digest if q.cut else q.view.shape): (q.view.shape, q.digest) for q in self._pods.values()
            }
        by = queued.digest if queued.cut is not None else queued.view.shape
        known = self._shapes.get(by)
        if known is None:
            known = self._shapes[by] = (queued.view.shape, queued.digest or shape_digest(queued.view.shape))
        shape, digest = known
        if shape is not queued.view.shape:
            queued = queued._replace(view=queued.view._replace(shape=shape))
        return queued._replace(digest=digest)

    def _line(self, q: Queued) -> None:
        if q.view.group:
            self._grouped.add(q)
            return
        line = self._lines.get(q.digest)
        if line is None:
            line = self._lines[q.digest] = Line()
        line.add(q)

    def _unline(self, q: Queued) -> None:
        if q.view.group:
            self._grouped.remove(q)
            return
        line = self._lines[q.digest]
        line.remove(q)
        if not line:
            del self._lines[q.digest]

    def _drop(self, key: PodKey) -> None:
        self._cut.discard(key)
        old = self._pods.pop(key, None)
        if old is not None:
            self._unline(old)
            self._changes(key, old)
            self._backlogs.drop(key)

    def _changes(self, key: PodKey, before: Queued | None) -> None:
        self.version = next(VERSIONS)
        changed = self._changed
        if changed is not None:
            changed.setdefault(key, before)
            if len(changed) > len(self._pods) + 1024:
                self._changed = None

    def take_changed(self) -> Changed | None:
        """The Pods that arrived, changed or left since the last call, each as it waited at that call (None:
        it did not), or None: any of them may have; and from now on those that do after it. A change a pass does not
        read (`_same`: only the resourceVersion or status moved) is none."""
        with self._lock:
            changed, self._changed = self._changed, {}
            return changed

    # --- read by the leader ----------------------------------------------------------------------------

    def ordered(self) -> list[Queued]:
        """The waiting Pods in release order (a copy), but those kept cut against labels that have gained a
        value since: decided by nothing until the inventory has read them again (webhook.sources.rereads).
        Its lines merged (`lines`): for views of the whole queue (`gpupool queue`, `explain`), not passes."""
        return self.lines().pods()

    def lines(self) -> Lines:
        """The waiting Pods by line (webhook.queue.lines), each in release order: a copy of the lines that
        changed since the last call, the others as they were (tuples: a pass reads them with the lock let go)."""
        with self._lock:
            tuples = {digest: line.pods() for digest, line in self._lines.items()}
            shapes, grouped = tuple(tuples.values()), self._grouped.pods()
            stale = self._stale()
            if stale:  # as `ordered`: decided by nothing until read again (the lines they are in, copied without)
                lines = {self._pods[k].digest for k in stale if not self._pods[k].view.group}
                kept = (_without(line, stale) if digest in lines else line for digest, line in tuples.items())
                shapes = tuple(line for line in kept if line)
                grouped = _without(grouped, stale)
            return Lines(shapes, grouped, last_of(shapes, grouped))

    def _stale(self) -> set[PodKey]:
        """The Pods kept cut against labels that have gained a value since (webhook.queue.cutting)."""
        labels = self._labels
        if not self._cut or labels is None:
            return set()
        return {k for k in self._cut if (cut := self._pods[k].cut) is not None and labels.stale(cut)}

    def get(self, key: PodKey) -> Queued | None:
        with self._lock:
            return self._pods.get(key)

    def __len__(self) -> int:
        return len(self._pods)

    def backlog(self, now: datetime) -> dict[str, Backlog]:
        """Per namespace with waiting Pods: how many, and how long the one waiting longest has, in seconds
        from its creation to `now` (from when this process first saw it when its creation time is
        unreadable; never below zero, whatever the clocks say). A queue stuck on anything (no leader,
        refused releases, a quota that never frees) shows in the second number before any release does.
        Kept as Pods arrive and leave (webhook.queue.backlog): a look costs one entry per namespace."""
        mono = self._clock()
        with self._lock:
            return self._backlogs.backlog(now, mono)

    def load(self, objects: Iterable[Obj]) -> None:
        """Take the queued Pods among `objects` (a snapshot file's), as one list."""
        self.replace(PODS, [o for o in objects if o.get("kind", "Pod") == "Pod"], first=True, final=True)


def _without(line: tuple[Queued, ...], keys: set[PodKey]) -> tuple[Queued, ...]:
    """The line without the Pods of `keys` (itself when it holds none of them: a look at each of its Pods)."""
    if not any(q.key in keys for q in line):
        return line
    return tuple(q for q in line if q.key not in keys)


def _same(old: Queued, new: Queued) -> bool:
    """Would a pass decide the Pod as it did (the same Pod, place, view and counted info)? Only its
    resourceVersion may differ, which its release is written with: read again by the pass that releases it."""
    if old.uid != new.uid or old.order != new.order or old.view.shape is not new.view.shape:
        return False
    who = operator.attrgetter("namespace", "name", "generate_name", "node_name", "mirror", "daemonset", "group")
    return who(old.view) == who(new.view) and old.info == new.info


def _key(obj: Obj) -> PodKey:
    meta = as_map(obj.get("metadata"))
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))
