"""The pool index: GPU pools with per-node free GPUs, kept up to date one object at a time.

The snapshot file and the live watch cache both feed it node, Pod and quota changes; the decision only
reads it. Everything a decision reads is kept incrementally, so a decision costs the same for 50 Pods as
for 150,000: per pool, nodes are grouped by the labels that pin them and the taints they carry, and each
group keeps its usable nodes in buckets by number of free GPUs.

Capacity that is promised but not yet on a node (a Pending Pod pinned by gpupool, or an admission the
watch has not shown yet) is placed *virtually* on the best-fitting node of its pool, so a burst of
admissions cannot oversubscribe a pool through gpupool's own decisions.

Not thread-safe: the inventory that owns it serialises access.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from webhook.memo import Memo
from webhook.model import NodeInfo, PodInfo, PodKey, PoolKey, QuotaInfo, Taint
from webhook.nodes import NodeFacts, Selector, Unclassified, node_facts
from webhook.policy import Policy


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Capacity of one pool, for metrics and `gpupool inventory`."""

    pool: PoolKey
    resource: str
    memory_mib: int
    nodes: int  # all nodes of the pool
    usable_nodes: int  # Ready and schedulable
    gpus_total: int  # allocatable on usable nodes
    gpus_allocated: int  # held by running or scheduled Pods on usable nodes
    gpus_free: int
    pending: int  # GPUs of admitted or pinned Pods not yet on a node


TaintSet = tuple[Taint, ...]
_Owner = PodKey | int  # a Pod, or a reservation token
T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Group:
    """Nodes of one pool that share a selector and taints: the unit the scheduler cannot tell apart."""

    selector: Selector
    gpu_taints: TaintSet
    other_taints: TaintSet
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    free_of: dict[str, int] = field(default_factory=dict)  # usable node -> free GPUs
    buckets: dict[int, set[str]] = field(default_factory=dict)  # free GPUs -> usable nodes (never empty)
    free_total: int = 0
    memory: Counter[int] = field(default_factory=Counter)
    sizes: Counter[int] = field(default_factory=Counter)  # allocatable GPUs per node, usable or not
    drivers: Counter[tuple[int, ...] | None] = field(default_factory=Counter)

    def max_free(self) -> int:
        return max(self.buckets, default=0)  # buckets are never left empty

    def largest_node(self) -> int:
        """The most GPUs any one node of the group has: a Pod needing more can never run here."""
        return max(self.sizes, default=0)

    def min_memory_mib(self) -> int:
        return min(self.memory) if self.memory else 0

    def min_driver(self) -> tuple[int, ...] | None:
        """The oldest driver in the group; None when any node's driver is unknown."""
        if None in self.drivers or not self.drivers:
            return None
        return min(d for d in self.drivers if d is not None)

    def best_fit(self, need: int, exclude: str = "") -> str | None:
        """The usable node with the fewest free GPUs that still holds `need`."""
        for free in sorted(n for n in self.buckets if n >= need):
            node = next((n for n in self.buckets[free] if n != exclude), None)
            if node is not None:
                return node
        return None


@dataclass(eq=False, slots=True)
class Pool:
    key: PoolKey
    resource: str
    groups: dict[tuple[Selector, TaintSet, TaintSet], Group] = field(default_factory=dict)
    pending: int = 0  # GPUs promised to Pods not yet on a node
    _by_selector: dict[Selector, list[Group]] | None = None  # cache; groups come and go far less than decisions

    def add_group(self, key: tuple[Selector, TaintSet, TaintSet], group: Group) -> None:
        self.groups[key] = group
        self._by_selector = None

    def drop_group(self, key: tuple[Selector, TaintSet, TaintSet]) -> None:
        del self.groups[key]
        self._by_selector = None

    def by_selector(self) -> dict[Selector, list[Group]]:
        """The groups by the nodeSelector that reaches them (one selector may reach several taint sets)."""
        if self._by_selector is None:
            out: dict[Selector, list[Group]] = {}
            for g in self.groups.values():
                out.setdefault(g.selector, []).append(g)
            self._by_selector = out
        return self._by_selector


class _Claim(NamedTuple):
    """What one Pod or reservation adds to the index, so it can be taken back exactly. (A NamedTuple:
    one is built per admission, cheaper than a frozen dataclass; and a reservation is this one object,
    which is all a full garbage collection has to walk for each of them.)"""

    namespace: str
    node: str = ""  # real usage on this node
    requests: tuple[tuple[str, int], ...] = ()
    virtual_node: str = ""  # pending: placed here virtually
    pins: Selector = ()  # the Pod's nodeSelector, to place it virtually again
    pool: PoolKey | None = None
    pool_gpus: int = 0  # GPUs of the pool's resource (class usage, pending)
    reserved: tuple[str, int] = ("", 0)  # (resource, GPUs) not yet in any quota's status.used


class PoolIndex:
    """GPU pools, free GPUs per node, quotas and per-class usage, updated incrementally."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._resources = policy.gpu_resources
        self._pools: dict[PoolKey, Pool] = {}
        self._facts: dict[str, list[NodeFacts]] = {}
        self._unclassified: dict[str, list[Unclassified]] = {}
        self._used: dict[str, Counter[str]] = {}  # node -> resource -> GPUs held by Pods on it
        self._virtual: dict[str, Counter[str]] = {}  # node -> resource -> GPUs promised to Pending Pods
        self._pods: dict[PodKey, _Claim] = {}
        self._quotas: dict[str, dict[str, QuotaInfo]] = {}
        self._class_used: dict[str, Counter[str]] = {}
        self._reserved: Counter[tuple[str, str]] = Counter()  # (namespace, resource) -> GPUs
        self._reservations: dict[int, _Claim] = {}  # token -> what the admitted Pod holds
        self._waiting: dict[tuple[str, PoolKey, int], deque[int]] = {}
        self._expiry: deque[tuple[float, int]] = deque()  # (expires_at, token), oldest first
        self._tokens = itertools.count(1)
        self._holds: dict[str, set[_Owner]] = {}  # node -> claims holding GPUs on it virtually
        self._memo = Memo()  # derived from the node structure; dropped when it changes

    # --- nodes ---------------------------------------------------------------------------------------

    def upsert_node(self, node: NodeInfo) -> None:
        facts, problems = node_facts(node, self.policy)
        if facts == self._facts.get(node.name, []) and problems == self._unclassified.get(node.name, []):
            return  # a status heartbeat, or a CPU node: nothing a decision reads changed
        self.remove_node(node.name)
        if problems:
            self._unclassified[node.name] = problems
        if not facts:
            return
        self._facts[node.name] = facts
        for f in facts:
            pool = self._pools.get(f.pool)
            if pool is None:
                pool = self._pools[f.pool] = Pool(f.pool, f.resource)
            gkey = (f.selector, f.gpu_taints, f.other_taints)
            group = pool.groups.get(gkey)
            if group is None:
                group = Group(f.selector, f.gpu_taints, f.other_taints)
                pool.add_group(gkey, group)
            group.nodes[f.node] = f
            group.memory[f.memory_mib] += 1
            group.sizes[f.allocatable] += 1
            group.drivers[f.driver] += 1
        self._refresh(node.name)

    def remove_node(self, name: str) -> None:
        self._memo.clear()
        self._unclassified.pop(name, None)
        for f in self._facts.pop(name, []):
            pool = self._pools[f.pool]
            gkey = (f.selector, f.gpu_taints, f.other_taints)
            group = pool.groups[gkey]
            self._set_free(group, name, None)
            del group.nodes[name]
            _decrement(group.memory, f.memory_mib)
            _decrement(group.sizes, f.allocatable)
            _decrement(group.drivers, f.driver)
            if not group.nodes:
                pool.drop_group(gkey)
            if not pool.groups and not pool.pending:
                del self._pools[f.pool]

    def _refresh(self, name: str) -> None:
        """Recompute the free GPUs of a node after its usage changed."""
        used, virtual = self._used.get(name), self._virtual.get(name)
        for f in self._facts.get(name, ()):
            group = self._pools[f.pool].groups[(f.selector, f.gpu_taints, f.other_taints)]
            if not f.usable:
                continue
            taken = (used[f.resource] if used else 0) + (virtual[f.resource] if virtual else 0)
            self._set_free(group, name, max(f.allocatable - taken, 0))

    @staticmethod
    def _set_free(group: Group, name: str, free: int | None) -> None:
        old = group.free_of.pop(name, None)
        if old is not None:
            bucket = group.buckets[old]
            bucket.discard(name)
            if not bucket:
                del group.buckets[old]
            group.free_total -= old
        if free is not None:
            group.free_of[name] = free
            group.buckets.setdefault(free, set()).add(name)
            group.free_total += free

    # --- Pods ----------------------------------------------------------------------------------------

    def upsert_pod(self, pod: PodInfo | None, key: PodKey | None = None) -> None:
        """Add or replace a Pod. None (a Pod that holds no GPUs) just removes what `key` held."""
        key = pod.key if pod is not None else key
        if key is None:
            return
        first_sight = key not in self._pods
        self.remove_pod(key)
        if pod is None or pod.terminal:
            return
        if first_sight and pod.pool:
            self._settle_reservation(pod)
        claim = self._claim_for(pod)
        if claim is not None:
            self._pods[key] = claim
            self._apply(claim, +1, key)

    def remove_pod(self, key: PodKey) -> None:
        claim = self._pods.pop(key, None)
        if claim is not None:
            self._apply(claim, -1, key)

    def _claim_for(self, pod: PodInfo) -> _Claim | None:
        pool = PoolKey.parse(pod.pool) if pod.pool else None
        vendor = self.policy.vendors.get(pool.vendor) if pool else None
        pool_gpus = pod.gpu_requests.get(vendor.resource, 0) if vendor else 0
        if pool is not None and (vendor is None or pool.gpu_class not in self.policy.classes):
            pool = None  # a placement this policy cannot account for: count the node usage only
        if pod.node:
            if not pod.gpu_requests and pool is None:
                return None
            return _Claim(
                pod.namespace,
                node=pod.node,
                requests=tuple(pod.gpu_requests.items()),
                pool=pool,
                pool_gpus=pool_gpus if pool else 0,
            )
        if pool is None or not pool_gpus:
            return None
        selector = tuple((k, v) for k, v in pod.node_selector.items())
        return _Claim(
            pod.namespace,
            virtual_node=self._place_virtually(pool, selector, pool_gpus) or "",
            pins=selector,
            pool=pool,
            pool_gpus=pool_gpus,
        )

    def _place_virtually(self, pool_key: PoolKey, pins: Selector, gpus: int, exclude: str = "") -> str | None:
        """The best-fitting usable node of the pool that the Pod's nodeSelector allows."""
        pool = self._pools.get(pool_key)
        if pool is None:
            return None
        pinned = dict(pins)
        best: tuple[int, str] | None = None
        for group in pool.groups.values():
            if any(pinned.get(k, v) != v for k, v in group.selector):
                continue
            node = group.best_fit(gpus, exclude)
            if node is not None and (best is None or group.free_of[node] < best[0]):
                best = (group.free_of[node], node)
        return best[1] if best else None

    def _apply(self, claim: _Claim, sign: int, owner: _Owner) -> None:
        if claim.node:
            used = _counter(self._used, claim.node)
            for resource, n in claim.requests:
                used[resource] += sign * n
            if not +used:
                del self._used[claim.node]
            self._refresh(claim.node)
            if sign > 0:
                self._rebalance(claim.node)
        if claim.pool is not None and claim.pool_gpus:
            cls = _counter(self._class_used, claim.namespace)
            cls[claim.pool.gpu_class] += sign * claim.pool_gpus
            if not claim.node:
                pool = self._pools.get(claim.pool)
                if pool is None and sign > 0:
                    pool = self._pools[claim.pool] = Pool(claim.pool, self.policy.vendors[claim.pool.vendor].resource)
                    self._memo.clear()
                if pool is not None:
                    pool.pending += sign * claim.pool_gpus
                    if not pool.groups and not pool.pending:
                        del self._pools[claim.pool]
                        self._memo.clear()
        if claim.virtual_node:
            resource = self.policy.vendors[claim.pool.vendor].resource if claim.pool else ""
            virtual = _counter(self._virtual, claim.virtual_node)
            virtual[resource] += sign * claim.pool_gpus
            if not +virtual:
                del self._virtual[claim.virtual_node]
            holds = self._holds.setdefault(claim.virtual_node, set())
            if sign > 0:
                holds.add(owner)
            else:
                holds.discard(owner)
                if not holds:
                    del self._holds[claim.virtual_node]
            self._refresh(claim.virtual_node)
        if claim.reserved[1]:
            self._reserved[(claim.namespace, claim.reserved[0])] += sign * claim.reserved[1]

    def _rebalance(self, name: str) -> None:
        """A Pod really landed where virtual holds were guessed: move holds that no longer fit there
        to the best-fitting node that still has room (or leave them unplaced, still counted as pending)."""
        for f in self._facts.get(name, ()):
            while self._overflow(name, f.resource, f.allocatable) > 0:
                owner = next((o for o in self._holds.get(name, ()) if self._claim_of(o).pool_gpus), None)
                if owner is None:
                    break
                claim = self._claim_of(owner)
                self._apply(claim, -1, owner)
                assert claim.pool is not None  # virtual holds always have a pool
                target = self._place_virtually(claim.pool, claim.pins, claim.pool_gpus, exclude=name)
                moved = claim._replace(virtual_node=target or "")
                self._set_claim(owner, moved)
                self._apply(moved, +1, owner)

    def _overflow(self, name: str, resource: str, allocatable: int) -> int:
        used, virtual = self._used.get(name), self._virtual.get(name)
        return (used[resource] if used else 0) + (virtual[resource] if virtual else 0) - allocatable

    def _claim_of(self, owner: _Owner) -> _Claim:
        return self._reservations[owner] if isinstance(owner, int) else self._pods[owner]

    def _set_claim(self, owner: _Owner, claim: _Claim) -> None:
        if isinstance(owner, int):
            self._reservations[owner] = claim
        else:
            self._pods[owner] = claim

    # --- reservations --------------------------------------------------------------------------------

    def reserve(self, namespace: str, pool: PoolKey, selector: Selector, gpus: int, now: float) -> int:
        """Count an admitted Pod against its pool until the watch shows it; returns a token."""
        resource = self.policy.vendors[pool.vendor].resource
        claim = _Claim(
            namespace,
            virtual_node=self._place_virtually(pool, selector, gpus) or "",
            pins=selector,
            pool=pool,
            pool_gpus=gpus,
            reserved=(resource, gpus),
        )
        token = next(self._tokens)
        self._reservations[token] = claim
        self._waiting.setdefault((namespace, pool, gpus), deque()).append(token)
        self._expiry.append((now + self.policy.defaults.reservation_seconds, token))
        self._apply(claim, +1, token)
        return token

    def release(self, token: int) -> None:
        claim = self._reservations.pop(token, None)
        if claim is None:
            return
        assert claim.pool is not None  # a reservation always has its pool
        waiting = (claim.namespace, claim.pool, claim.pool_gpus)
        queue = self._waiting.get(waiting)
        if queue is not None:
            queue.remove(token)
            if not queue:
                del self._waiting[waiting]
        self._apply(claim, -1, token)

    def expire(self, now: float) -> int:
        """Drop reservations whose Pod never showed up (its creation failed later in admission)."""
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, token = self._expiry.popleft()
            if token in self._reservations:
                self.release(token)
                dropped += 1
        return dropped

    def _settle_reservation(self, pod: PodInfo) -> None:
        """A Pod placed by gpupool shows up: it takes over from the oldest matching reservation.
        Admissions do not know the Pod's final name (generateName), so they are matched by namespace,
        pool and GPUs, first in first out."""
        pool = PoolKey.parse(pod.pool)
        vendor = self.policy.vendors.get(pool.vendor) if pool else None
        if pool is None or vendor is None:
            return
        queue = self._waiting.get((pod.namespace, pool, pod.gpu_requests.get(vendor.resource, 0)))
        if queue:
            self.release(queue[0])

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
        return self._memo.get(key, compute)

    # --- what is held, for a re-list to drop what is gone ---------------------------------------------

    def node_names(self) -> set[str]:
        return set(self._facts) | set(self._unclassified)

    def pod_keys(self) -> set[PodKey]:
        return set(self._pods)

    def quota_keys(self) -> set[tuple[str, str]]:
        return {(ns, name) for ns, quotas in self._quotas.items() for name in quotas}

    # --- reading -------------------------------------------------------------------------------------

    def pools(self, vendor: str | None = None) -> Iterator[Pool]:
        return (p for p in self._pools.values() if vendor is None or p.key.vendor == vendor)

    def quotas(self, namespace: str) -> list[QuotaInfo]:
        return list(self._quotas.get(namespace, {}).values())

    def all_quotas(self) -> list[QuotaInfo]:
        return [q for quotas in self._quotas.values() for q in quotas.values()]

    def reserved(self, namespace: str, resource: str) -> int:
        """GPUs admitted in the namespace that no quota's status.used can include yet."""
        return self._reserved.get((namespace, resource), 0)

    def class_used(self, namespace: str, gpu_class: str) -> int:
        return self._class_used.get(namespace, Counter())[gpu_class]

    def unclassified(self) -> list[Unclassified]:
        return [u for problems in self._unclassified.values() for u in problems]

    def node_facts(self, name: str, vendor: str) -> NodeFacts | Unclassified | None:
        """What the index knows of one vendor's GPUs on a node: its facts, why it is not pooled, or None
        when the node has none of that vendor's GPUs (or is not known yet)."""
        facts = next((f for f in self._facts.get(name, ()) if f.pool.vendor == vendor), None)
        return facts or next((u for u in self._unclassified.get(name, ()) if u.vendor == vendor), None)

    def node_free(self, facts: NodeFacts) -> int:
        """Free GPUs of the node's pool resource now (0 when the node is not usable)."""
        group = self._pools[facts.pool].groups[(facts.selector, facts.gpu_taints, facts.other_taints)]
        return group.free_of.get(facts.node, 0)

    def pool_stats(self) -> list[PoolStats]:
        stats = []
        for pool in sorted(self._pools.values(), key=lambda p: p.key):
            nodes = usable = total = allocated = free = 0
            memory = [g.min_memory_mib() for g in pool.groups.values()]
            for group in pool.groups.values():
                nodes += len(group.nodes)
                for name, f in group.nodes.items():
                    if name not in group.free_of:
                        continue
                    usable += 1
                    total += f.allocatable
                    held = self._used.get(name, Counter())[f.resource]
                    allocated += min(held, f.allocatable)
                free += group.free_total
            stats.append(
                PoolStats(
                    pool.key,
                    pool.resource,
                    min(memory, default=0),
                    nodes,
                    usable,
                    total,
                    allocated,
                    free,
                    pool.pending,
                )
            )
        return stats


def _counter(table: dict[str, Counter[str]], key: str) -> Counter[str]:
    """`table[key]`, created when missing (`setdefault` would build a Counter on every call)."""
    counter = table.get(key)
    if counter is None:
        counter = table[key] = Counter()
    return counter


def _decrement(counter: Counter[Any], key: object) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
