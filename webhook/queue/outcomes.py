"""What a pass of the queue makes of a waiting Pod (webhook.queue.release): a release, a wait, and where
the pass stands after its last Pod. Plain data, shared by the pass, its batch and its Waits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from webhook.admission.choice import Ahead
from webhook.domain.model import PodInfo, PoolKey
from webhook.queue.waiting import Queued


class Release(NamedTuple):
    """A Pod released to a pool: the one PATCH to write, and the Pod as the index counts it meanwhile."""

    queued: Queued
    pool: PoolKey
    patch: list[dict[str, Any]]
    released: PodInfo
    before: PodInfo | None = None  # what the index counted for the Pod when it was decided (`settle`)


class Wait(NamedTuple):
    """A Pod that stays in the queue, and why: `code` capacity | quota | behind | gang | parked | repair |
    invalid (webhook.queue.gangs: parked, a gang that can never go whole; repair, one partly released)."""

    queued: Queued
    code: str
    reason: str
    pools: tuple[PoolKey, ...] = ()  # the pools whose room or quota it waits for, best first (GPUPool's `queued`)


@dataclass(slots=True)
class Carried:
    """Where a pass of the queue stands after its last Pod: what the Pods decided wait for (`ahead`), the
    wait of each shape that waits (by the shape's identity, as in `read_batch`: the Wait holds the shape,
    so no id is reused while it is kept) and the gangs judged. A pass over Pods that all come after those
    of an earlier pass, with nothing else changed, goes on from where that one ended (webhook.queue
    .standing): the Pods before decide as they did, so what they leave to the later ones is as it was."""

    ahead: Ahead = field(default_factory=Ahead)
    shape_waits: dict[int, Wait] = field(default_factory=dict)
    judged_gangs: set[tuple[str, str]] = field(default_factory=set)


class PassResult(NamedTuple):
    """What one pass of the leader's runner did (webhook.queue.runner)."""

    released: int  # writes answered "released" during the pass (run_pass: its own, every one answered)
    waiting: Sequence[Wait]  # webhook.queue.lines.Waits: one per waiting Pod, as the runs hold them
    decided: int = 0  # releases the pass decided
    decisions: int = 0  # shapes, Pods and gangs it decided (the others stayed parked: webhook.queue.parking)
    visits: int = 0  # the shapes, Pods and gangs it visited (release.Plan.visits): none while nothing changed
    walked: int = 0  # its steps (release.Plan.walked: a step per shape, not per Pod): none while nothing changed
