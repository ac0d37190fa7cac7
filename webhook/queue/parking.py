"""Parked shapes: a waiting shape is decided again only when something its last decision read changed.

A pass (webhook.queue.release) decides each waiting shape by the one decision (webhook.admission.choice,
in RELEASE mode). Most of a long queue waits for the same thing pass after pass, so deciding each shape
again every pass is work that grows with what waits, not with what changed; and a shape the memo does not
keep (one heavier than a memo entry may be, webhook.pools.memo) costs its request read again and a
ranking over every node of every pool it may reach.

`Parking` keeps, per shape, by its digest (webhook.admission.pod.shape_digest, never the shape itself),
the request read from it and, once a decision left it waiting, that answer with what the answer read:

- the node structure (`index.capacity.structure`): pools, their nodes, the nodes' facts and labels;
- the room of each pool it was a candidate for (`index.capacity.room_changes`): free devices and holds;
- what its namespace holds and its ResourceQuotas (`index.namespace_changes`), when the answer read a
  quota: the namespace has class or GPU-memory quotas, or the Pod waits for a quota or behind others;
- the Pods ahead of it in the pass (`Choice.held`): whether they held each candidate with room it looked
  at (a Pod that waits for capacity had none: its answer does not depend on the Pods ahead);
- whether the Pod has waited long (webhook.queue.backfill): once it has, it may hold a pool;
- the policy and the index themselves: a change of either forgets every answer.

While all of these are as they were, the decision would give the same answer, so the pass takes it
without deciding. The shapes are indexed by the counters they read (a pool's room, a namespace's usage
and quotas): `look` compares each of those counters once, and only when the index changed at all
(`index.changes`), and wakes the shapes of those that moved; a new structure forgets every answer. So a
pass visits a parked shape only once something woke it (or its bound passed): the others cost a lookup,
not a read of the index. Taken, the answer is as a decision's: the shape stays parked, and leaves to
the Pods behind it what it waits for (the same rule as for a decided answer, webhook.queue.release: its
quotas, or the pool it holds once it has waited long), as the decision would have. Any of them changed,
it is decided again. A gang that could not go is parked by its (namespace, group), with its waiting
members, the room of the pools it read, its namespace (its released members are in what the namespace
holds), the pools the Pods ahead held and whether its oldest member waited long (`gang`, `park_gang`).
A Pod of a workload group that is not a gang is parked by its shape and its group (where its siblings
are is identity, and in what the namespace holds, which its answer then always reads).

Bounded: one entry per distinct shape among the waiting Pods (its 16-byte digest, a few counters, and
its request when that adds at most REQUEST_BYTES beyond the shape its Pods hold anyway: the request
shares the shape's node-affinity terms, but builds its own index of a Pod's tolerations), dropped with
its last Pod (`keep_only`, every pass). Not thread-safe: the leader's loop alone uses it.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable
from typing import NamedTuple, TypeVar

from webhook.admission.choice import Ahead, Choice
from webhook.admission.prepared import prepare_view
from webhook.admission.request import GpuRequest
from webhook.admission.verdict import Verdict
from webhook.domain.model import PodKey, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.memo import ENTRY_SHARE, MEMO_BYTES, NO_MEMO, Memo, held_bytes
from webhook.pools.quotas.checks import has_pool_quotas
from webhook.queue.backfill import waited_long
from webhook.queue.lines import Lines
from webhook.queue.waiting import Queued

# A shape's request is kept only if it adds at most this beyond the shape (the memo's bound on an entry,
# webhook.pools.memo): else it is read again whenever a pass reads the batch (its answer is still parked).
REQUEST_BYTES = MEMO_BYTES // ENTRY_SHARE

K = TypeVar("K", PoolKey, str)  # what a counter of the index is kept by: a pool, a namespace


class WaitAnswer(NamedTuple):
    """What a decision answered a Pod that waits, all a pass needs of it (webhook.queue.release)."""

    wait: str  # Choice.wait: capacity, quota or behind
    denial: str
    waits_for: tuple[PoolKey, ...]
    long: bool  # had the Pod decided waited long (webhook.queue.backfill.waited_long)?
    closest: PoolKey | None  # then the pool it holds unless a Pod before it does (backfill.closest_waited)


class _Parked(NamedTuple):
    answer: WaitAnswer
    pools: tuple[PoolKey, ...]  # its candidates: the pools whose room it read
    held: tuple[tuple[PoolKey, bool], ...]  # Choice.held
    namespace: str | None  # the namespace whose usage and quotas it read; None when none


class GangWait(NamedTuple):
    """What a gang that cannot go now was answered (webhook.queue.release: its Wait's fields), and the
    pool it holds against the Pods behind it meanwhile (None: none)."""

    code: str
    reason: str
    pools: tuple[PoolKey, ...]
    held: PoolKey | None
    read: tuple[PoolKey, ...] = ()  # the pools whose room the answer read


class _ParkedGang(NamedTuple):
    answer: GangWait
    members: tuple[PodKey, ...]  # its waiting members when decided: one arriving or leaving wakes it
    ahead: frozenset[PoolKey]  # those of them the Pods ahead held
    long: bool  # had its oldest member waited long (webhook.queue.gangs.room_to_hold)?
    namespace: str  # the gang's: what its namespace holds and its quotas are read


def read_request(q: Queued, policy: Policy, shapes: Memo = NO_MEMO) -> GpuRequest | Verdict:
    """The request admission reads from the Pod's shape, or the verdict that refuses it under `policy`."""
    prepared = prepare_view(q.view, policy, shapes)
    return prepared if isinstance(prepared, Verdict) else prepared.request


class Parking:
    """The requests and the parked answers of the waiting shapes, by digest, for one policy and index."""

    def __init__(self) -> None:
        self._policy: Policy | None = None
        self._index: PoolIndex | None = None
        self._requests: dict[bytes, GpuRequest | Verdict] = {}
        self._parked: dict[bytes, _Parked] = {}
        # The parked shapes by what they read (a pool's room, a namespace's usage and quotas), and the
        # counters as last compared: a pass visits only the shapes a counter that moved woke (`_woken`).
        self._by_room: dict[PoolKey, set[bytes]] = {}
        self._by_namespace: dict[str, set[bytes]] = {}
        self._room_seen: dict[PoolKey, int] = {}
        self._namespace_seen: dict[str, int] = {}
        self._structure_seen = -1
        self._changes_seen = -1  # index.changes when the counters were compared: unmoved, none moved
        self._woken: set[bytes] = set()
        self._gangs: dict[bytes, _ParkedGang] = {}  # by `_token`, indexed with the shapes
        # When parked answers that have not waited long will have (their bound: webhook.queue.backfill),
        # as a heap of (time, token), and per token the wait it was pushed for (older entries are stale);
        # with the queue's clock of the last whole pass, which judged every bound up to then.
        self._bounds: list[tuple[float, bytes]] = []
        self._bound_since: dict[bytes, float] = {}
        self._passed_at = float("-inf")
        self.generation = 0  # moves whenever every parked answer is forgotten (a new index, policy or structure)
        # The answers taken or kept since `begin`, and whether one of them (any, when `_strict`) was woken
        # since: then the Waits made from them may not be what the answers now say (webhook.queue.standing).
        self._taken: set[bytes] = set()
        self._strict = False
        self.stale = False

    def _forget(self, index: PoolIndex | None, policy: Policy | None) -> None:
        """Every parked answer, for a new index or policy."""
        self.generation += 1
        self._index, self._policy = index, policy
        tables = (self._parked, self._gangs, self._by_room, self._by_namespace, self._room_seen, self._namespace_seen)
        for table in tables:
            table.clear()
        self._woken.clear()
        self._bounds.clear()
        self._bound_since.clear()
        self._structure_seen = self._changes_seen = -1

    def begin(self, *, strict: bool) -> None:
        """A pass begins (after its first `look`): `stale` tells at its end whether an answer it took or
        kept was woken meanwhile (with `strict`, whether any answer was: the pass goes on from another's
        Waits, which took answers it does not know)."""
        self._taken.clear()
        self._strict, self.stale = strict, False

    def _wake(self, tokens: set[bytes]) -> None:
        if tokens and (self._strict or not self._taken.isdisjoint(tokens)):
            self.stale = True
        self._woken |= tokens

    def look(self, index: PoolIndex, policy: Policy) -> None:
        """Wake the parked shapes whose counters moved since they were last compared: a pass calls it when
        it starts and after anything that may have changed the index (a release, a gang tried, a pause);
        it reads the counters only when the index changed (`index.changes`), and then one per pool and
        namespace a parked shape reads, never per shape."""
        if index is not self._index or policy is not self._policy:
            self._forget(index, policy)
        if index.changes == self._changes_seen:
            return
        self._changes_seen = index.changes
        capacity = index.capacity
        if capacity.structure != self._structure_seen:
            self._forget(index, policy)
            self._structure_seen, self._changes_seen = capacity.structure, index.changes
            return
        for pool, seen in self._room_seen.items():
            if capacity.room_changes(pool) != seen:
                self._wake(self._by_room.get(pool, set()))
        for namespace, seen in self._namespace_seen.items():
            if index.namespace_changes(namespace) != seen:
                self._wake(self._by_namespace.get(namespace, set()))
        self._room_seen = {pool: capacity.room_changes(pool) for pool in self._room_seen}
        self._namespace_seen = {ns: index.namespace_changes(ns) for ns in self._namespace_seen}

    @property
    def woken(self) -> bool:
        """Is a parked answer woken (after `look`): something it read changed, so it is decided again?
        (Every answer forgotten at once moves `generation` instead.)"""
        return bool(self._woken)

    def __len__(self) -> int:
        """The shapes parked now."""
        return len(self._parked)

    def request(self, q: Queued, policy: Policy, shapes: Memo = NO_MEMO) -> GpuRequest | Verdict:
        """The Pod's request (`read_request`), read once per shape and policy."""
        if policy is not self._policy:
            self._forget(None, policy)
            self._requests.clear()
        if not q.digest:
            return read_request(q, policy, shapes)
        req = self._requests.get(q.digest)
        if req is None:
            req = read_request(q, policy, shapes)
            if _beyond(q, req) <= REQUEST_BYTES:
                self._requests[q.digest] = req
        return req

    @property
    def requests(self) -> int:
        """The requests kept now (one per shape, those within REQUEST_BYTES of it)."""
        return len(self._requests)

    def parked(
        self, q: Queued, req: GpuRequest, index: PoolIndex, policy: Policy, ahead: Ahead, now: float | None
    ) -> WaitAnswer | None:
        """The answer the decision would give the Pod now, if its shape is parked and nothing its last
        answer read has changed, the Pods ahead and whether this Pod has waited long (at `now`, the queue's
        clock) included; the caller leaves to it what it waits for (webhook.queue.release). None: decide it."""
        if index is not self._index or policy is not self._policy:
            self._forget(index, policy)
            return None
        token = _shape_token(q)
        self._taken.add(token)
        entry = self._parked.get(token) if q.digest else None
        if entry is None or token in self._woken:
            return None
        if any(ahead.holds(req, pool, index, policy) != held for pool, held in entry.held):
            return None
        if waited_long(q.since, now, policy) != entry.answer.long:  # its bound passed: it may hold a pool now
            return None
        if not entry.answer.long:
            self._time(token, q.since, policy)  # this Pod's bound (the shape's first Pod may be another now)
        return entry.answer

    def park(
        self,
        q: Queued,
        req: GpuRequest,
        choice: Choice,
        index: PoolIndex,
        policy: Policy,
        answer: WaitAnswer,
    ) -> None:
        """Keep `answer`, that of a decision (`choice`) that left the Pod waiting, with what it read (taken
        now: call it right after the decision)."""
        if not q.digest or choice.wait is None:
            return
        if index is not self._index or policy is not self._policy:
            self._forget(index, policy)
        self.look(index, policy)  # the counters as they are now: this answer read them so
        # A group's Pod reads where its siblings are, which is in what its namespace holds.
        reads_namespace = choice.wait != "capacity" or has_pool_quotas(req.namespace, policy) or bool(q.view.group)
        namespace = req.namespace if reads_namespace else None
        pools = tuple(c.pool for c in choice.decision.candidates)
        token = _shape_token(q)
        self._taken.add(token)
        self._unpark(token)
        self._parked[token] = _Parked(answer, pools, choice.held, namespace)
        self._index_by(token, pools, namespace, index)
        if not answer.long:
            self._time(token, q.since, policy)

    def _index_by(self, token: bytes, pools: tuple[PoolKey, ...], namespace: str | None, index: PoolIndex) -> None:
        """Index a parked answer (`token`: a shape's digest or a gang's) by the counters it read."""
        capacity = index.capacity
        for pool in pools:
            self._by_room.setdefault(pool, set()).add(token)
            self._room_seen.setdefault(pool, capacity.room_changes(pool))
        if namespace is not None:
            self._by_namespace.setdefault(namespace, set()).add(token)
            self._namespace_seen.setdefault(namespace, index.namespace_changes(namespace))
        self._structure_seen = capacity.structure

    def gang(self, members: list[Queued], ahead: Ahead, now: float | None, policy: Policy) -> GangWait | None:
        """The answer a gang (its waiting `members`, in order) that could not go was given, if nothing it
        read has changed since: its waiting members, the room of its pools, its namespace's usage and
        quotas (where its released members are included), which of its pools the Pods ahead hold, and
        whether its oldest member has waited long (at `now`). None: decide it. (After `look`, as a shape.)"""
        token = _token(members[0])
        self._taken.add(token)
        entry = self._gangs.get(token)
        if entry is None or token in self._woken or policy is not self._policy:
            return None
        if tuple(q.key for q in members) != entry.members:
            return None
        if frozenset(p for p in entry.answer.read if p in ahead.pools) != entry.ahead:
            return None
        since = min(q.since for q in members)
        if waited_long(since, now, policy) != entry.long:
            return None
        if not entry.long:
            self._time(token, since, policy)
        return entry.answer

    def park_gang(
        self,
        members: list[Queued],
        answer: GangWait,
        ahead: Collection[PoolKey],
        now: float | None,
        index: PoolIndex,
        policy: Policy,
    ) -> None:
        """Keep the answer of a gang (its waiting `members`) that cannot go now, with what it read, taken
        now (call it right after the decision), and `ahead`, the pools the Pods ahead held before it was
        decided (Ahead.pools then)."""
        if index is not self._index or policy is not self._policy:
            self._forget(index, policy)
        self.look(index, policy)
        token = _token(members[0])
        self._taken.add(token)
        self._unpark_gang(token)
        since = min(q.since for q in members)
        long = waited_long(since, now, policy)
        if not long:
            self._time(token, since, policy)
        held = frozenset(p for p in answer.read if p in ahead)
        namespace = members[0].key[0]
        self._gangs[token] = _ParkedGang(answer, tuple(q.key for q in members), held, long, namespace)
        self._index_by(token, answer.read, namespace, index)

    def _time(self, token: bytes, since: float, policy: Policy) -> None:
        """A parked answer for a wait that began at `since` (the queue's clock) changes at its bound."""
        if self._bound_since.get(token) != since:
            self._bound_since[token] = since
            heapq.heappush(self._bounds, (since + policy.defaults.queue_hold_after_seconds, token))

    def passed(self, now: float | None) -> None:
        """A pass went over every waiting Pod at `now` (the queue's clock): it judged every bound up to then."""
        if now is not None:
            self._passed_at = now

    def wake_at(self) -> float | None:
        """When the next parked answer's bound passes (the queue's clock), after the last whole pass: a pass
        is due then even if nothing changed (the Pod, or gang, may hold a pool from then on). None: none."""
        bounds, hold = self._bounds, self._policy.defaults.queue_hold_after_seconds if self._policy else 0.0
        while bounds:
            at, token = bounds[0]
            since = self._bound_since.get(token)
            parked = token in self._parked or token in self._gangs
            if at > self._passed_at and parked and since is not None and since + hold == at:
                return at
            heapq.heappop(bounds)
        return None

    def keep_gangs(self, keys: set[tuple[str, str]]) -> None:
        """Forget the gangs not among `keys` (those a whole pass judged)."""
        tokens = {_key_token(k) for k in keys}
        for gone in [t for t in self._gangs if t not in tokens]:
            self._unpark_gang(gone)

    def _unpark_gang(self, token: bytes) -> None:
        entry = self._gangs.pop(token, None)
        self._unindex(token, entry.answer.read if entry else (), entry.namespace if entry else None)

    def _unpark(self, digest: bytes) -> None:
        """Forget a shape's parked answer and what it was indexed by."""
        entry = self._parked.pop(digest, None)
        self._unindex(digest, entry.pools if entry else (), entry.namespace if entry else None)

    def _unindex(self, token: bytes, pools: Iterable[PoolKey], namespace: str | None) -> None:
        """Undo `_index_by`: `token` no longer woken, timed or indexed by `pools`' room and `namespace`."""
        self._woken.discard(token)
        self._bound_since.pop(token, None)
        for pool in pools:
            _drop(self._by_room, self._room_seen, pool, token)
        if namespace is not None:
            _drop(self._by_namespace, self._namespace_seen, namespace, token)

    def keep_waiting(self, waiting: Iterable[Queued] | Lines) -> None:
        """`keep_only` the shapes of the `waiting` Pods, and forget the answers of a workload group's Pods
        when no Pod of that group and shape waits (a woken one would make every pass decide the whole
        queue: webhook.queue.standing). Of the queue's lines, one Pod per shape is read (its first)."""
        if isinstance(waiting, Lines):
            waiting = [*(line[0] for line in waiting.shapes), *waiting.grouped]
        tokens = {_shape_token(q) for q in waiting}
        self.keep_only({t[: len(DIGEST)] for t in tokens})
        for gone in [t for t in self._parked if len(t) > len(DIGEST) and t not in tokens]:
            self._unpark(gone)

    def keep_only(self, digests: set[bytes]) -> None:
        """Forget the shapes no Pod of `digests` (those waiting now) has."""
        for gone in [d for d in self._requests if d not in digests]:
            del self._requests[gone]
        for gone in [t for t in self._parked if t[: len(DIGEST)] not in digests]:  # a group's: its shape's
            self._unpark(gone)
        self._woken = {t for t in self._woken if t[: len(DIGEST)] in digests or t in self._gangs}


def _beyond(q: Queued, req: GpuRequest | Verdict) -> int:
    """What keeping the request costs beyond the shape its Pods hold anyway (the request shares most of
    its values: a node affinity's terms; a toleration index it builds anew). Worked out once per shape."""
    shape = held_bytes(q.view.shape)
    return held_bytes((q.view.shape, req), shape + REQUEST_BYTES) - shape  # stops once past the bound


_GANG = b"gang\0"
DIGEST = bytes(16)  # a shape's digest is 16 bytes (webhook.admission.pod.shape_digest)


def _shape_token(q: Queued) -> bytes:
    """The key of the Pod's parked answer: its shape's digest; for a Pod of a workload group, the digest
    and the group (where its siblings are is part of the answer), which begins with the digest."""
    if not q.view.group:
        return q.digest
    return q.digest + b"\0group\0" + q.key[0].encode() + b"\0" + q.view.group.encode()


def _token(member: Queued) -> bytes:
    """The key in the index of parked answers of the gang of `member`."""
    return _key_token((member.key[0], member.view.group))


def _key_token(key: tuple[str, str]) -> bytes:
    """A gang's (namespace, group) as a key in the index of parked answers: never 16 bytes long, so never
    a shape's digest."""
    token = _GANG + key[0].encode() + b"\0" + key[1].encode()
    return token + b"\0" if len(token) == 16 else token


def _drop(by: dict[K, set[bytes]], seen: dict[K, int], key: K, digest: bytes) -> None:
    """`digest` no longer reads `key`; the key's counter is no longer compared once no shape reads it."""
    shapes = by.get(key)
    if shapes is None:
        return
    shapes.discard(digest)
    if not shapes:
        del by[key]
        seen.pop(key, None)
