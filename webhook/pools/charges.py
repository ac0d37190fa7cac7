"""Charges: what Pods that bypass placement hold before every replica's watch shows them.

A Pod that names its node (or a DaemonSet's) cannot be gated, so in a namespace whose policy queues Pods
it is checked at admission, by whichever replica kube-apiserver calls. One replica's reservations are
in its own memory: two replicas admitting at once would each see room for their own Pod. So the
validating call charges such a Pod in the Kubernetes API (webhook.admission.charging), as
kube-apiserver's ResourceQuota admission charges `status.used`: each charge names the Pod, its node and
the devices it holds there, and expires (wall clock, seconds since the epoch: replicas share no other
clock) in case the Pod's creation failed after the call.

The queue's leader writes into the same object, before it sends them, the *releases* of each pass
(`Charge.pool` set, no node): what each released Pod takes (its namespace, its pool and the pool labels it
is pinned to, its devices), so an admission charging a Pod that names its node counts a release its watch
has not shown yet. Both sides read, decide and write with the version they read: whichever writes second
has read what the first wrote (or is refused, 409, and reads again). A release counts until the watch of
the replica deciding shows its Pod released, or it expires (webhook.queue.records says when the leader
drops one); the leader never counts its releases (its index counts its own, and a new leader's watch has
caught up with its predecessor's), but counts the releases by hand (`Charge.by`, `kubectl gpupool
release`, recorded the same way) until its watch shows them.

The counting rule, one function for every caller (`pending`: the validating call and the queue's leader):
what a namespace holds is what the index holds (the Pods its watch has shown, and its own reservations) plus
the charges whose Pod the watch has not shown yet and that have not expired (and, for the validating call,
the releases whose Pod the watch has not shown released). A charge whose Pod the watch shows is counted by
the index already; the next write drops it.

Pure: the charges are read by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

import orjson

from webhook.domain.model import PoolKey, Selector
from webhook.pools.index import PoolIndex, Reservation
from webhook.pools.nodes import NodeFacts

MAX_CHARGES = 1000  # charges waiting for the watch at once, cluster-wide; past it, admissions are told to retry
# The charges and the leader's releases are one annotation of the Lease, and kube-apiserver refuses an object
# whose annotations take over 256 KiB in all: they may take RECORD_BYTES (the rest: the annotation's key and
# any other annotation). Of it the releases may take RELEASE_BYTES (about 800 of ordinary names, ~200 bytes
# each), so that Pods naming their node keep 80 KiB (about 650 charges); a pass releases no more than fit (the
# rest go once older ones were shown or expired), and a charge that does not fit is told to retry. By
# bytes, not by count: an entry is as long as its namespace, name, pool and pins.
RECORD_BYTES = 240 * 1024
RELEASE_BYTES = 160 * 1024
RELEASE_SECONDS = 5.0  # a release shown by the leader's watch stays recorded this long: the watch delay it covers


class ChargeError(Exception):
    """The charges could not be read or written (the API did not answer, or refused)."""


class Charge(NamedTuple):
    """One Pod's charge: the devices it holds on its node until every watch shows it."""

    namespace: str
    name: str
    node: str
    devices: tuple[tuple[str, int], ...]  # (resource, count) per device resource it requests
    expires: float  # wall clock, seconds since the epoch
    pool: str = ""  # a release (node ""): the pool the leader released the Pod to, and
    selector: Selector = ()  # the pool labels its nodeSelector pins (which of the pool's groups it reaches)
    # A gang's releases, one entry whatever its size (`name` is the group): how many of its members the
    # leader has released to `pool` in all, each holding `devices`. What counts of it is the members a
    # replica's watch does not show on the pool yet (`gang_unseen`).
    members: int = 0
    # A release by hand (`kubectl gpupool release`): the user who made it. The queue's leader counts these,
    # as it counts charges, until its watch shows them (it never counts its own releases).
    by: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """Whose charge it is: its Pod's, or a gang's (a name no Pod has: "/" is not allowed in Pod names)."""
        return (self.namespace, f"group/{self.name}") if self.members else (self.namespace, self.name)

    @property
    def release(self) -> bool:
        """Written by the queue's leader for a Pod it releases (not a Pod that names its node)."""
        return bool(self.pool)

    def as_json(self) -> list[Any]:
        entry = [self.namespace, self.name, self.node, [list(d) for d in self.devices], self.expires]
        if not self.pool:
            return entry
        released = [*entry, self.pool, [list(s) for s in self.selector]]
        if self.by:
            return [*released, self.members, self.by]
        return [*released, self.members] if self.members else released


def record_bytes(charges: Iterable[Charge]) -> int:
    """How many bytes `charges` take of the Lease's annotation, encoded as the store writes them."""
    return len(orjson.dumps([c.as_json() for c in charges]))


class ChargeStore(Protocol):
    """The charges as the API holds them, read and written with optimistic concurrency
    (webhook.sources.charge_store)."""

    def read(self) -> tuple[list[Charge], str]:
        """Every charge, and the version they were read at ("" when there are none yet); ChargeError."""
        ...

    def write(self, charges: list[Charge], version: str) -> bool:
        """Replace the charges read at `version`; False when they changed since; ChargeError."""
        ...


def from_json(entries: Any) -> list[Charge]:
    """The charges of a stored list; an entry that is not one is left out (the object is gpupool's own,
    written only by its service account, but a damaged one must not stop admission)."""
    charges = []
    for entry in entries if isinstance(entries, list) else ():
        if not (isinstance(entry, list) and len(entry) in (5, 7, 8, 9)):
            continue
        namespace, name, node, devices, expires = entry[:5]
        pool, selector = entry[5:7] or ("", [])
        tail = entry[7:]  # a gang's entry has 8 fields (its members), a release by hand's 9 (0, the user)
        members, by = (tail[0] if tail else 0), (tail[1] if tail[1:] else "")
        if not isinstance(members, int) or isinstance(members, bool) or members < 0 or (members and not pool):
            continue
        if not isinstance(by, str) or (by and not pool):
            continue
        if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(node, str)):
            continue
        if not (isinstance(pool, str) and isinstance(selector, list)) or (pool and PoolKey.parse(pool) is None):
            continue
        labels = [s for s in selector if isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s)]
        if not isinstance(expires, int | float) or not isinstance(devices, list):
            continue
        pairs = [d for d in devices if isinstance(d, list) and len(d) == 2 and isinstance(d[0], str)]
        if any(not isinstance(n, int) or n < 0 for _, n in pairs):
            continue
        pins = tuple((k, v) for k, v in labels)
        owned = tuple((r, n) for r, n in pairs)
        charges.append(Charge(namespace, name, node, owned, float(expires), pool, pins, members, by))
    return charges


def unseen(
    charges: Iterable[Charge],
    index: PoolIndex,
    now: float,
    itself: tuple[str, str] | None = None,
    *,
    releases: bool = True,
) -> list[Charge]:
    """The charges that count on top of the index at `now`: not expired, their Pod not shown by the
    watch yet (a release: not shown released), and not the Pod being decided (`itself`, checked without
    counting it against itself). `releases` False (the queue's leader): the leader's releases never count,
    releases by hand do."""
    return [
        c
        for c in charges
        if c.expires > now and c.key != itself and (releases or not c.release or c.by) and not shown(c, index)
    ]


def shown(charge: Charge, index: PoolIndex) -> bool:
    """Does the index's watch show what the charge stands for: its Pod (a release: released)?"""
    if charge.members:
        return gang_unseen(charge, index) == 0
    usage = index.usage
    return usage.holds(charge.key) and not (charge.release and usage.is_queued(charge.key))


def gang_unseen(charge: Charge, index: PoolIndex) -> int:
    """Of a gang's entry, how many members the index's watch does not show on its pool yet."""
    pool = PoolKey.parse(charge.pool)
    placed = index.usage.group_pools(charge.namespace, charge.name).get(pool, 0) if pool is not None else 0
    return max(charge.members - placed, 0)


@contextmanager
def pending(
    index: PoolIndex,
    charges: Iterable[Charge],
    wall: float,
    made: float,
    itself: tuple[str, str] | None = None,
    *,
    releases: bool = True,
) -> Iterator[list[Charge]]:
    """The counting rule, for every caller: for the length of the `with`, the index holds what its watch
    has shown and its own reservations plus the charges that still count at `wall` (`unseen`), which it
    yields. The validating call of a Pod that names its node decides it inside (the leader's releases
    included), and so does the queue's leader its pass (`releases` False): a release never takes the quota
    or the room of a charged Pod the watch has not shown yet, nor a charge those of a release. `made`: the
    index's clock."""
    counted = unseen(charges, index, wall, itself, releases=releases)
    with counting(index, counted, made):
        yield counted


@contextmanager
def counting(index: PoolIndex, charges: Iterable[Charge], made: float) -> Iterator[None]:
    """Count `charges` (unseen already) in the index for the length of the `with`, as reservations on
    their nodes, and take them back after: a decision made inside counts them as the watch would once it
    shows their Pods. A device on a node gpupool cannot class is not counted (as the watch would not).
    `made`: the index's clock (the reservations never live long enough to expire)."""
    tokens = []
    try:
        for charge in charges:
            if charge.release:
                tokens.extend(_count_release(index, charge, made))
                continue
            for resource, count in charge.devices:
                facts = index.capacity.node_facts(charge.node, resource)
                if not isinstance(facts, NodeFacts) or count <= 0:
                    continue
                reservation = Reservation(
                    namespace=charge.namespace,
                    pool=facts.pool,
                    selector=facts.selector,
                    gpus=count,
                    name=charge.name,
                    node=charge.node,
                    echoed=True,
                    confirmed=True,
                )
                tokens.append(index.reserve(reservation, made))
        yield
    finally:
        for token in tokens:
            index.release(token)


def _count_release(index: PoolIndex, charge: Charge, made: float) -> list[int]:
    """A release counted as the watch will count its Pod once released: its devices in its pool, where its
    pool labels reach, against its namespace's quotas. A gang's: each member the watch does not show on
    the pool yet, so counted."""
    pool = PoolKey.parse(charge.pool)
    gpus = sum(n for _, n in charge.devices)
    if pool is None or gpus <= 0:
        return []
    if charge.members:  # one reservation for them all (not one each: a namespace's are bounded in number)
        gpus *= gang_unseen(charge, index)
        if not gpus:
            return []
    reservation = Reservation(
        namespace=charge.namespace,
        pool=pool,
        selector=charge.selector,
        gpus=gpus,
        name=charge.key[1],
        echoed=True,
        confirmed=True,
    )
    return [index.reserve(reservation, made)]
