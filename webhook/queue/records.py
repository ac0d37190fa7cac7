"""The leader's releases, recorded with the charges of Pods that name their node (webhook.pools.charges)
before they are sent.

An admission charging a Pod that names its node reads the charges, decides, and writes its charge with the
version it read; a pass of the queue reads them too, decides, and writes its releases with the version it
read, before it sends any. So of two that overlap, the second to write has read what the first wrote, or is
refused (409) and decides again: a charge and a release never share a quota or room, however late either
replica's watch shows the other's Pod. `now` admissions count the releases too (webhook.admission
.validation). A release counts for an admission until that replica's watch shows its Pod released; the
leader's next record drops it once its own watch has shown it for RELEASE_SECONDS, or its release failed,
and it expires after `reservationSeconds` in any case. The members of a gang released in part (a leader
that stopped part way through its releases) stay recorded while they wait, so the room the gang waits for
is counted by every admission through a failover, and so is the room a gang being repaired waits for,
recorded again by each leader while it waits. A gang's members released together take one entry, whatever
their number: how many of the group are on the pool (webhook.pools.charges counts those a replica's watch
does not show there yet). The releases recorded take at most RELEASE_BYTES of the Lease's annotation (a
pass releases no more than fit; the rest go once older ones are dropped).

Pure but for `Recorder.record`, which writes through the store it is given.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from webhook.domain.model import PodKey, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.charges import (
    RECORD_BYTES,
    RELEASE_BYTES,
    RELEASE_SECONDS,
    Charge,
    ChargeError,
    ChargeStore,
    gang_unseen,
    record_bytes,
    unseen,
)
from webhook.pools.index import PoolIndex
from webhook.queue.lines import Waits
from webhook.queue.release import Plan, Release, Wait

log = logging.getLogger("gpupool.queue")


def kept(charges: list[Charge], index: PoolIndex, wall: float, ttl: float) -> list[Charge]:
    """What a pass's record keeps of the charges as read: the charges of Pods that name their node that
    still count (as an admission keeps them), and the releases that have not expired (recorded for `ttl`
    seconds) whose Pod the leader's index shows released, for RELEASE_SECONDS after they were recorded,
    or waiting in a gang with members released already (its held room). A release whose write failed
    otherwise, or whose Pod is gone, is dropped: the Pod is the queue's again. A gang's entry is kept alike:
    for RELEASE_SECONDS, and after while the gang is released in part (some members on the pool, not all)."""
    counted = unseen(charges, index, wall, releases=False)  # releases by hand its watch has not shown included
    ids = {id(c) for c in counted}
    return [
        *counted,
        *(c for c in charges if c.release and id(c) not in ids and c.expires > wall and _keeps(c, index, wall, ttl)),
    ]


def _keeps(release: Charge, index: PoolIndex, wall: float, ttl: float) -> bool:
    usage = index.usage
    fresh = wall - (release.expires - ttl) < RELEASE_SECONDS  # recorded at expires - ttl
    if release.members:
        missing = gang_unseen(release, index)
        return fresh or 0 < missing < release.members
    if not usage.holds(release.key):
        return False
    if not usage.is_queued(release.key):
        return fresh
    info = usage.pod_info(release.key)
    return info is not None and bool(info.group) and bool(usage.group_pools(release.namespace, info.group))


def recorded(release: Release, policy: Policy, expires: float) -> Charge:
    """A release as the charges record it: what its Pod takes once released, in its pool, where its pool
    labels reach, against its namespace's quotas."""
    pool, pod = release.pool, release.released
    resource = pool.resource or policy.vendors[pool.vendor].resource
    devices = ((resource, pod.gpu_requests.get(resource, 0)),)
    return Charge(pod.namespace, pod.name, "", devices, expires, str(pool), policy.hold_pins(pod.node_selector))


class Entries(NamedTuple):
    """What a pass records: its entries, and the Pods whose earlier entries they stand for (a gang's
    members, recorded one by one by an earlier leader)."""

    charges: list[Charge]
    covers: frozenset[PodKey]


def entries(decided: Plan, index: PoolIndex, policy: Policy, kept: list[Charge], wall: float) -> Entries:
    """The entries a pass records, before it sends anything: one per release, but one per gang (its
    members released to a pool together: how many of the group are on the pool once they are, so a gang of
    any size takes one entry); and the room a gang released in part waits for (its members to repair,
    webhook.queue.gangs) when no entry of `kept` counts it for at least half of `reservationSeconds` more:
    so every admission counts that room for as long as the gang waits, not only for the record its first
    leader made. Nothing to record: no entries."""
    ttl = policy.defaults.reservation_seconds
    expires = wall + ttl
    together: dict[tuple[str, str, PoolKey], list[Release]] = {}
    for r in decided.releases:
        together.setdefault((r.queued.key[0], r.released.group, r.pool), []).append(r)
    mine: list[Charge] = []
    covers: set[PodKey] = set()
    for (namespace, group, pool), releases in together.items():
        if not group or len(releases) == 1:
            mine.extend(recorded(r, policy, expires) for r in releases)
            continue
        each = max((recorded(r, policy, expires) for r in releases), key=lambda c: sum(n for _, n in c.devices))
        on_pool = index.usage.group_pools(namespace, group).get(pool, 0)
        mine.append(each._replace(name=group, members=on_pool))
        covers.update(r.queued.key for r in releases)
    mine.extend(_repairs(decided, index, policy, kept, wall))
    return Entries(mine, frozenset(covers))


def _repairs(decided: Plan, index: PoolIndex, policy: Policy, kept: list[Charge], wall: float) -> list[Charge]:
    """The entries of the gangs waiting to be repaired whose room no kept entry counts long enough."""
    ttl = policy.defaults.reservation_seconds
    waiting: dict[tuple[str, str, PoolKey], list[Wait]] = {}
    for w in decided.waits:
        if w.code == "repair" and w.pools and w.queued.view.group:
            waiting.setdefault((w.queued.key[0], w.queued.view.group, w.pools[0]), []).append(w)
    found = {c.key: c for c in kept if c.members}
    out = []
    for (namespace, group, pool), waits in waiting.items():
        on_pool = index.usage.group_pools(namespace, group).get(pool, 0)
        entry = found.get((namespace, f"group/{group}"))
        if entry is not None and entry.members >= on_pool + len(waits) and entry.expires - wall >= ttl / 2:
            continue
        resource = pool.resource or policy.vendors[pool.vendor].resource
        gpus = max(w.queued.info.gpu_requests.get(resource, 0) for w in waits)
        devices = ((resource, gpus),)
        out.append(Charge(namespace, group, "", devices, wall + ttl, str(pool), members=on_pool + len(waits)))
    return out


class Repairs:
    """The Waits of the gangs waiting to be repaired, kept across the passes that go on from the last one's
    end (webhook.queue.standing: they walk only the Pods that arrived behind it), so their room is recorded
    again by every pass, not only by one over the whole queue."""

    def __init__(self) -> None:
        self.waits: list[Wait] = []

    def of(self, decided: Plan, *, going_on: bool) -> Plan:
        """`decided` with the repairs' Waits in place of its own: a whole pass's, or the last whole pass's
        and those of the Pods a pass that went on walked."""
        repairs = [w for w in decided.waits.one_by_one() if w.code == "repair"]  # a gang's: decided whole
        self.waits = [*self.waits, *repairs] if going_on else repairs
        return decided._replace(waits=Waits.of(self.waits))


ENTRY_BYTES = 512  # what a pass counts per release it may make, at first: a release's entry is ~200 bytes


class Recorder:
    """The leader's records of its releases, written through `store` (None: no API holds charges, nothing is
    recorded). A pass may release as many as fit the bytes left for releases, counted ENTRY_BYTES each;
    a record that does not fit RECORD_BYTES all the same (long names, many pins) is not written, and the
    next passes count twice as much per release, so that fewer are decided at once (one at least, while
    any bytes are left). A gang's members released together take one entry (`entries`), so a gang of any
    size the queue accepts is recorded."""

    def __init__(self, store: ChargeStore | None) -> None:
        self.store = store
        self._entry = ENTRY_BYTES

    def room(self, charges: list[Charge], wall: float, most: int) -> int:
        """How many releases (at most `most`) a pass may decide with `charges` recorded at `wall`."""
        if self.store is None:
            return most
        live = [c for c in charges if c.expires > wall]
        left = min(RELEASE_BYTES - record_bytes(c for c in live if c.release), RECORD_BYTES - record_bytes(live))
        return min(most, max(left // self._entry, 1)) if left > 0 else 0

    def record(self, mine: Entries, still: list[Charge], version: str) -> bool:
        """Record a pass's entries (`mine`, from `entries`) with the charges read at `version` that still
        count (`still`, from `kept`), before any release is sent; False when the charges changed since they
        were read (a Pod naming its node was charged meanwhile), cannot be written or the record would not
        fit: then none may be sent. True without a store."""
        if self.store is None:
            return True
        again = {c.key for c in mine.charges} | mine.covers  # recorded before (an earlier leader's): once
        charges = [*(c for c in still if not (c.release and c.key in again)), *mine.charges]
        size = record_bytes(charges)
        if size > RECORD_BYTES:
            self._entry = min(self._entry * 2, RECORD_BYTES)
            log.warning(
                "no release this pass: %d entries would take %d bytes of the charges; fewer at once",
                len(mine.charges),
                size,
            )
            return False
        self._entry = max(ENTRY_BYTES, self._entry // 2)
        try:
            if self.store.write(charges, version):
                return True
            log.info("the charges changed while a pass decided: it is decided again")
        except ChargeError as exc:
            log.warning("no release this pass: recording them with the charges: %s", exc)
        return False
