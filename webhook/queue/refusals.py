"""Releases the API refuses: backed off, bounded, and ended, so that no Pod stalls the queue.

A release the API refuses (anything but the 409 and 404 the runner decides again: a 413 from a webhook's
body limit, a 403, a 422, or a 429 or 5xx of an overloaded API or webhook) is not sent again at once. After
its n-th refusal the Pod is held back for `backoff(n)` seconds (1, 2, 4, ... at most MAX_BACKOFF_SECONDS),
and while held back it holds no place in the queue: the Pods behind it are decided as if it were not
there. A refusal about the Pod itself (a 4xx other than 429) counts towards MAX_REFUSALS; at the last one
the queue gives up on that version of the Pod: a Warning Event `ReleaseRefused` on the Pod says what the
API answered, and the Pod stays gated, without a place, until it changes (a new resourceVersion, such as
the tenant's fix) or is deleted. Refusals that say nothing certain about the Pod (429, 5xx: kube-apiserver
answers 500 when a webhook fails, which may be a webhook that is down or one that refuses the review's
size) back off the same way and are never given up on, but at the MAX_REFUSALS-th in a row a Warning
Event `ReleaseRefused` on the Pod says what the API answers and that it is tried again every
MAX_BACKOFF_SECONDS. Pure: the caller gives the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from webhook.domain.model import PodKey
from webhook.queue.waiting import Order, Queued
from webhook.sources.eventqueue import Event

BASE_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
MAX_REFUSALS = 5  # refusals of one version of a Pod (4xx but 429) before the queue gives up on it
REFUSED = "ReleaseRefused"  # the reason of the Event that ends it
_TOO_MANY_REQUESTS = 429


class _Refusal(NamedTuple):
    uid: str
    version: str  # the Pod's resourceVersion the refusals were of
    about_pod: int  # refusals that count towards MAX_REFUSALS
    tries: int  # refusals of any kind (the backoff's exponent)
    until: float  # held back until then (the caller's clock)
    ended: bool  # given up: held back until the Pod changes


def backoff(tries: int) -> float:
    """Seconds a Pod is held back after its `tries`-th refusal in a row: doubling, bounded."""
    exponent = min(max(tries - 1, 0), 32)
    return min(BASE_BACKOFF_SECONDS * float(1 << exponent), MAX_BACKOFF_SECONDS)


def counts(status: int) -> bool:
    """Does a refusal with this HTTP status say the Pod itself cannot be released as it is (a 4xx but
    429), so that repeating it is bounded? A 429 or a 5xx (or no status) says the API is busy or down."""
    return 400 <= status < 500 and status != _TOO_MANY_REQUESTS


class Refusals:
    """The Pods whose releases were refused, by key; one version of each."""

    def __init__(self) -> None:
        self._by_key: dict[PodKey, _Refusal] = {}

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def refused(self, q: Queued, status: int, message: str, now: float) -> Event | None:
        """Count a refusal of the release of `q`; the Event that ends it when this was the last one."""
        old = self._current(q)
        count = (old.about_pod if old else 0) + (1 if counts(status) else 0)
        tries = (old.tries if old else 0) + 1
        ended = count >= MAX_REFUSALS
        self._by_key[q.key] = _Refusal(q.uid, q.resource_version, count, tries, now + backoff(tries), ended)
        if ended:
            why = (
                f"gpupool gave up releasing the Pod after {count} refusals; the API answered {status}: {message}. "
                "It stays gated and holds no place in the queue until it is changed or deleted"
            )
        elif tries == MAX_REFUSALS:
            why = (
                f"gpupool's release of the Pod was refused {tries} times in a row; the API answered {status}: "
                f"{message}. It is tried again every {MAX_BACKOFF_SECONDS:.0f} s at most, holding no place meanwhile"
            )
        else:
            return None
        return Event(q.key[0], q.key[1], q.uid, REFUSED, why, "Warning")

    def holds_back(self, q: Queued, now: float) -> bool:
        """Is `q` held back now (backing off, or given up on this version of it)?"""
        entry = self._current(q)
        return entry is not None and (entry.ended or now < entry.until)

    def due(self, since: float, now: float) -> bool:
        """Did a backoff run out after `since` (the last pass): is a Pod to be tried again?"""
        return any(not r.ended and since < r.until <= now for r in self._by_key.values())

    def forget(self, key: PodKey) -> None:
        """The Pod was released (or is gone): its refusals are over."""
        self._by_key.pop(key, None)

    def held_back(self, waiting: Callable[[PodKey], Queued | None], now: float) -> dict[PodKey, Order]:
        """The Pods held back now (`holds_back`), with their places in the queue; the queue's look-up `waiting`
        says which still wait: those that do not are forgotten."""
        held = {}
        for key in list(self._by_key):
            q = waiting(key)
            if q is None:
                del self._by_key[key]
            elif self.holds_back(q, now):
                held[key] = q.order
        return held

    def _current(self, q: Queued) -> _Refusal | None:
        """The refusals of this very version of the Pod; an older version's are forgotten."""
        entry = self._by_key.get(q.key)
        if entry is not None and (entry.uid, entry.version) != (q.uid, q.resource_version):
            del self._by_key[q.key]
            return None
        return entry
