"""A pass's batch: the waiting Pods with their requests, read from the Pods alone (no index, no lock),
once per line (webhook.queue.lines); what webhook.queue.release's `decide_batch` decides under the
inventory's lock."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from webhook.admission.request import GpuRequest
from webhook.admission.verdict import Verdict
from webhook.domain.model import PodKey
from webhook.domain.policy import Policy
from webhook.pools.memo import NO_MEMO, Memo
from webhook.queue.lines import Lines, lines_of
from webhook.queue.outcomes import Carried, Wait
from webhook.queue.parking import Parking, read_request
from webhook.queue.waiting import Order, Queued

_NONE: Mapping[PodKey, Order] = MappingProxyType({})


class Batch(NamedTuple):
    """The waiting Pods with their requests, read without the index (`read_batch`): what `decide_batch`
    decides under the inventory's lock. By line (webhook.queue.lines): one request per shape."""

    lines: list[tuple[GpuRequest, Sequence[Queued]]]  # the Pods of no workload group, per shape, in order
    grouped: list[tuple[Queued, GpuRequest]]  # the Pods of workload groups, in release order
    gangs: dict[tuple[str, str], list[tuple[Queued, GpuRequest]]]  # (namespace, group) -> members, in order
    # Pods whose request the policy now refuses (it changed since they were queued): a Wait, with the line
    # of a shape's Pods that all wait with it (None: that Pod alone)
    invalid: list[tuple[Wait, Sequence[Queued] | None]]
    parking: Parking | None = None  # what the requests were read with: decide_batch parks the shapes there
    carried: Carried | None = None  # where an earlier pass ended, to go on from (taken over: not copied)
    held_back: Mapping[PodKey, Order] = _NONE  # Pods that hold no place (webhook.queue.refusals): passed over

    @property
    def pods(self) -> list[tuple[Queued, GpuRequest]]:
        """Every Pod with its request, in release order (a walk of them all: for the MIG planner)."""
        every = [(q, req) for req, line in self.lines for q in line if q.key not in self.held_back]
        every.extend(self.grouped)
        every.sort(key=lambda p: p[0].order)
        return every

    def request_of(self) -> Callable[[Queued], GpuRequest | None]:
        """A waiting Pod's request as this batch read it (its line's, or its own for a workload group's Pod):
        a look-up, where `pods` walks them all. None: not of this batch."""
        by_shape = {id(line[0].view.shape): req for req, line in self.lines}
        by_key = {q.key: req for q, req in self.grouped}
        return lambda q: by_key.get(q.key) if q.view.group else by_shape.get(id(q.view.shape))

    def __bool__(self) -> bool:
        """Is there a Pod to decide?"""
        return bool(self.lines or self.grouped)


def read_batch(
    queued: Sequence[Queued] | Lines,
    policy: Policy,
    shapes: Memo = NO_MEMO,
    parking: Parking | None = None,
    held_back: Mapping[PodKey, Order] = _NONE,
) -> Batch:
    """The requests of the waiting Pods (`queued`: the queue's lines, or Pods in any order), as admission
    reads them, once per line; no index, no lock. With `parking`, each shape's request is read once while it
    waits (webhook.queue.parking). `held_back`: Pods that hold no place (webhook.queue.refusals)."""
    lines = queued if isinstance(queued, Lines) else lines_of(queued)
    # Per shape, not per Pod: the request (which only the shape and the policy make). Keyed by the shape's
    # identity, as webhook.queue.waiting shares one object per distinct shape (equal shapes that are not one
    # object are decided once each: slower, never wrong); the shapes live as long as `queued` does, so no id
    # is reused meanwhile.
    requests: dict[int, GpuRequest | Verdict] = {}

    def read(q: Queued) -> GpuRequest | Verdict:
        return parking.request(q, policy, shapes) if parking is not None else read_request(q, policy, shapes)

    def request(q: Queued) -> GpuRequest | Verdict:
        req = requests.get(id(q.view.shape))
        if req is None:
            req = requests[id(q.view.shape)] = read(q)
        return req

    valid: list[tuple[GpuRequest, Sequence[Queued]]] = []
    invalid: list[tuple[Wait, Sequence[Queued] | None]] = []
    for line in lines.shapes:
        req = read(line[0])  # (a line is one shape object's: read once)
        if isinstance(req, Verdict):
            invalid.append((Wait(line[0], "invalid", req.message), line))
        else:
            valid.append((req, line))
    grouped: list[tuple[Queued, GpuRequest]] = []
    gangs: dict[tuple[str, str], list[tuple[Queued, GpuRequest]]] = {}
    for q in lines.grouped:
        if q.key in held_back:
            continue
        req = request(q)
        if isinstance(req, Verdict):
            invalid.append((Wait(q, "invalid", req.message), None))
            continue
        if req.group.size:
            gangs.setdefault((q.key[0], q.view.group), []).append((q, req))
        grouped.append((q, req))
    return Batch(valid, grouped, gangs, invalid, parking, None, held_back)
