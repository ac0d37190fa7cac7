"""The Events waiting to be posted: per namespace, rate-limited and coalesced, as client-go's EventRecorder
limits and aggregates its own, so that no flood of them delays the ones that matter or loads the API.

- **Per namespace, in turn.** Each namespace has its own line and its own token bucket (NAMESPACE_BURST
  at once, then NAMESPACE_QPS a second, like client-go's spam filter per source and object); namespaces
  with Events waiting take turns, so ten thousand Pods queued in one namespace do not hold up the
  `Released` Event of a Pod in another. Within a namespace, outcomes (`Released`, `ReleaseRefused`, any
  reason but `Queued`) go before `Queued`.
- **Coalesced.** An Event for a Pod and reason already waiting replaces the one waiting (newest message,
  one post). Past NAMESPACE_PENDING `Queued` Events waiting in a namespace, a new one takes the place of
  the newest waiting and is counted: the one posted says how many more Pods of the namespace were queued
  meanwhile, instead of one Event each (client-go's aggregator: similar Events become one with a count).
- **Bounded.** All namespaces together post at most TOTAL_BURST at once, then TOTAL_QPS a second; at most
  MAX_PENDING Events wait in all, past which new ones are dropped (counted).

Pure and thread-safe: `put` never blocks (the queue's leader calls it between releases); the caller gives
the clock to `take`, which answers the Event to post now or how long until one may be.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import NamedTuple

NAMESPACE_QPS = 1.0
NAMESPACE_BURST = 25
TOTAL_QPS = 20.0
TOTAL_BURST = 100
NAMESPACE_PENDING = 100  # Queued Events waiting per namespace before they are coalesced
MAX_PENDING = 10_000  # Events waiting in all: past it, new ones are dropped
QUEUED = "Queued"  # the one informational reason: coalesced, and posted after the outcomes


class Event(NamedTuple):
    namespace: str
    pod: str
    uid: str
    reason: str  # Queued, Released, ReleaseRefused
    message: str
    kind: str = "Normal"
    involved: str = "Pod"  # the kind of the object it is about: Pod, or Node (`pod` is then the node's name)


class Bucket:
    """A token bucket: `burst` at once, refilled at `qps` a second (the caller's clock)."""

    def __init__(self, qps: float, burst: int, now: float) -> None:
        self.qps, self.burst = qps, burst
        self._tokens, self._at = float(burst), now

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0: one is)."""
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.qps

    def take(self) -> None:
        self._tokens -= 1

    def full(self, now: float) -> bool:
        self.wait(now)
        return self._tokens >= self.burst


_Key = tuple[str, str]  # (uid, reason)


@dataclass
class _Line:
    """One namespace's Events waiting: outcomes first, then Queued; its bucket; what was coalesced."""

    bucket: Bucket
    outcomes: OrderedDict[_Key, Event] = field(default_factory=OrderedDict)
    queued: OrderedDict[_Key, Event] = field(default_factory=OrderedDict)
    coalesced: int = 0  # Queued Events folded into the newest waiting one

    def __len__(self) -> int:
        return len(self.outcomes) + len(self.queued)


class EventQueue:
    def __init__(self, now: float) -> None:
        self._lock = threading.Lock()
        self._lines: dict[str, _Line] = {}
        self._turns: deque[str] = deque()  # namespaces with Events waiting, in turn
        self._total = Bucket(TOTAL_QPS, TOTAL_BURST, now)
        self._pending = 0
        self._now = now  # the last clock reading seen (a new namespace's bucket starts full then)
        self.dropped = 0
        self.coalesced = 0
        self.wake = threading.Event()  # set when an Event is put

    def __len__(self) -> int:
        return self._pending

    def put(self, event: Event) -> None:
        """Add an Event to post (never blocks; past MAX_PENDING it is dropped and counted)."""
        with self._lock:
            line = self._lines.get(event.namespace)
            if line is None:
                line = self._lines[event.namespace] = _Line(Bucket(NAMESPACE_QPS, NAMESPACE_BURST, self._now))
            if not line:
                self._turns.append(event.namespace)
            key = (event.uid, event.reason)
            waiting = line.queued if event.reason == QUEUED else line.outcomes
            if key in waiting:
                waiting[key] = event  # the same Pod and reason: one post, the newest message
            elif event.reason == QUEUED and len(line.queued) >= NAMESPACE_PENDING:
                line.queued.popitem()  # the newest waiting gives its place to this one, and is counted
                line.queued[key] = event
                line.coalesced += 1
                self.coalesced += 1
            elif self._pending >= MAX_PENDING:
                self.dropped += 1
            else:
                waiting[key] = event
                self._pending += 1
        self.wake.set()

    def take(self, now: float) -> tuple[Event | None, float]:
        """The Event to post now, or None and the seconds until one may be (0 when none waits)."""
        with self._lock:
            self._now = now
            wait = self._total.wait(now)
            if wait or not self._turns:
                return None, wait
            soonest = float("inf")
            for _ in range(len(self._turns)):
                namespace = self._turns.popleft()
                line = self._lines[namespace]
                ready = line.bucket.wait(now)
                if ready:
                    self._turns.append(namespace)
                    soonest = min(soonest, ready)
                    continue
                line.bucket.take()
                self._total.take()
                event = self._next(line)
                if line:
                    self._turns.append(namespace)
                return event, 0.0
            self._forget_full_buckets(now)
            return None, soonest

    def _next(self, line: _Line) -> Event:
        self._pending -= 1
        if line.outcomes:
            return line.outcomes.popitem(last=False)[1]
        event = line.queued.popitem(last=False)[1]
        if line.coalesced and not line.queued:
            more, line.coalesced = line.coalesced, 0
            event = event._replace(message=f"{event.message} ({more} more Pods of this namespace queued meanwhile)")
        return event

    def _forget_full_buckets(self, now: float) -> None:
        """Namespaces with nothing waiting and a full bucket again are forgotten (they start full anyway)."""
        if len(self._lines) <= 2 * len(self._turns) + 64:
            return
        for namespace in [n for n, line in self._lines.items() if not line and line.bucket.full(now)]:
            del self._lines[namespace]
