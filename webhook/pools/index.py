"""The pool index: GPU pools with their free GPUs, and the GPUs each namespace holds per class, kept up
to date one object at a time.

The snapshot file and the live watch cache both feed it node, Pod and quota changes; the decision only
reads it. What it shows depends only on the objects it holds, never on the order they came in: a Pod
listed before its node, or a pinned Pod before its pool's nodes, is counted as if the nodes had come
first. Everything a decision reads is kept incrementally, so a decision costs the same for 50 Pods as
for 150,000.

Capacity (pools, their groups of nodes, each node's own free GPUs, the packing of holds) is the
capacity index, webhook.pools.capacity. This module keeps what Pods and reservations hold and tells the
capacity index what they take: `set_used` for GPUs used on a node by its bound Pods, `hold` for GPUs
held in a pool for a Pod not on a node yet (a Pending Pod pinned to a pool, an admission the watch has
not shown). The capacity index says when the counts here must follow the nodes: `upsert_node` returns
whether the node's pools changed, `take_reshaped` whether a selector came or went.

Class usage (the policy's classQuota) is counted from where the GPUs are: a Pod bound to a node counts
against the class of that node's pool, whatever its annotations say; an unbound Pod against the pool
its nodeSelector or gpupool.io/pool annotation pins it to (`_place_unbound`). Both follow the nodes: a
node relabelled, added after its Pods or removed moves the usage of the Pods bound to it (kept per
node), and unbound Pods are placed again when a pool gains or loses a selector.

Not thread-safe: the inventory that owns it serialises access.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple, TypeVar

from webhook.domain.model import NodeInfo, PodInfo, PodKey, PoolKey, QuotaInfo
from webhook.domain.policy import Policy, VendorPolicy
from webhook.domain.products import normalise_product
from webhook.pools.capacity import Capacity, PoolStats
from webhook.pools.nodes import UNKNOWN_PRODUCT, NodeFacts, Selector, Unclassified
from webhook.pools.pool import Group, Pool

__all__ = ["Group", "Pool", "PoolIndex", "PoolStats"]

T = TypeVar("T")


class _Claim(NamedTuple):
    """What one Pod or reservation adds to the index, so it can be taken back exactly. (A NamedTuple:
    one is built per admission, cheaper than a frozen dataclass; and a reservation is this one object,
    which is all a full garbage collection has to walk for each of them.)"""

    namespace: str
    node: str = ""  # bound: real usage on this node
    requests: tuple[tuple[str, int], ...] = ()  # bound: GPUs per resource on that node
    holds: tuple[tuple[PoolKey, int], ...] = ()  # not bound: GPUs held per pool (pending)
    pins: Selector = ()  # the pool labels its nodeSelector pins: which of the pool's groups a hold reaches
    classes: tuple[tuple[str, int], ...] = ()  # GPUs counted against the namespace's classes
    reserved: tuple[str, int] = ("", 0)  # (resource, GPUs) not yet in any quota's status.used
    who: tuple[str, str, str] = ("", "", "")  # a reservation's Pod: (namespace, name, generateName)
    echoed: bool = False  # a reservation a re-invocation of its Pod has matched already


class PoolIndex:
    """GPU pools, free GPUs per node, quotas and per-class usage, updated incrementally."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._capacity = Capacity(policy)
        self._used: dict[str, Counter[str]] = {}  # node -> resource -> GPUs requested by Pods bound to it
        self._pods: dict[PodKey, _Claim] = {}
        self._on_node: dict[str, set[PodKey]] = {}  # node -> Pods bound to it (known or not yet)
        self._unbound: dict[PodKey, PodInfo] = {}  # to place again when pools change
        self._quotas: dict[str, dict[str, QuotaInfo]] = {}
        self._class_used: dict[str, Counter[str]] = {}
        self._reserved: Counter[tuple[str, str]] = Counter()  # (namespace, resource) -> GPUs
        self._reservations: dict[int, _Claim] = {}  # token -> what the admitted Pod holds
        # Reservations by what the watch will know the Pod by: its name or generateName (_Who), else,
        # for callers that name no Pod, its namespace, pool and GPUs; oldest first.
        self._waiting: dict[Hashable, deque[int]] = {}
        self._expiry: deque[tuple[float, int]] = deque()  # (made at, token), oldest first
        # What reservations of one pool and size share, so each is one new object for the garbage
        # collector to walk (60,000 of them can wait out their time under a burst).
        self._reservation_parts: dict[tuple[PoolKey, int], tuple[Any, Any, tuple[str, int]]] = {}
        self._tokens = itertools.count(1)

    # --- nodes ---------------------------------------------------------------------------------------

    def upsert_node(self, node: NodeInfo) -> None:
        if self._capacity.upsert_node(node, self._used.get(node.name)):
            self._reclass(node.name)
        self._settle()

    def remove_node(self, name: str) -> None:
        self._capacity.remove_node(name)
        self._reclass(name)
        self._settle()

    def _reclass(self, name: str) -> None:
        """The node's pools changed (or it came or went): the Pods bound to it count against its classes now."""
        for key in self._on_node.get(name, ()):
            claim = self._pods[key]
            classes = self._node_classes(name, claim.requests)
            if classes != claim.classes:
                self._count_classes(claim.namespace, claim.classes, -1)
                self._count_classes(claim.namespace, classes, +1)
                self._pods[key] = claim._replace(classes=classes)

    def _node_classes(self, name: str, requests: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
        """A bound Pod's GPUs by the class of the pool the node is in for each resource's vendor."""
        facts = self._capacity.facts(name)
        if not facts:
            return ()  # not seen yet, or a node gpupool cannot class: counted once it is
        return tuple(
            (f.pool.gpu_class, n)
            for resource, n in requests
            if (vendor := self.policy.vendor_of(resource)) is not None
            for f in facts
            if f.pool.vendor == vendor.name
        )

    # --- Pods ----------------------------------------------------------------------------------------

    def upsert_pod(self, pod: PodInfo | None, key: PodKey | None = None) -> None:
        """Add or replace a Pod. None (a Pod that holds no GPUs) just removes what `key` held."""
        key = pod.key if pod is not None else key
        if key is None:
            return
        first_sight = key not in self._pods
        self._drop_pod(key)
        if pod is not None and not pod.terminal:
            if first_sight:
                self._settle_reservation(pod)
            self._add_pod(key, pod)
        self._settle()

    def remove_pod(self, key: PodKey) -> None:
        self._drop_pod(key)
        self._settle()

    def _add_pod(self, key: PodKey, pod: PodInfo) -> None:
        if pod.node:
            requests = tuple(pod.gpu_requests.items())
            claim = _Claim(
                pod.namespace, node=pod.node, requests=requests, classes=self._node_classes(pod.node, requests)
            )
            self._on_node.setdefault(pod.node, set()).add(key)
        else:
            claim = self._place_unbound(pod)
            self._unbound[key] = pod
        self._pods[key] = claim
        self._apply(claim, +1)

    def _drop_pod(self, key: PodKey) -> None:
        claim = self._pods.pop(key, None)
        if claim is None:
            return
        self._apply(claim, -1)
        if claim.node:
            on_node = self._on_node[claim.node]
            on_node.discard(key)
            if not on_node:
                del self._on_node[claim.node]
        else:
            del self._unbound[key]

    def _place_unbound(self, pod: PodInfo) -> _Claim:
        """Where an unbound Pod's GPUs count: per GPU resource, the one pool of the resource's vendor
        that its nodeSelector reaches (gpupool writes the pool's labels into it); else the pool of its
        gpupool.io/pool annotation, unless the nodeSelector contradicts it; else, without a pool to hold
        GPUs in, the class every reachable pool shares; else nowhere until it is bound."""
        labels = self.policy.pool_labels
        pins = tuple(sorted((k, v) for k, v in pod.node_selector.items() if k in labels))
        annotated = PoolKey.parse(pod.pool) if pod.pool else None
        holds: list[tuple[PoolKey, int]] = []
        classes: list[tuple[str, int]] = []
        for resource, gpus in pod.gpu_requests.items():
            vendor = self.policy.vendor_of(resource)
            if vendor is None:
                continue
            reached = [p.key for p in self._capacity.all_pools() if p.key.vendor == vendor.name and p.reach(pins)]
            if resource != vendor.resource:  # a GPU partition: counts against its class, holds no whole GPU
                if len({p.gpu_class for p in reached}) == 1:
                    classes.append((reached[0].gpu_class, gpus))
            elif len(reached) == 1:
                holds.append((reached[0], gpus))
            elif annotated is not None and self._may_hold(annotated, vendor, pins):
                holds.append((annotated, gpus))
            elif len({p.gpu_class for p in reached}) == 1:
                classes.append((reached[0].gpu_class, gpus))
        classes.extend((pool.gpu_class, gpus) for pool, gpus in holds)
        return _Claim(pod.namespace, holds=tuple(holds), pins=pins, classes=tuple(classes))

    def _may_hold(self, pool: PoolKey, vendor: VendorPolicy, pins: Selector) -> bool:
        """Whether an annotated pool can hold the Pod's GPUs: one this policy knows, of the resource's
        vendor, and not contradicted by the nodeSelector's class or product label."""
        if pool.vendor != vendor.name or pool.gpu_class not in self.policy.classes:
            return False
        pinned = dict(pins)
        gpu_class, product = pinned.get(self.policy.class_label), pinned.get(vendor.product_label)
        if gpu_class is not None and gpu_class != pool.gpu_class:
            return False
        return product is None or (normalise_product(product) or UNKNOWN_PRODUCT) == pool.product

    def _apply(self, claim: _Claim, sign: int) -> None:
        if claim.node and claim.requests:
            used = _counter(self._used, claim.node)
            for resource, n in claim.requests:
                used[resource] += sign * n
            if not +used:
                del self._used[claim.node]
            self._capacity.set_used(claim.node, self._used.get(claim.node))
        for key, gpus in claim.holds:
            self._capacity.hold(key, claim.pins, gpus, sign)
        self._count_classes(claim.namespace, claim.classes, sign)
        if claim.reserved[1]:
            self._reserved[(claim.namespace, claim.reserved[0])] += sign * claim.reserved[1]

    def _count_classes(self, namespace: str, classes: tuple[tuple[str, int], ...], sign: int) -> None:
        if classes:
            counter = _counter(self._class_used, namespace)
            for gpu_class, n in classes:
                counter[gpu_class] += sign * n

    # --- holds ---------------------------------------------------------------------------------------

    def _settle(self) -> None:
        """End of one change: place unbound Pods again if a selector came or went, then pack the holds
        of every pool whose nodes or holds changed."""
        if self._capacity.take_reshaped():
            for pod_key, pod in self._unbound.items():
                old, new = self._pods[pod_key], self._place_unbound(pod)
                if new != old:
                    self._apply(old, -1)
                    self._pods[pod_key] = new
                    self._apply(new, +1)
        self._capacity.pack()

    # --- reservations --------------------------------------------------------------------------------

    def reserve(
        self,
        namespace: str,
        pool: PoolKey,
        selector: Selector,
        gpus: int,
        now: float,
        *,
        name: str = "",
        generate_name: str = "",
        node: str = "",
        echoed: bool = False,
    ) -> int:
        """Count an admitted Pod against its pool until the watch shows it; returns a token.

        `name` or `generate_name` say which Pod it is, so that the watch and a re-invocation find it
        (`take_echo`); a Pod that names its `node` holds its GPUs on that node rather than in the pool.
        `echoed`: a re-invocation has matched it already (it is not matched again)."""
        parts = self._reservation_parts.get((pool, gpus))
        if parts is None:
            resource = self.policy.vendors[pool.vendor].resource
            parts = self._reservation_parts[(pool, gpus)] = (
                ((pool, gpus),),
                ((pool.gpu_class, gpus),),
                (resource, gpus),
            )
        holds, classes, reserved = parts
        who = (namespace, name, "" if name else generate_name)  # the name, once known, is what counts
        if node:
            # Held on the node as its resource (a MIG Pod's instances too, until the watch shows what
            # it really requests: a few seconds of a view that is too full, never too empty).
            claim = _Claim(namespace, node, (reserved,), (), (), classes, reserved, who, echoed)
        else:
            claim = _Claim(namespace, "", (), holds, selector, classes, reserved, who, echoed)
        token = next(self._tokens)
        self._reservations[token] = claim
        self._waiting.setdefault(_waiting_key(claim), deque()).append(token)
        self._expiry.append((now, token))
        self._apply(claim, +1)
        self._settle()
        return token

    def take_echo(
        self, namespace: str, name: str, generate_name: str, *, pool: PoolKey | None, node: str, gpus: int
    ) -> bool:
        """A re-invocation: kube-apiserver calls again for a Pod that already carries the placement
        gpupool gave it moments ago. Takes back that Pod's reservation (same Pod, pool or node, GPUs; not
        matched before), so the caller can decide without counting the Pod against itself and reserve
        again with `echoed=True`. False when there is none: then it is a Pod like any other."""
        if not (name or generate_name):
            return False
        queue = self._waiting.get((namespace, name, "" if name else generate_name))
        for token in reversed(queue or ()):  # the Pod's own is the newest: re-invocation follows at once
            claim = self._reservations[token]
            if claim.echoed or claim.reserved[1] != gpus or claim.node != node:
                continue
            if node or claim.holds[0][0] == pool:
                self.release(token)
                return True
        return False

    def release(self, token: int) -> None:
        self._release(token)
        self._settle()

    def _release(self, token: int) -> None:
        claim = self._reservations.pop(token, None)
        if claim is None:
            return
        key = _waiting_key(claim)
        queue = self._waiting.get(key)
        if queue is not None:
            queue.remove(token)
            if not queue:
                del self._waiting[key]
        self._apply(claim, -1)

    def expire(self, now: float, current_since: float | None = None) -> int:
        """Drop reservations whose Pod never showed up (its creation failed later in admission, or the
        review was not from kube-apiserver): after `reservationSeconds`, or, when the watch has been
        current without a break since `current_since`, once a reservation made in that time is
        `reservationSettleSeconds` old (the Pod would have shown up by then)."""
        defaults = self.policy.defaults
        dropped = 0
        while self._expiry:
            made, token = self._expiry[0]
            settled = (
                current_since is not None
                and made >= current_since
                and made + defaults.reservation_settle_seconds <= now
            )
            if not (settled or made + defaults.reservation_seconds <= now):
                break
            self._expiry.popleft()
            if token in self._reservations:
                self._release(token)
                dropped += 1
        if dropped:
            self._settle()
        return dropped

    def _settle_reservation(self, pod: PodInfo) -> None:
        """A Pod shows up for the first time: it takes over from its admission's reservation. That is
        found by the Pod's name, or (for a Pod made from a generateName, whose name the admission did not
        know) by its generateName, oldest first; else, for reservations that name no Pod, by namespace,
        pool and GPUs, first in first out."""
        for who in ((pod.namespace, pod.name, ""), (pod.namespace, "", pod.generate_name)):
            queue = self._waiting.get(who)
            if queue and (who[1] or who[2]):
                self._release(queue[0])
                return
        pool = PoolKey.parse(pod.pool) if pod.pool else None
        vendor = self.policy.vendors.get(pool.vendor) if pool else None
        if pool is None or vendor is None:
            return
        queue = self._waiting.get((pod.namespace, pool, pod.gpu_requests.get(vendor.resource, 0)))
        if queue:
            self._release(queue[0])

    @property
    def reservations(self) -> int:
        return len(self._reservations)

    # --- quotas --------------------------------------------------------------------------------------

    def upsert_quota(self, quota: QuotaInfo | None, namespace: str = "", name: str = "") -> None:
        if quota is None:
            self.remove_quota(namespace, name)
            return
        self._quotas.setdefault(quota.namespace, {})[quota.name] = quota

    def remove_quota(self, namespace: str, name: str) -> None:
        quotas = self._quotas.get(namespace)
        if quotas is not None:
            quotas.pop(name, None)
            if not quotas:
                del self._quotas[namespace]

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """A value derived from the nodes (pools, groups, their labels and taints) but not from usage:
        computed once per key until a node changes. Decisions use it for what does not depend on free GPUs."""
        return self._capacity.memo(key, compute)

    # --- what is held, for a re-list to drop what is gone ---------------------------------------------

    def node_names(self) -> set[str]:
        return self._capacity.node_names()

    def pod_keys(self) -> set[PodKey]:
        return set(self._pods)

    def quota_keys(self) -> set[tuple[str, str]]:
        return {(ns, name) for ns, quotas in self._quotas.items() for name in quotas}

    # --- reading -------------------------------------------------------------------------------------

    def pools(self, vendor: str | None = None) -> Iterator[Pool]:
        return self._capacity.pools(vendor)

    def quotas(self, namespace: str) -> list[QuotaInfo]:
        return list(self._quotas.get(namespace, {}).values())

    def all_quotas(self) -> list[QuotaInfo]:
        return [q for quotas in self._quotas.values() for q in quotas.values()]

    def reserved(self, namespace: str, resource: str) -> int:
        """GPUs admitted in the namespace that no quota's status.used can include yet."""
        return self._reserved.get((namespace, resource), 0)

    def class_used(self, namespace: str, gpu_class: str) -> int:
        """GPUs of the class the namespace holds: on nodes of the class, pinned to a pool of it, or
        reserved for admissions the watch has not shown yet."""
        counter = self._class_used.get(namespace)
        return counter[gpu_class] if counter else 0

    def unclassified(self) -> list[Unclassified]:
        return self._capacity.unclassified()

    def node_facts(self, name: str, vendor: str) -> NodeFacts | Unclassified | None:
        """What the index knows of one vendor's GPUs on a node: its facts, why it is not pooled, or None
        when the node has none of that vendor's GPUs (or is not known yet)."""
        return self._capacity.node_facts(name, vendor)

    def node_free(self, facts: NodeFacts) -> int:
        """Free GPUs of the node's pool resource now (0 when the node is not usable)."""
        return self._capacity.node_free(facts)

    def pool_stats(self) -> list[PoolStats]:
        return self._capacity.pool_stats()


def _counter(table: dict[str, Counter[str]], key: str) -> Counter[str]:
    """`table[key]`, created when missing (`setdefault` would build a Counter on every call)."""
    counter = table.get(key)
    if counter is None:
        counter = table[key] = Counter()
    return counter


def _waiting_key(claim: _Claim) -> Hashable:
    """Where a reservation waits for its Pod: under the Pod's name or generateName when the admission
    knew them, else under its namespace, pool and GPUs."""
    _, name, generate_name = claim.who
    if name or generate_name:
        return claim.who
    ((pool, gpus),) = claim.holds  # a reservation that names no Pod holds GPUs in its one pool
    return (claim.namespace, pool, gpus)
