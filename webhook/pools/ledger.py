"""The ledger: what Pods and reservations hold. Per node, the GPUs its bound Pods request; per Pod not on
a node yet, the GPUs it holds in a pool (the capacity index adds them up per pool and packs them); per
namespace, the GPUs it holds of each class (the policy's classQuota), the GPU memory it holds (its
memoryQuota), the GPUs its Pods request (for the ResourceQuota forms gpupool counts itself) and the GPUs
admitted that no ResourceQuota's status.used includes yet; per workload group, how many of its Pods and
reservations are on each pool.

Each Pod and reservation is one Claim (webhook.pools.claims) that `_apply` adds or takes back exactly.
It tells the capacity index (webhook.pools.capacity) what the claims take: `set_used` for the GPUs used
on a node, `hold` for GPUs held in a pool. It reads the capacity index to work claims out (which pools
a node is in, which pools a nodeSelector reaches), and works them out again when the capacity index
says the nodes changed: a node's pools changed (`reclass`: its bound Pods move to its new classes), or
a selector came or went (`place_unbound_again`). Usage is kept per node name, so Pods listed before
their node count once it comes.

Reservations (webhook.pools.reservations) are admissions the watch has not shown yet: counted like a
Pod until the Pod shows up and takes over, a re-invocation takes them back, or they expire. Reserving,
matching and expiring cost the same for 50 Pods as for 150,000.

Changes end in the PoolIndex façade (webhook.pools.index), which has the capacity index pack its pools
once per change. Not thread-safe: the inventory that owns the index serialises access.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, KeysView

from webhook.domain.model import PodInfo, PodKey, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.capacity import Capacity
from webhook.pools.claims import Claim, Counts, bound_claim, node_classes, node_memory, unbound_claim
from webhook.pools.reservations import Reservation, Reservations
from webhook.pools.unbound import Unbound


class Ledger:
    """GPUs held by Pods and reservations: per node, per pool, per namespace and class, per quota."""

    def __init__(self, policy: Policy, capacity: Capacity) -> None:
        self.policy = policy
        self._capacity = capacity
        self._used: dict[str, Counter[str]] = {}  # node -> resource -> GPUs requested by Pods bound to it
        self._pods: dict[PodKey, Claim] = {}
        self._on_node: dict[str, set[PodKey]] = {}  # node -> Pods bound to it (known or not yet)
        self._unbound = Unbound()  # to place again when pools or nodes change
        self._class_used: dict[str, Counter[str]] = {}
        self._class_pending: Counter[tuple[str, str]] = Counter()  # (namespace, class) -> GPUs reserved
        self._reserved: Counter[tuple[str, str]] = Counter()  # (namespace, resource) -> GPUs
        self._requested: Counter[tuple[str, str]] = Counter()  # (namespace, resource) -> GPUs its Pods request
        self._memory: Counter[str] = Counter()  # namespace -> GPU memory (MiB) held, reservations included
        self._memory_pending: Counter[str] = Counter()  # namespace -> GPU memory (MiB) reserved
        self._groups: dict[tuple[str, str], Counter[PoolKey]] = {}  # (namespace, group) -> pool -> members
        self._reservations = Reservations(policy)

    # --- Pods ----------------------------------------------------------------------------------------

    def upsert_pod(self, pod: PodInfo | None, key: PodKey) -> bool:
        """Add or replace a Pod (None: it holds nothing now). A Pod seen for the first time takes over
        from its admission's reservation. Whether what its namespace holds may have changed: False when
        the Pod's claim is as it was (a queued Pod arriving or changing, which holds and counts nothing; a
        running Pod's status) and no reservation was taken back."""
        before = self._pods.get(key)
        taken = False
        self.remove_pod(key)
        if pod is not None and not pod.holds_nothing:
            if before is None:
                token = self._reservations.shown(pod)
                if token is not None:
                    self.release(token)
                    taken = True
            self._add_pod(key, pod)
        after = self._pods.get(key)
        return taken or not (before == after or (_empty(before) and _empty(after)))

    def remove_pod(self, key: PodKey) -> None:
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
            self._unbound.remove(key)

    def _add_pod(self, key: PodKey, pod: PodInfo) -> None:
        if pod.node:
            claim = bound_claim(pod, self._capacity.facts(pod.node))
            self._on_node.setdefault(pod.node, set()).add(key)
        else:
            claim = self._unbound_claim(pod)
            self._unbound.add(key, pod, claim)
        self._pods[key] = claim
        self._apply(claim, +1)

    def _unbound_claim(self, pod: PodInfo) -> Claim:
        capacity = self._capacity
        return unbound_claim(pod, capacity.all_pools(), self.policy, capacity.pool_memory_mib, capacity.runnable)

    # --- following the nodes -------------------------------------------------------------------------

    def reclass(self, name: str) -> None:
        """The node's pools or memory changed (or it came or went): the Pods bound to it count against its
        classes, and hold its memory, now."""
        facts = self._capacity.facts(name)
        for key in self._on_node.get(name, ()):
            claim = self._pods[key]
            classes = node_classes(facts, claim.requests)
            memory = node_memory(facts, claim.requests)
            if classes != claim.classes or memory != claim.memory_mib:
                self._count_classes(claim.namespace, claim.classes, -1)
                self._count_classes(claim.namespace, classes, +1)
                self._memory[claim.namespace] += memory - claim.memory_mib
                self._pods[key] = claim._replace(classes=classes, memory_mib=memory)

    def place_unbound_again(self, only: Collection[PodKey] | None = None) -> None:
        """A selector came to or went from a pool, or a pool's memory changed: unbound Pods may be pinned
        to other pools, or hold other memory, now. With `only`: those Pods, whose nodes changed in what a
        Pod may require of them (webhook.pools.unbound), so they may be able or unable to run there now."""
        for key in list(self._unbound.pods) if only is None else only:
            pod = self._unbound.pods[key]
            old, new = self._pods[key], self._unbound_claim(pod)
            if new != old:
                self._apply(old, -1)
                self._pods[key] = new
                self._apply(new, +1)
                self._unbound.add(key, pod, new)

    def refit(self, nodes: Collection[str], pools: Collection[PoolKey]) -> None:
        """These nodes (in these pools, before or after) changed in what a Pod may require of them: place
        again the unbound Pods that may be able or unable to run in their pools now."""
        affected = self._unbound.affected(nodes, pools)
        if affected:
            self.place_unbound_again(affected)

    # --- reservations --------------------------------------------------------------------------------

    def reserve(self, reservation: Reservation, now: float) -> int:
        """Count an admitted Pod against its pool (or the node it names) until the watch shows it;
        returns a token. See PoolIndex.reserve."""
        claim = self._reservations.make(
            reservation, memory_mib=reservation.gpus * self._memory_per_gpu(reservation.pool, reservation.node)
        )
        token, crowded = self._reservations.add(claim, now)
        for old in crowded:  # past maxReservationsPerNamespace: the namespace's oldest make room
            self._apply(old, -1)
        self._apply(claim, +1)
        return token

    def take_echo(
        self, namespace: str, name: str, generate_name: str, *, pool: PoolKey | None, node: str, gpus: int
    ) -> bool:
        """Take back a re-invoked Pod's own reservation; False when there is none. See PoolIndex.take_echo."""
        token = self._reservations.echo(namespace, name, generate_name, pool=pool, node=node, gpus=gpus)
        if token is None:
            return False
        self.release(token)
        return True

    def take_admitted(self, namespace: str, name: str, generate_name: str, *, pool: PoolKey | None, node: str) -> bool:
        """Take back the reservation a Pod's mutating call made; False when there is none. See
        PoolIndex.take_admitted."""
        token = self._reservations.admitted(namespace, name, generate_name, pool=pool, node=node)
        if token is None:
            return False
        self.release(token)
        return True

    def release(self, token: int) -> None:
        claim = self._reservations.pop(token)
        if claim is not None:
            self._apply(claim, -1)

    def expire(self, now: float, current_since: float | None) -> int:
        """Take back the reservations whose Pod never showed up; returns how many. See PoolIndex.expire."""
        dropped = self._reservations.expire(now, current_since)
        for claim in dropped:
            self._apply(claim, -1)
        return len(dropped)

    @property
    def reservations(self) -> int:
        return len(self._reservations)

    def _memory_per_gpu(self, pool: PoolKey, node: str) -> int:
        """Memory per GPU of the node a reservation names in `pool`, else of the pool."""
        if node:
            return next((f.memory_mib for f in self._capacity.facts(node) if f.pool == pool), 0)
        return self._capacity.pool_memory_mib(pool)

    # --- counting ------------------------------------------------------------------------------------

    def _apply(self, claim: Claim, sign: int) -> None:
        """Add (+1) or take back (-1) what a claim holds, telling the capacity index what it takes."""
        if claim.node and claim.requests:
            used = _counter(self._used, claim.node)
            for resource, n in claim.requests:
                used[resource] += sign * n
            if not +used:
                del self._used[claim.node]
            self._capacity.set_used(claim.node, self._used.get(claim.node))
        for key, gpus in claim.holds:
            self._capacity.hold(key, claim.pins, gpus, sign)
        namespace = claim.namespace
        self._count_classes(namespace, claim.classes, sign)
        if claim.reserved[1]:
            self._reserved[(namespace, claim.reserved[0])] += sign * claim.reserved[1]
            for gpu_class, n in claim.classes:
                self._class_pending[(namespace, gpu_class)] += sign * n
            self._memory_pending[namespace] += sign * claim.memory_mib
        for resource, n in claim.counted:
            self._requested[(namespace, resource)] += sign * n
        self._memory[namespace] += sign * claim.memory_mib
        if claim.group is not None:
            self._count_member(namespace, claim.group, sign)

    def _count_member(self, namespace: str, member: tuple[str, PoolKey], sign: int) -> None:
        group, pool = member
        pools = self._groups.get((namespace, group))
        if pools is None:
            pools = self._groups[(namespace, group)] = Counter()
        left = pools[pool] + sign
        if left > 0:
            pools[pool] = left
        else:
            del pools[pool]
            if not pools:
                del self._groups[(namespace, group)]  # a finished Job's group leaves nothing behind

    def _count_classes(self, namespace: str, classes: Counts, sign: int) -> None:
        if classes:
            counter = _counter(self._class_used, namespace)
            for gpu_class, n in classes:
                counter[gpu_class] += sign * n

    # --- reading -------------------------------------------------------------------------------------

    def pod_info(self, key: PodKey) -> PodInfo | None:
        """An unbound Pod as the ledger counts it; None for a bound Pod or one it does not hold."""
        return self._unbound.pods.get(key)

    def is_queued(self, key: PodKey) -> bool:
        """Is the Pod known, unbound and still waiting in gpupool's queue?"""
        pod = self._unbound.pods.get(key)
        return pod is not None and pod.queued

    def used_on(self, name: str) -> Counter[str] | None:
        """GPUs per resource the Pods bound to a node request; None when they request none."""
        return self._used.get(name)

    def pod_keys(self) -> set[PodKey]:
        return set(self._pods)

    def holds(self, key: PodKey) -> bool:
        return key in self._pods

    def held(self) -> KeysView[PodKey]:
        """The keys of the Pods the ledger holds, as a live view (no copy: do not hold it across changes)."""
        return self._pods.keys()

    def reserved(self, namespace: str, resource: str) -> int:
        """GPUs admitted in the namespace that no quota's status.used can include yet."""
        return self._reserved.get((namespace, resource), 0)

    def class_used(self, namespace: str, gpu_class: str) -> int:
        """GPUs of the class the namespace holds: on nodes of the class, pinned to a pool of it, or
        reserved for admissions the watch has not shown yet."""
        counter = self._class_used.get(namespace)
        return counter[gpu_class] if counter else 0

    def class_pending(self, namespace: str, gpu_class: str) -> int:
        """The part of `class_used` that is reserved for admissions the watch has not shown yet."""
        return self._class_pending.get((namespace, gpu_class), 0)

    def requested(self, namespace: str, resource: str) -> int:
        """GPUs of `resource` the namespace's non-terminated Pods request, bound or not, as gpupool counts
        them (reservations not included: see `reserved`)."""
        return self._requested.get((namespace, resource), 0)

    def memory_used(self, namespace: str) -> int:
        """GPU memory (MiB) the namespace's Pods and reservations hold: devices x memory per device."""
        return self._memory.get(namespace, 0)

    def memory_pending(self, namespace: str) -> int:
        """The part of `memory_used` that is reserved for admissions the watch has not shown yet."""
        return self._memory_pending.get(namespace, 0)

    def group_pools(self, namespace: str, group: str) -> dict[PoolKey, int]:
        """Per pool, how many of the group's Pods (non-terminated, carrying gpupool.io/pool) and
        reservations are on it; empty when none. One lookup, whatever the number of Pods."""
        return dict(self._groups.get((namespace, group), ()))


def _counter(table: dict[str, Counter[str]], key: str) -> Counter[str]:
    """`table[key]`, created when missing (`setdefault` would build a Counter on every call)."""
    counter = table.get(key)
    if counter is None:
        counter = table[key] = Counter()
    return counter


def _empty(claim: Claim | None) -> bool:
    """Does the claim hold and count nothing (a queued Pod's)?"""
    return claim is None or claim == Claim(claim.namespace)
