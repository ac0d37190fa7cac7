"""What the leader tells the pools' GPUPool objects (webhook.pools.statuses) and each namespace's
ConfigMap `gpupool-queue` (`namespace_summaries`), both written by webhook.sources.poolstatus: after its
passes, each pool's figures from its index and the Pods of its queue that wait for the pool; per
namespace, its waiting Pods, their position in the queue and what each waits for.

A Pod counts for the first pool of those it waits for (`Wait.pools`: the pools whose room or quota it
waits for, best first); a Pod that waits for no pool in particular (an invalid request, a gang still
short of members) counts for none. A namespace's summary lists at most MAX_LISTED Pods (the first in the
queue) and says how many more wait; a namespace with no Pod waiting has none. Positions count from 1 over
the whole queue, as `gpupool queue -A` shows it. Everything is worked out at most every STATUS_SECONDS, from the
last pass's waits and the index as it is then, and only while this replica leads: a leader that stops
leading `forget`s, so that it writes nothing more.
"""

from __future__ import annotations

import bisect
import heapq
import operator
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import yaml

from webhook.domain.model import PodKey, PoolKey
from webhook.pools.statuses import pool_statuses
from webhook.queue.lines import Lines, Waits
from webhook.queue.release import Wait
from webhook.queue.waiting import Queued

_ORDER = operator.attrgetter("order")
STATUS_SECONDS = 1.0
MAX_LISTED = 50  # Pods listed in a namespace's summary; the others are counted
REASON_MAX = 300  # characters of what a Pod waits for, in its summary


class StatusSink(Protocol):
    """Where the statuses go (webhook.sources.poolstatus.PoolStatusWriter)."""

    def publish(self, wanted: Mapping[str, dict[str, Any]]) -> None: ...

    def publish_queues(self, wanted: Mapping[str, dict[str, Any]]) -> None: ...

    def forget(self) -> None: ...


def namespace_summaries(
    waits: Sequence[Wait], positions: Mapping[PodKey, int], total: int, counts: Mapping[str, int] | None = None
) -> dict[str, dict[str, str]]:
    """Per namespace with Pods waiting, its ConfigMap's data: `summary` (how many wait, of how many in
    all, and how many are not listed) and `pods.yaml` (the first MAX_LISTED, in queue order: pod,
    position, waitsFor (the code), reason, and the pool it waits for first). `counts`: how many Pods of
    each namespace wait, when `waits` holds only the first ones of each (`Waits.firsts`)."""
    # (position, name, n, wait): the tuples compare in C and never reach the Wait (n breaks any tie), and
    # only the first MAX_LISTED are picked (a heap), not every waiting Pod sorted by a Python key: this runs
    # each STATUS_SECONDS on the leader's loop, and with 20,000 Pods waiting in one namespace that sort was
    # 15 % of the leader process's samples (bench_queue --backlog).
    by_namespace: dict[str, list[tuple[int, str, int, Wait]]] = {}
    for n, wait in enumerate(waits):
        key = wait.queued.key
        by_namespace.setdefault(key[0], []).append((positions.get(key, total + 1), key[1], n, wait))
    summaries = {}
    for namespace, entries in by_namespace.items():
        pods = [
            {
                "pod": name,
                "position": position,
                "waitsFor": wait.code,
                "reason": wait.reason[:REASON_MAX],
                **({"pool": str(wait.pools[0])} if wait.pools else {}),
            }
            for position, name, _, wait in heapq.nsmallest(MAX_LISTED, entries)
        ]
        waiting = counts.get(namespace, len(entries)) if counts is not None else len(entries)
        summary = f"{waiting} Pods of this namespace wait in gpupool's queue ({total} in all)."
        if waiting > MAX_LISTED:
            summary += f" The first {MAX_LISTED} are listed; {waiting - MAX_LISTED} more are not."
        summaries[namespace] = {"summary": summary, "pods.yaml": yaml.safe_dump(pods, sort_keys=False, width=10_000)}
    return summaries


class Standing(Protocol):
    """The Waits of the last pass (webhook.queue.standing.Standing), and a version that moves with them."""

    @property
    def waits(self) -> Waits: ...

    @property
    def version(self) -> int: ...


class Queue(Protocol):
    """The queue in release order (webhook.queue.waiting.Waiting), and a version that moves with it."""

    @property
    def version(self) -> int: ...

    def lines(self) -> Lines: ...


def places(lines: Lines, pods: Sequence[Queued]) -> tuple[dict[PodKey, int], int]:
    """The Pods' places in the queue (from 1), and how many wait: each looked up in every line (a search
    per line), or, when that is more than a walk of them all, by the whole queue in order."""
    total = sum(len(line) for line in lines.shapes) + len(lines.grouped)
    every = (*lines.shapes, lines.grouped)
    if len(every) * len(pods) > total:
        ordered = lines.pods()
        return {q.key: bisect.bisect_left(ordered, q.order, key=_ORDER) + 1 for q in pods}, total
    return {q.key: 1 + sum(bisect.bisect_left(line, q.order, key=_ORDER) for line in every) for q in pods}, total


class StatusFeed:
    """What the passes leave, published at most every STATUS_SECONDS: worked out again only when the
    Waits or the queue changed (else the figures published last are published again, with the pools'
    figures of the index now), so a queue where nothing changes costs no walk of its Pods."""

    def __init__(self, sink: StatusSink, clock: Callable[[], float] = time.monotonic) -> None:
        self._sink, self._clock = sink, clock
        self._standing: tuple[Standing, Queue] | None = None  # the last pass's, not told yet
        self._at = float("-inf")
        self._publishing = False
        self._queued: tuple[int, Counter[PoolKey]] = (-1, Counter())  # per pool, its waiting Pods; by version
        self._summaries: tuple[tuple[int, int], dict[str, dict[str, str]]] = ((-1, -1), {})

    def passed(self, standing: Standing, queue: Queue) -> None:
        """A pass decided: `standing` holds the Waits of the Pods of the queue (kept, not copied)."""
        self._standing = (standing, queue)

    def look(self, leading: bool, read: Callable[[], Any]) -> None:
        """On each look of the leader's loop: publish what the last pass left, once STATUS_SECONDS have
        gone by since the last time; or, no longer leading, forget. `read` is the inventory's read()."""
        if not leading:
            if self._publishing:
                self._sink.forget()
                self._publishing = False
            self._standing = None
            self._queued, self._summaries = (-1, Counter()), ((-1, -1), {})
            return
        if self._standing is None or self._clock() - self._at < STATUS_SECONDS:
            return
        standing, queue = self._standing
        if self._queued[0] != standing.version:
            self._queued = (standing.version, Counter(standing.waits.pool_counts()))
        with read() as index:
            stats = index.capacity.pool_stats()
        self._sink.publish(pool_statuses(stats, self._queued[1]))
        versions = (standing.version, queue.version)
        if self._summaries[0] != versions:
            # The first MAX_LISTED of each namespace, read from the runs (webhook.queue.lines), and their places
            # in the queue: no walk of every waiting Pod.
            counts, firsts = standing.waits.firsts(MAX_LISTED)
            positions, total = places(queue.lines(), [w.queued for w in firsts])
            self._summaries = (versions, namespace_summaries(firsts, positions, total, counts))
        self._sink.publish_queues(self._summaries[1])
        self._standing, self._at, self._publishing = None, self._clock(), True
