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

from collections.abc import Collection

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


def pool_to_hold(
    choice: Choice, *, devices: int, since: float, now: float | None, policy: Policy, held: Collection[PoolKey]
) -> PoolKey | None:
    """The pool a Pod that waits for room (`choice`, decided in RELEASE mode) holds against the Pods behind
    it: the one closest to fitting it once it has waited long, else None (they may use the room). None too
    when that pool is `held` already for a Pod before it: this one's turn there comes after that Pod's."""
    if choice.wait != "capacity" or not waited_long(since, now, policy):
        return None
    pools = set(choice.waits_for)
    pool = closest([c for c in choice.candidates if c.pool in pools], devices)
    return None if pool in held else pool
