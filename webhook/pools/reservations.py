"""Reservations: Pods gpupool admitted that the watch has not shown yet. The ledger (webhook.pools.ledger)
counts each one until its Pod shows up, a re-invocation of its Pod takes it back, or it expires; this
module keeps them and finds them.

A reservation is one Claim (webhook.pools.claims), found three ways: by its token (the admission that
made it); by what the watch will know its Pod by, oldest first: the Pod's name or generateName, or, for
callers that name no Pod, its namespace, pool and GPUs; and by age, for expiry. What reservations of one
pool and size share is built once, so each is one new object for the garbage collector to walk (60,000
of them can wait out their time under a burst). Every operation costs the same however many Pods the
cluster has: the admission path makes, matches and expires reservations.

Reservations whose Pod never shows up (its creation failed later in admission, or the review was not
kube-apiserver's) cost little. With a Pod watch current since before a reservation was made, it is gone
once `reservationSettleSeconds` old; made before that (the watch down or still listing, when its Pod may
have been missed), after `reservationSeconds`, in a queue of their own so they never hold the others up.
And at most `maxReservationsPerNamespace` wait in one namespace: the next one pushes out that namespace's
oldest. A real Pod's reservation is taken over by the watch within about a second, so the oldest are the
ones whose Pods are not coming; pushing them out keeps a real burst exact, where refusing the namespace's
admissions or admitting them uncounted would let a stream of forged reviews block or overbook it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Any, NamedTuple

from webhook.domain.model import PodInfo, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.claims import Claim
from webhook.pools.nodes import Selector


class Reservation(NamedTuple):
    """What an admission reserves until the watch shows its Pod (PoolIndex.reserve). Built by keyword, at
    its one call site (webhook.admission.core.reserve_for). (A NamedTuple: one is built per admission.)"""

    namespace: str
    pool: PoolKey
    selector: Selector  # the pool labels its nodeSelector pins once patched: which of the pool's groups it reaches
    gpus: int
    name: str = ""  # the Pod's name, or
    generate_name: str = ""  # what it is made from: so that the watch and a re-invocation find it
    node: str = ""  # the node a Pod that bypasses placement lands on: its GPUs are held there, not in the pool
    echoed: bool = False  # a re-invocation has matched it already (it is not matched again)
    group: str = ""  # the Pod's workload group, a member of which it holds on the pool from now on
    confirmed: bool = False  # made by the Pod's validating call: `admitted` never finds it


class Reservations:
    """Reservations by token, by the Pod they wait for, and by age."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._claims: dict[int, Claim] = {}  # token -> what the admitted Pod holds
        self._waiting: dict[Hashable, deque[int]] = {}  # `_waiting_key` -> tokens, oldest first
        self._expiry: deque[tuple[float, int]] = deque()  # (made at, token), oldest first
        self._unsettled: deque[tuple[float, int]] = deque()  # made before the watch was current, oldest first
        self._by_namespace: dict[str, OrderedDict[int, None]] = {}  # namespace -> tokens, oldest first
        self._parts: dict[tuple[PoolKey, int], tuple[Any, Any, tuple[str, int]]] = {}
        self._tokens = itertools.count(1)

    def __len__(self) -> int:
        return len(self._claims)

    def make(self, reservation: Reservation, memory_mib: int = 0) -> Claim:
        """What an admitted Pod holds: its GPUs in its pool where its selector reaches, or on its node when
        it names one; counted against the pool's class and its namespace's quotas (`memory_mib` of GPU
        memory), and as a member of its workload group on the pool."""
        namespace, pool, selector, gpus, name, generate_name, node, echoed, group, confirmed = reservation
        parts = self._parts.get((pool, gpus))
        if parts is None:
            resource = pool.resource or self.policy.vendors[pool.vendor].resource
            parts = self._parts[(pool, gpus)] = (((pool, gpus),), ((pool.gpu_class, gpus),), (resource, gpus))
        holds, classes, reserved = parts
        who = (namespace, name, "" if name else generate_name)  # the name, once known, is what counts
        member = (group, pool) if group else None
        # On its node, held as the pool's resource (the watch shows what the Pod really requests); else in
        # the pool, where its selector reaches.
        return Claim(
            namespace,
            node=node,
            requests=(reserved,) if node else (),
            holds=() if node else holds,
            pins=() if node else selector,
            classes=classes,
            reserved=reserved,
            who=who,
            echoed=echoed,
            memory_mib=memory_mib,
            group=member,
            confirmed=confirmed,
        )

    def add(self, claim: Claim, now: float) -> tuple[int, list[Claim]]:
        """Keep a reservation made at `now`; returns its token, and the reservations of its namespace it
        pushed out (the oldest, past `maxReservationsPerNamespace`), which the caller takes back."""
        crowded = []
        waiting = self._by_namespace.get(claim.namespace)
        while waiting and len(waiting) >= self.policy.defaults.max_reservations_per_namespace:
            oldest = self.pop(next(iter(waiting)))
            if oldest is not None:
                crowded.append(oldest)
            waiting = self._by_namespace.get(claim.namespace)  # pop drops the namespace's entry once empty
        token = next(self._tokens)
        self._claims[token] = claim
        self._waiting.setdefault(_waiting_key(claim), deque()).append(token)
        self._expiry.append((now, token))
        self._by_namespace.setdefault(claim.namespace, OrderedDict())[token] = None
        return token, crowded

    def pop(self, token: int) -> Claim | None:
        """Forget a reservation; None when it is gone already. (Its place in the expiry queue is left,
        and skipped when it comes up.)"""
        claim = self._claims.pop(token, None)
        if claim is None:
            return None
        key = _waiting_key(claim)
        queue = self._waiting.get(key)
        if queue is not None:
            queue.remove(token)
            if not queue:
                del self._waiting[key]
        namespace = self._by_namespace[claim.namespace]
        del namespace[token]
        if not namespace:
            del self._by_namespace[claim.namespace]
        return claim

    def in_namespace(self, namespace: str) -> int:
        """How many reservations wait in `namespace`."""
        return len(self._by_namespace.get(namespace, ()))

    def echo(
        self, namespace: str, name: str, generate_name: str, *, pool: PoolKey | None, node: str, gpus: int
    ) -> int | None:
        """The token of a re-invoked Pod's own reservation: same Pod, pool or node, GPUs, and not matched
        before. None when there is none."""
        if not (name or generate_name):
            return None
        queue = self._waiting.get((namespace, name, "" if name else generate_name))
        for token in reversed(queue or ()):  # the Pod's own is the newest: re-invocation follows at once
            claim = self._claims[token]
            if claim.echoed or claim.reserved[1] != gpus or claim.node != node:
                continue
            if node or claim.holds[0][0] == pool:
                return token
        return None

    def admitted(self, namespace: str, name: str, generate_name: str, *, pool: PoolKey | None, node: str) -> int | None:
        """The token of the reservation a Pod's mutating call made, as its validating call finds it: by then
        kube-apiserver has generated the Pod's name, so under that name, else under its generateName,
        oldest first (as `shown` takes them); one on `node` when it names one, else in `pool` (None: any
        pool), else (the Pod changed since: a later webhook bound it or repointed it) the first one there.
        Never a confirmed one: each Pod is validated once, so a confirmed reservation is already its Pod's.
        None when there is none (another replica admitted the Pod, or the reservation settled). A
        generateName's queue is scanned for the pool: at most `maxReservationsPerNamespace` long."""
        first = None
        for who in ((namespace, name, ""), (namespace, "", generate_name)):
            if not (who[1] or who[2]):
                continue
            for token in self._waiting.get(who, ()):
                claim = self._claims[token]
                if claim.confirmed:
                    continue
                if claim.node == node and (node or pool is None or claim.holds[0][0] == pool):
                    return token
                first = token if first is None else first
        return first

    def shown(self, pod: PodInfo) -> int | None:
        """The token of the reservation a Pod the watch shows for the first time takes over: found by the
        Pod's name, or (for a Pod made from a generateName, whose name the admission did not know) by its
        generateName, oldest first; else, for reservations that name no Pod, by namespace, pool and GPUs,
        first in first out. None when there is none."""
        for who in ((pod.namespace, pod.name, ""), (pod.namespace, "", pod.generate_name)):
            queue = self._waiting.get(who)
            if queue and (who[1] or who[2]):
                return queue[0]
        pool = PoolKey.parse(pod.pool) if pod.pool else None
        vendor = self.policy.vendors.get(pool.vendor) if pool else None
        if pool is None or vendor is None:
            return None
        queue = self._waiting.get((pod.namespace, pool, pod.gpu_requests.get(pool.resource or vendor.resource, 0)))
        return queue[0] if queue else None

    def expire(self, now: float, current_since: float | None) -> list[Claim]:
        """Forget the reservations whose Pod never showed up, and return them: after
        `reservationSeconds`, or, when the watch has been current without a break since `current_since`,
        once a reservation made in that time is `reservationSettleSeconds` old (the Pod would have shown
        up by then). One made before `current_since` waits its full time in `_unsettled`, never in the
        way of the younger ones behind it."""
        defaults = self.policy.defaults
        dropped = []
        while self._expiry:
            made, token = self._expiry[0]
            if token not in self._claims:  # shown, echoed or pushed out already
                self._expiry.popleft()
            elif made + defaults.reservation_seconds <= now or (
                current_since is not None
                and made >= current_since
                and made + defaults.reservation_settle_seconds <= now
            ):
                self._expiry.popleft()
                dropped.append(self._claims[token])
                self.pop(token)
            elif current_since is not None and made < current_since:
                self._unsettled.append(self._expiry.popleft())
            else:
                break
        while self._unsettled and self._unsettled[0][0] + defaults.reservation_seconds <= now:
            _, token = self._unsettled.popleft()
            claim = self.pop(token)
            if claim is not None:
                dropped.append(claim)
        return dropped


def _waiting_key(claim: Claim) -> Hashable:
    """Where a reservation waits for its Pod: under the Pod's name or generateName when the admission
    knew them, else under its namespace, pool and GPUs."""
    _, name, generate_name = claim.who
    if name or generate_name:
        return claim.who
    ((pool, gpus),) = claim.holds  # a reservation that names no Pod holds GPUs in its one pool
    return (claim.namespace, pool, gpus)
