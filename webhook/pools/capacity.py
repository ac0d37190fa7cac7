"""The capacity index: GPU pools, their groups of nodes, each node's facts and own free GPUs, and the
packing of the GPUs held in each pool. What a decision reads about capacity comes from here.

It knows nodes, not Pods. The ledger (webhook.pools.ledger) tells it what Pods and reservations take:
`set_used` (these GPUs are used on node N by the Pods bound to it) and `hold` (these GPUs are held in
pool P for a Pod not on a node yet). It tells the ledger, through what `upsert_node` and
`take_reshaped` return, when the ledger's counts must follow the nodes: a node's pools or memory per GPU
changed (its Pods count against other classes, or hold other memory), or a selector came or went, or a
pool's memory per GPU changed (unbound Pods may reach other pools, or hold other memory).
The PoolIndex façade (webhook.pools.index) carries these between the two.

A node's own free GPUs are its allocatable minus what is used on it, kept per group of its pool
(webhook.pools.pool). Pools whose nodes or holds changed are packed again once per change (`pack`),
not once per step of it. A pool lasts while it has nodes or holds: one with only pending GPUs is still
a pool decisions list.

Not thread-safe: the inventory that owns the index serialises access.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from webhook.domain.affinity import PoolConstraint
from webhook.domain.model import NodeInfo, PodInfo, PoolKey, Selector, could_run
from webhook.domain.policy import Policy
from webhook.pools.constraints import Inseparable, Keys, Member, pool_constraint
from webhook.pools.memo import Memo
from webhook.pools.node_devices import MIG_CHANGING, MIG_STATE_LABEL, SHARING_STRATEGIES
from webhook.pools.nodes import NodeFacts, Unclassified, node_facts
from webhook.pools.pool import Group, Pool, decrement, group_key, pack

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Capacity of one pool, for metrics and `gpupool inventory`."""

    pool: PoolKey
    resource: str
    memory_mib: int  # per device
    nodes: int  # all nodes of the pool
    usable_nodes: int  # Ready and schedulable
    gpus_total: int  # allocatable on usable nodes
    gpus_allocated: int  # held by running or scheduled Pods on usable nodes
    gpus_free: int  # once the pool's holds are placed; none on nodes the leader keeps from new Pods
    pending: int  # GPUs held for admitted or pinned Pods not yet on a node
    kind: str = "gpu"  # the pool's devices: gpu, mig or shared
    profile: str = ""  # a MIG pool's profile
    replicas: tuple[int, ...] = ()  # a shared pool's replicas per GPU, each number its nodes have
    largest_free: int = 0  # the most free on one usable node once the holds are placed (a bigger Pod waits)


class Capacity:
    """GPU pools and free GPUs per node, from nodes and what the ledger says is used and held."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._pools: dict[PoolKey, Pool] = {}
        self._facts: dict[str, list[NodeFacts]] = {}
        self._unclassified: dict[str, list[Unclassified]] = {}
        self._nodes: dict[str, NodeInfo] = {}  # every node that offers a GPU resource, as last seen
        self._offering: dict[str, set[str]] = {}  # resource -> the nodes that offer it
        # Nodes that changed in what a Pod may require of them (labels, taints, allocatable) since the last
        # `take_changed`, with the pools and resources they were or are in.
        self._changed: tuple[set[str], set[PoolKey]] = (set(), set())
        self._unpacked: set[PoolKey] = set()  # pools whose holds must be packed again
        self._reshaped: set[tuple[PoolKey, Selector]] = set()  # selectors that came or went (toggled)
        self._remeasured = False  # a pool's memory per GPU changed
        self._memo = Memo()  # derived from the node structure; dropped when it changes
        # Change counters, for the queue to tell what changed since it decided a shape (webhook.queue.parking):
        # `structure` counts the changes of the node structure (every drop of the memo), `_room` each pool's
        # changes of its free devices, told by comparing what a decision reads of them (`_room_of`) at the
        # end of each change to what it was (a Pod's status update, taken out and put back, changes none).
        self.structure = 0
        self._room: dict[PoolKey, int] = {}
        self._room_seen: dict[PoolKey, tuple[tuple[int, tuple[tuple[int, int], ...]], ...]] = {}
        self._room_touched: set[PoolKey] = set()  # pools whose free devices may have changed in this change
        # Nodes kept from new Pods (the queue's leader drains or holds them: `exclude`): counted as full, and
        # left out of their pools' constraints by name (webhook.pools.constraints, step 4).
        self._excluded: frozenset[str] = frozenset()
        self._kept_free: dict[str, dict[str, int]] = {}  # excluded node -> resource -> its free devices, unused

    # --- nodes ---------------------------------------------------------------------------------------

    def upsert_node(self, node: NodeInfo, used: Mapping[str, int] | None) -> bool:
        """Add or replace a node; `used` is what the Pods bound to it request per resource (the ledger's
        `used_on`), which may have been counted before the node was seen. True when the node's pools or
        memory changed (it came, went from a class, moved to another, or was relabelled with other memory):
        the ledger must count its Pods again."""
        if self._nodes.get(node.name) == node:
            return False  # a status heartbeat: nothing a decision reads changed
        self._keep_node(node)
        facts, problems = node_facts(node, self.policy)
        self._changed[1].update(f.pool for f in facts)
        old = self._facts.get(node.name, [])
        if facts == old and problems == self._unclassified.get(node.name, []):
            return False  # a CPU node, or labels no pool reads (the memo is dropped: a Pod may require them)
        before = self._memories(old, facts)
        self._drop_facts(node.name)
        if problems:
            self._unclassified[node.name] = problems
        if facts:
            self._facts[node.name] = facts
            for f in facts:
                self._add_facts(f)
            self.set_used(node.name, used)
        self._remeasured |= before != self._memories(old, facts)
        return _classes_of(facts) != _classes_of(old)

    def remove_node(self, name: str) -> None:
        """Forget a node. Its pools changed: the ledger counts its Pods again (against no class now)."""
        old = self._facts.get(name, [])
        before = self._memories(old, [])
        self._kept_free.pop(name, None)
        self._forget_node(name)
        self._drop_facts(name)
        self._remeasured |= before != self._memories(old, [])

    def _keep_node(self, node: NodeInfo) -> None:
        """Remember the node as it is now, if it offers a GPU resource (what constraints and `could_run`
        read); whatever it changed, decisions derived from the nodes are worked out again."""
        old = self._nodes.get(node.name)
        self._restructured()
        if old is not None and _requirable(old) == _requirable(node):
            self._nodes[node.name] = node  # readiness or a cordon: no Pod requires those of a node
            return
        self._forget_node(node.name)
        if node.allocatable:
            self._touched(node)
            self._nodes[node.name] = node
            for resource in node.allocatable:
                self._offering.setdefault(resource, set()).add(node.name)

    def _touched(self, node: NodeInfo) -> None:
        nodes, pools = self._changed
        nodes.add(node.name)
        pools.update(f.pool for f in self._facts.get(node.name, ()))

    def take_changed(self) -> tuple[set[str], set[PoolKey]]:
        """The nodes that changed in what a Pod may require of them since the last call, and the pools they
        were in before or are in now."""
        changed, self._changed = self._changed, (set(), set())
        return changed

    def _forget_node(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is None:
            return
        self._touched(old)
        for resource in old.allocatable:
            offering = self._offering[resource]
            offering.discard(name)
            if not offering:
                del self._offering[resource]

    def _memories(self, *facts: list[NodeFacts]) -> list[int]:
        """The memory per GPU of the pools these facts are in (to tell whether a change moved it)."""
        return [self.pool_memory_mib(key) for key in sorted({f.pool for fs in facts for f in fs})]

    def _add_facts(self, f: NodeFacts) -> None:
        pool = self._pools.get(f.pool)
        if pool is None:
            pool = self._pools[f.pool] = Pool(f.pool, f.resource)
        gkey = group_key(f)
        group = pool.groups.get(gkey)
        if group is None:
            group = Group(f.selector, f.gpu_taints, f.other_taints)
            pool.add_group(gkey, group)
            self._unpacked.add(pool.key)
        group.add_node(f)
        if not pool.selector_nodes[f.selector]:
            self._reshaped ^= {(f.pool, f.selector)}
        pool.selector_nodes[f.selector] += 1

    def _drop_facts(self, name: str) -> None:
        self._restructured()
        self._unclassified.pop(name, None)
        for f in self._facts.pop(name, []):
            pool = self._pools[f.pool]
            gkey = group_key(f)
            group = pool.groups[gkey]
            self._set_own_free(pool, group, name, None)
            group.drop_node(f)
            if not group.nodes:
                pool.drop_group(gkey)
                self._unpacked.add(pool.key)
            decrement(pool.selector_nodes, f.selector)
            if not pool.selector_nodes[f.selector]:
                self._reshaped ^= {(f.pool, f.selector)}
            self._drop_if_empty(pool)

    def _restructured(self) -> None:
        """The node structure changed: what was derived from it is worked out again."""
        self._memo.clear()
        self.structure += 1

    def _set_own_free(self, pool: Pool, group: Group, name: str, free: int | None) -> None:
        self._room_touched.add(pool.key)
        unheld = not pool.holds and pool.key not in self._unpacked
        group.set_own_free(name, free, unheld)
        if not unheld:
            self._unpacked.add(pool.key)  # packed again at the end of this change

    def _drop_if_empty(self, pool: Pool) -> None:
        if not pool.groups and not pool.pending and not pool.holds:
            del self._pools[pool.key]
            self._restructured()

    def exclude(self, names: frozenset[str]) -> set[str]:
        """Keep the nodes `names` (and no others) from new Pods from now on: no free GPUs counted on them, and
        every pool's constraint leaves them out. The nodes whose exclusion changed, for the caller to count
        their free GPUs again (`set_used`)."""
        changed = set(names ^ self._excluded)
        if changed:
            self._excluded = names
            self._restructured()  # the constraints of their pools change
        return changed

    @property
    def excluded(self) -> frozenset[str]:
        return self._excluded

    # --- what the ledger says is used and held ---------------------------------------------------------

    def set_used(self, name: str, used: Mapping[str, int] | None) -> None:
        """The GPUs the Pods bound to node `name` request changed (or its facts did): recompute its own
        free GPUs. `used`: GPUs per resource, None when nothing is used."""
        self._kept_free.pop(name, None)
        for f in self._facts.get(name, ()):
            if f.usable:
                pool = self._pools[f.pool]
                free = max(f.allocatable - (used.get(f.resource, 0) if used else 0), 0)
                if name in self._excluded:  # no room for new Pods; what its Pods use is still what they use
                    self._kept_free.setdefault(name, {})[f.resource] = free
                    free = 0
                self._set_own_free(pool, pool.groups[group_key(f)], name, free)

    def hold(self, key: PoolKey, pins: Selector, gpus: int, sign: int) -> None:
        """Hold (+1) `gpus` GPUs in pool `key` for a Pod not on a node yet whose nodeSelector pins `pins`,
        or take them back (-1). A pool not known yet is made: its holds wait for its nodes."""
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = Pool(key, key.resource or self.policy.vendors[key.vendor].resource)
            self._restructured()  # a pool with only pending GPUs is still a pool decisions list
        pool.hold(pins, gpus, sign)
        self._unpacked.add(key)
        self._drop_if_empty(pool)

    # --- end of one change -----------------------------------------------------------------------------

    def take_reshaped(self) -> bool:
        """Whether a selector came to or went from a pool, or a pool's memory per GPU changed, since the
        last call: which pools a nodeSelector reaches, or the memory a Pod holds there, may have changed,
        so the ledger places unbound Pods again (a node that changed only in what a Pod may require of it
        is `take_changed`'s)."""
        if not self._reshaped and not self._remeasured:
            return False
        self._reshaped.clear()
        self._remeasured = False
        return True

    def pack(self) -> None:
        """Pack the holds of every pool whose nodes or holds changed."""
        for key in self._unpacked:
            pool = self._pools.get(key)
            if pool is not None:
                pack(pool)
        self._room_touched |= self._unpacked
        self._unpacked.clear()
        for key in self._room_touched:
            pool = self._pools.get(key)
            room = _room_of(pool) if pool is not None else ()
            if self._room_seen.get(key) != room:
                self._room_seen[key] = room
                self._room[key] = self._room.get(key, 0) + 1
        self._room_touched.clear()

    # --- reading -------------------------------------------------------------------------------------

    def pools(self, vendor: str | None = None) -> Iterator[Pool]:
        return (p for p in self._pools.values() if vendor is None or p.key.vendor == vendor)

    def all_pools(self) -> Collection[Pool]:
        """Every pool, as a live view of the index (no copy): for the ledger to place unbound Pods."""
        return self._pools.values()

    def facts(self, name: str) -> list[NodeFacts]:
        """A node's facts, one per vendor it has pooled GPUs of; empty when it has none or is not known."""
        return self._facts.get(name, [])

    def node_names(self) -> set[str]:
        return set(self._facts) | set(self._unclassified)

    def memo(self, key: Hashable, compute: Callable[[], T], size: Callable[[T], int] | None = None) -> T:
        """A value derived from the nodes (pools, groups, their labels and taints) but not from usage:
        computed once per key until a node changes. Decisions use it for what does not depend on free GPUs.
        `size` weighs an entry (webhook.pools.memo.Memo.get)."""
        return self._memo.get(key, compute, size)

    def room_changes(self, key: PoolKey) -> int:
        """How often what a decision reads of pool `key`'s free devices changed (0 for a pool never seen):
        equal counts, equal room."""
        return self._room.get(key, 0)

    def node(self, name: str) -> NodeInfo | None:
        """A node that offers a GPU resource, as last seen; None for any other."""
        return self._nodes.get(name)

    def gpu_nodes(self) -> Collection[NodeInfo]:
        """Every node that offers a GPU resource, as a live view (no copy)."""
        return self._nodes.values()

    def runnable(self, pool: Pool, pod: PodInfo, pins: Selector) -> str:
        """A node of the pool that could ever take the Pod (webhook.domain.model.could_run); "" for none.
        Only the node groups its nodeSelector's pool labels `pins` reach are looked at."""
        groups = pool.ordered()
        for i in pool.reach(pins):
            for name in groups[i].nodes:
                node = self._nodes.get(name)
                if node is not None and could_run(pod, node):
                    return name
        return ""

    def members(self, key: PoolKey) -> list[NodeInfo]:
        """The nodes of a pool, usable or not, in a fixed order (by name)."""
        pool = self._pools.get(key)
        if pool is None:
            return []
        return [self._nodes[name] for name in sorted(n for g in pool.groups.values() for n in g.nodes)]

    def constraint(self, key: PoolKey) -> PoolConstraint | Inseparable:
        """What sends a Pod to exactly this pool's nodes among every node that offers its resource
        (webhook.pools.constraints), worked out once until a node changes."""
        return self._memo.get(("constraint", key), lambda: self._constraint(key))

    def _constraint(self, key: PoolKey) -> PoolConstraint | Inseparable:
        pool = self._pools[key]
        members = [
            Member(name, self._nodes[name].labels, group.selector)
            for group in pool.ordered()
            for name in sorted(group.nodes)
        ]
        names = {m.name for m in members}
        others = [(n, self._nodes[n].labels) for n in sorted(self._offering.get(pool.resource, ())) if n not in names]
        return pool_constraint(members, others, self._keys(key, pool.resource), self._excluded)

    def _keys(self, key: PoolKey, resource: str) -> Keys:
        vendor = self.policy.vendors[key.vendor]
        order = [
            *([MIG_STATE_LABEL] if vendor.partition_prefixes else []),
            f"{resource}.replicas",
            f"{resource}.sharing-strategy",
            f"{resource}.count",
            vendor.product_label,
            f"{resource}.product",
        ]
        return Keys(
            class_label=self.policy.class_label,
            classes=self.policy.classes,
            gpu_class=key.gpu_class,
            order=tuple(dict.fromkeys(order)),
            exclusive={MIG_STATE_LABEL: MIG_CHANGING, f"{resource}.sharing-strategy": SHARING_STRATEGIES},
        )

    def inseparable(self) -> list[tuple[PoolKey, Inseparable]]:
        """Every pool no constraint can reach exactly (`constraint`), for warnings."""
        return [
            (pool.key, found)
            for pool in sorted(self._pools.values(), key=lambda p: p.key)
            if pool.groups and isinstance(found := self.constraint(pool.key), Inseparable)
        ]

    def unclassified(self) -> list[Unclassified]:
        return [u for problems in self._unclassified.values() for u in problems]

    def node_facts(self, name: str, resource: str) -> NodeFacts | Unclassified | None:
        """What the index knows of the devices of one resource on a node (a node may offer whole GPUs and
        MIG instances of one vendor): their facts, why the vendor's devices are not pooled, or None when
        the node has none (or is not known yet)."""
        facts = next((f for f in self._facts.get(name, ()) if f.resource == resource), None)
        vendor = self.policy.vendor_of(resource)
        if facts is not None or vendor is None:
            return facts
        return next((u for u in self._unclassified.get(name, ()) if u.vendor == vendor.name), None)

    def pool_memory_mib(self, key: PoolKey) -> int:
        """Memory per GPU of a pool: the least of its nodes' (what `gpupool inventory` shows); 0 when it
        has no nodes or their memory is not known."""
        pool = self._pools.get(key)
        return min((g.min_memory_mib() for g in pool.groups.values()), default=0) if pool is not None else 0

    def node_free(self, facts: NodeFacts) -> int:
        """Free GPUs of the node's pool resource now (0 when the node is not usable)."""
        return self._pools[facts.pool].groups[group_key(facts)].own_free.get(facts.node, 0)

    def pool_stats(self) -> list[PoolStats]:
        stats = []
        for pool in sorted(self._pools.values(), key=lambda p: p.key):
            nodes = usable = total = allocated = free = largest = 0
            memory = [g.min_memory_mib() for g in pool.groups.values()]
            replicas = sorted({r for g in pool.groups.values() for r in g.replicas if r})
            profile = next((f.profile for g in pool.groups.values() for f in g.nodes.values()), "")
            for group in pool.groups.values():
                nodes += len(group.nodes)
                for name, own in group.own_free.items():
                    allocatable = group.nodes[name].allocatable
                    usable += 1
                    total += allocatable
                    allocated += allocatable - self._kept_free.get(name, {}).get(pool.resource, own)
                free += group.free_total
                largest = max(largest, group.max_free())
            stats.append(
                PoolStats(
                    pool=pool.key,
                    resource=pool.resource,
                    memory_mib=min(memory, default=0),
                    nodes=nodes,
                    usable_nodes=usable,
                    gpus_total=total,
                    gpus_allocated=allocated,
                    gpus_free=free,
                    pending=pool.pending,
                    kind=pool.kind,
                    profile=profile,
                    replicas=tuple(replicas),
                    largest_free=largest,
                )
            )
        return stats


def _room_of(pool: Pool) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """What a decision reads of a pool's free devices: per group (in order), its free total and how many
    nodes have each free count once the holds are placed."""
    return tuple((g.free_total, tuple(sorted(g.buckets.items()))) for g in pool.ordered())


def _requirable(node: NodeInfo) -> tuple[object, ...]:
    """What a Pod may require of a node (webhook.domain.model.could_run), to tell when it changed."""
    return (node.labels, node.taints, node.allocatable, node.cpu_milli, node.memory_bytes)


def _classes_of(facts: list[NodeFacts]) -> dict[str, tuple[PoolKey, int]]:
    """What the ledger counts a bound Pod's GPUs by: per resource, the node's pool and memory per GPU."""
    return {f.resource: (f.pool, f.memory_mib) for f in facts}
