"""`gpupool explain`'s `Pods:` line: of a template whose workload runs several Pods at once, how many of
them fit now, where, and what the first that does not would get.

Two sources, one answer: a namespace that places at admission admits the Pods in turn
(webhook.admission.burst); one that queues asks the leader's pass with all of them queued
(webhook.queue.preview). Either way nothing is kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from webhook.admission.burst import Burst
from webhook.domain.model import PoolKey
from webhook.queue.preview import Outcome

MAX_PODS = 512  # Pods of one template decided in turn: a Deployment of 10,000 replicas is judged by its first 512


@dataclass(frozen=True, slots=True)
class PodsNow:
    """How many of a template's Pods fit now (placed with room, or released by the leader's next pass),
    where, and what the first that does not fit gets: `rest` in words, `rest_json` as data."""

    pods: int  # Pods decided (at most MAX_PODS)
    of: int  # the template's Pods at the workload's full size
    fit: int
    pools: tuple[tuple[PoolKey, int], ...]  # where those that fit go, in the order first used
    queued: bool  # released by the queue (True) or placed at admission
    rest: str = ""  # "" when every one fits
    rest_json: dict[str, Any] | None = None

    def text(self) -> str:
        """`Pods: 1 of the 4 fits now (1 on nvidia/medium/Tesla-T4); the other 3 would ...`."""
        where = ", ".join(f"{n} {'to' if self.queued else 'on'} {pool}" for pool, n in self.pools)
        fits = "would be released now" if self.queued else "fit now"
        decided = f" (the first {self.pods} of {self.of} decided)" if self.pods < self.of else ""
        if not self.rest:
            return f"Pods: {'both' if self.pods == 2 else f'all {self.pods}'} {fits} ({where}){decided}"
        if self.fit:
            one = "would be released now" if self.queued else "fits now"
            head = f"Pods: {self.fit} of the {self.pods} {one if self.fit == 1 else fits} ({where})"
            others = self.pods - self.fit
            subject = "the other one" if others == 1 else f"the other {others}"
        else:
            none = "would be released now" if self.queued else "fits now"
            head, subject = f"Pods: none of the {self.pods} {none}", "they"
        return f"{head}{decided}; {subject} {self.rest}"

    def as_json(self) -> dict[str, Any]:
        """`gpupool explain -o json`'s `pods`."""
        return {
            "pods": self.pods,
            "of": self.of,
            "fitNow": self.fit,
            "pools": {str(pool): n for pool, n in self.pools},
            "rest": self.rest_json,
        }


def from_burst(burst: Burst, of: int) -> PodsNow:
    """The Pods of a namespace that places at admission, admitted in turn."""
    rest, rest_json = "", None
    r = burst.rest
    if r is not None:
        rest_json = {"outcome": r.outcome, "reason": r.reason or None, "message": r.message}
        if not r.allowed:
            rest = f"would be denied ({r.reason or r.code}): {r.message}"
        elif r.placement is not None:
            rest = f"would be placed on pool {r.placement.pool} and wait there for room"
            rest_json["pool"] = str(r.placement.pool)
        else:
            rest = f"would be {r.outcome}: {r.message}"
    return PodsNow(burst.pods, of, burst.fit, burst.pools, queued=False, rest=rest, rest_json=rest_json)


def from_queue(outcomes: Sequence[Outcome], of: int) -> PodsNow:
    """The Pods of a namespace that queues, all in the queue: those the leader's pass releases now (they
    need not be the first in order: a gang goes whole or not at all), and the first wait."""
    where: Counter[PoolKey] = Counter(o.release.pool for o in outcomes if o.release is not None)
    wait = next((o.wait for o in outcomes if o.wait is not None), None)
    rest, rest_json = "", None
    if wait is not None:
        rest = f"would wait: {wait.reason}"
        rest_json = {"outcome": "wait", "reason": wait.code, "message": wait.reason}
    fit = sum(where.values())
    return PodsNow(len(outcomes), of, fit, tuple(where.items()), queued=True, rest=rest, rest_json=rest_json)
