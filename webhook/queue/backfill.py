"""Backfill with a bounded wait: what a queued Pod (or gang) that cannot fit now leaves to the Pods behind it.

One rule, for single Pods and gangs alike (webhook.queue.release and webhook.queue.gangs ask it):

- **Backfill.** A Pod that waits for room leaves the room it cannot use now to the Pods behind it: they
  are released into it (a 4-GPU Pod that no node has room for does not keep 1-GPU Pods waiting with GPUs
  idle). Room only gets taken within a pass, so a Pod that cannot fit at its turn could use none of what
  the later ones take; and a later Pod never goes before an earlier one that can fit, which is decided,
  and released, first.
- **Bounded wait.** Left at that, a stream of small Pods could starve the big one for ever. So once it has
  waited `defaults.queueHoldAfterSeconds` (`Policy.defaults.queue_hold_after_seconds`) in this leader's
  queue (`Queued.since`; a new leader counts from when it first saw it), it holds the node closest to
  fitting it (`closest_node`, of the pool closest to fitting it, `closest`): no other queued Pod is
  released to that node until it goes (the index keeps it from new Pods, `PoolIndex.exclude_nodes`, and
  every release into its pool excludes it by hostname), so that node drains as its Pods finish while the
  rest of the pool keeps serving; and it is released as soon as the node has its room (`ready`), or
  any node has it (it is decided first). It keeps that node while it waits, unless another node of the
  pool comes to have more free (a `placement: now` Pod took the held one's room): then it holds that one
  instead. A second Pod that waited as long for the same pool holds nothing until the
  first has gone. A gang holds its pool (webhook.queue.gangs): its members may need several nodes.
"""

from __future__ import annotations

from webhook.admission.choice import Choice
from webhook.admission.decision import Candidate
from webhook.admission.groups import pods_at_once
from webhook.domain.model import PodKey, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.nodes import NodeFacts


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


OWNER = "backfill:"  # the index's owner of a Pod's held node (PoolIndex.exclude_nodes): OWNER + namespace/name


def owner_of(key: PodKey) -> str:
    return f"{OWNER}{key[0]}/{key[1]}"


def held_node(index: PoolIndex, key: PodKey, resource: str) -> tuple[str, PoolKey] | None:
    """The node the Pod holds (and its pool of `resource`), if it holds one."""
    for name in sorted(index.excluded_by(owner_of(key))):
        facts = index.capacity.node_facts(name, resource)
        if isinstance(facts, NodeFacts):
            return name, facts.pool
    return None


def ready(index: PoolIndex, key: PodKey, resource: str, devices: int) -> bool:
    """Does the node the Pod holds have its room now (once it is no longer kept from it)? Then the hold is
    let go (the Pod is decided as any other, and holds again if it still cannot go)."""
    held = held_node(index, key, resource)
    if held is None:
        return False
    facts = index.capacity.node_facts(held[0], resource)
    if not isinstance(facts, NodeFacts) or index.free_unexcluded(facts) < devices:
        return False
    index.exclude_nodes(owner_of(key), ())
    return True


def closest_node(index: PoolIndex, pool: PoolKey, resource: str, current: str = "") -> str | None:
    """The node of `pool` closest to fitting a Pod: the most devices free on it (as if no node were kept
    from it), then the one it holds already (`current`: a hold moves only to a node strictly closer), then
    by name; of those no other Pod holds. None when the pool has no usable one."""
    taken = index.capacity.excluded - {current}
    best: tuple[int, bool, str] | None = None
    for node in index.capacity.members(pool):
        facts = index.capacity.node_facts(node.name, resource)
        if node.name in taken or not isinstance(facts, NodeFacts) or not facts.usable or facts.pool != pool:
            continue
        key = (-index.free_unexcluded(facts), node.name != current, node.name)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]
