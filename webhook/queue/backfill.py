"""Backfill with a bounded wait: what a queued Pod (or gang) that cannot fit now leaves to the Pods behind it.

One rule, for single Pods and gangs alike (webhook.queue.release and webhook.queue.gangs ask it):

- **Backfill.** A Pod that waits for room leaves the room it cannot use now to the Pods behind it: they
  are released into it (a 4-GPU Pod that no node has room for does not keep 1-GPU Pods waiting with GPUs
  idle). Room only gets taken within a pass, so a Pod that cannot fit at its turn could use none of what
  the later ones take; and a later Pod never goes before an earlier one that can fit, which is decided,
  and released, first.
- **Bounded wait.** Left at that, a stream of small Pods could starve the big one for ever. So once it has
  waited `defaults.queueHoldAfterSeconds` (`Policy.defaults.queue_hold_after_seconds`) in this leader's
  queue (`Queued.since`; a new leader counts from when it first saw it), it holds the pool closest to
  fitting it (`closest`): no later queued Pod is released into that pool until it goes, so that pool
  drains as the Pods there finish, and it is released as soon as one node has its room.

A release names a pool, not a node (kube-scheduler picks the node among the pool's), so the pool is what
can be held: holding one node would need each later release to exclude that node.
"""

from __future__ import annotations

from webhook.admission.choice import Choice
from webhook.admission.decision import Candidate
from webhook.admission.groups import pods_at_once
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy


def waited_long(since: float, now: float | None, policy: Policy) -> bool:
    """Has a Pod first seen waiting at `since` waited its bound at `now` (the queue's clock; None, a
    preview: never)?"""
    return now is not None and now - since >= policy.defaults.queue_hold_after_seconds


def closest(candidates: list[Candidate], devices: int) -> PoolKey | None:
    """The pool closest to fitting Pods of `devices` each: the most of them fit on its nodes now, then the
    most free on one node; ties go to the better ranked (`candidates` is in the order to try)."""
    if not candidates:
        return None
    return max(candidates, key=lambda c: (pods_at_once(c, devices), c.max_free)).pool


def closest_waited(choice: Choice, devices: int) -> PoolKey | None:
    """The pool a Pod that waits for room (`choice`, decided in RELEASE mode) holds against the Pods behind
    it once it has waited long: of those it waits for, the one closest to fitting it; None for a Pod that
    waits for anything else. (Unless a Pod before it holds that pool already: then this one's turn there
    comes after that Pod's, and it holds nothing: webhook.queue.release.)"""
    if choice.wait != "capacity":
        return None
    pools = set(choice.waits_for)
    return closest([c for c in choice.candidates if c.pool in pools], devices)
