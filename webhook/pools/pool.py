"""One GPU pool: its nodes in groups the scheduler cannot tell apart, the GPUs held in it for Pods not on
a node yet, and the packing of those holds onto the groups' nodes.

Per pool, nodes are grouped by the labels that pin them and the taints they carry; a group counts its
usable nodes by number of free GPUs, not which node has what, since the scheduler and decisions cannot
tell its nodes apart either. The holds are packed onto the nodes their nodeSelector reaches, largest
first, each on the node with the fewest free GPUs that still fits it (`pack`); holds of one size and
reach are packed as a batch, so packing costs the same for 1 hold as for 10,000. A hold that fits
nowhere stays pending and is placed once the pool has room.

The capacity index (webhook.pools.capacity) keeps these up to date; decisions read them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from webhook.domain.devices import device_kind
from webhook.domain.model import PoolKey, Taint
from webhook.pools.nodes import NodeFacts, Selector

TaintSet = tuple[Taint, ...]
GroupKey = tuple[Selector, TaintSet, TaintSet]
Hold = tuple[Selector, int]  # (the pool labels the Pod's nodeSelector pins, GPUs)


def group_key(f: NodeFacts) -> GroupKey:
    """The group of its pool a node's facts put it in."""
    return (f.selector, f.gpu_taints, f.other_taints)


@dataclass(eq=False, slots=True)
class Group:
    """Nodes of one pool that share a selector and taints: the unit the scheduler cannot tell apart."""

    selector: Selector
    gpu_taints: TaintSet
    other_taints: TaintSet
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    own_free: dict[str, int] = field(default_factory=dict)  # usable node -> allocatable - its Pods' requests
    # Plain dicts, not Counters: copied and summed on every packing, where a Counter costs several times more.
    own_counts: dict[int, int] = field(default_factory=dict)  # own free GPUs -> usable nodes (no zero counts)
    buckets: dict[int, int] = field(default_factory=dict)  # free GPUs once holds are placed -> usable nodes
    own_total: int = 0  # own free GPUs of the usable nodes
    free_total: int = 0  # free GPUs once holds are placed
    memory: Counter[int] = field(default_factory=Counter)  # memory per device as reported -> nodes
    sold: Counter[int] = field(default_factory=Counter)  # memory per device as sold (0: unknown) -> nodes
    offered: Counter[int] = field(default_factory=Counter)  # what min-memory is compared with -> nodes
    sizes: Counter[int] = field(default_factory=Counter)  # allocatable GPUs per node, usable or not
    drivers: Counter[tuple[int, ...] | None] = field(default_factory=Counter)
    computes: Counter[tuple[int, ...] | None] = field(default_factory=Counter)  # compute capabilities
    cudas: Counter[tuple[int, ...] | None] = field(default_factory=Counter)  # CUDA versions the drivers support
    replicas: Counter[int] = field(default_factory=Counter)  # replicas per GPU of shared devices

    def add_node(self, f: NodeFacts) -> None:
        self.nodes[f.node] = f
        self.memory[f.memory_mib] += 1
        self.sold[f.sold_mib] += 1
        self.offered[f.offered_mib] += 1
        self.sizes[f.allocatable] += 1
        self.drivers[f.driver] += 1
        self.computes[f.compute] += 1
        self.cudas[f.cuda] += 1
        self.replicas[f.replicas] += 1

    def drop_node(self, f: NodeFacts) -> None:
        """Forget a node; its own free GPUs must be dropped first (`set_own_free(..., None, ...)`)."""
        del self.nodes[f.node]
        decrement(self.memory, f.memory_mib)
        decrement(self.sold, f.sold_mib)
        decrement(self.offered, f.offered_mib)
        decrement(self.sizes, f.allocatable)
        decrement(self.drivers, f.driver)
        decrement(self.computes, f.compute)
        decrement(self.cudas, f.cuda)
        decrement(self.replicas, f.replicas)

    def set_own_free(self, name: str, free: int | None, unheld: bool) -> None:
        """Set a usable node's own free GPUs (None: it is not usable, or gone). `unheld`: the pool holds
        nothing and is not due to be packed, so what is left once holds are placed is the nodes' own free
        GPUs, kept in step here rather than by packing the pool again."""
        old = self.own_free.pop(name, None)
        if old is not None:
            _bump(self.own_counts, old, -1)
            self.own_total -= old
        if free is not None:
            self.own_free[name] = free
            _bump(self.own_counts, free, +1)
            self.own_total += free
        if unheld:
            if old is not None:
                _bump(self.buckets, old, -1)
                self.free_total -= old
            if free is not None:
                _bump(self.buckets, free, +1)
                self.free_total += free

    def max_free(self) -> int:
        return max(self.buckets, default=0)  # buckets never hold a zero count

    def largest_node(self) -> int:
        """The most GPUs any one node of the group has: a Pod needing more can never run here."""
        return max(self.sizes, default=0)

    def min_memory_mib(self) -> int:
        """The least memory per device any node reports (what GPU-memory quotas count)."""
        return min(self.memory) if self.memory else 0

    def min_sold_mib(self) -> int:
        """The least size as sold of any node's devices; 0 when any is unknown."""
        return min(self.sold) if self.sold else 0

    def min_offered_mib(self) -> int:
        """The least memory `min-memory` is met with on any node (webhook.domain.memory.offered_mib)."""
        return min(self.offered) if self.offered else 0

    def min_driver(self) -> tuple[int, ...] | None:
        """The oldest driver in the group; None when any node's driver is unknown."""
        return _oldest(self.drivers)

    def min_compute(self) -> tuple[int, ...] | None:
        """The lowest compute capability in the group; None when any node's is unknown."""
        return _oldest(self.computes)

    def min_cuda(self) -> tuple[int, ...] | None:
        """The oldest CUDA version the group's drivers support; None when any node's is unknown."""
        return _oldest(self.cudas)

    def reached_by(self, pins: Selector) -> bool:
        """Whether a nodeSelector with these pool labels reaches the group: the scheduler needs every
        one of them on the node."""
        labels = dict(self.selector)
        return all(labels.get(k) == v for k, v in pins)


def _oldest(versions: Counter[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    if None in versions or not versions:
        return None
    return min(v for v in versions if v is not None)


@dataclass(eq=False, slots=True)
class Pool:
    key: PoolKey
    resource: str
    kind: str = ""  # gpu, mig or shared: what its product names (filled in from the key)
    groups: dict[GroupKey, Group] = field(default_factory=dict)
    pending: int = 0  # GPUs held for Pods not yet on a node
    holds: Counter[Hold] = field(default_factory=Counter)  # (pins, GPUs) -> Pods and reservations
    selector_nodes: Counter[Selector] = field(default_factory=Counter)  # nodes per selector
    # Caches; groups come and go far less often than decisions and holds.
    _by_selector: dict[Selector, list[Group]] | None = None
    _ordered: tuple[Group, ...] | None = None
    _reach: dict[Selector, tuple[int, ...]] = field(default_factory=dict)
    _packing: list[Hold] | None = None  # the holds' kinds in packing order

    def __post_init__(self) -> None:
        self.kind = device_kind(self.key.product)

    def hold(self, pins: Selector, gpus: int, sign: int) -> None:
        """Add (+1) or take back (-1) a hold of `gpus` GPUs for a Pod whose nodeSelector pins `pins`."""
        key = (pins, gpus)
        n = self.holds[key] + sign
        if n > 0:
            self.holds[key] = n
        else:
            del self.holds[key]
        if n <= 1:  # a kind of hold came or went
            self._packing = None
        self.pending += sign * gpus

    def packing_order(self) -> list[Hold]:
        """Kinds of holds, largest first (first-fit decreasing packs tighter), then by pins."""
        if self._packing is None:
            self._packing = sorted(self.holds, key=lambda h: (-h[1], h[0]))
        return self._packing

    def add_group(self, key: GroupKey, group: Group) -> None:
        self.groups[key] = group
        self._forget()

    def drop_group(self, key: GroupKey) -> None:
        del self.groups[key]
        self._forget()

    def _forget(self) -> None:
        self._by_selector = self._ordered = None
        self._reach.clear()

    def by_selector(self) -> dict[Selector, list[Group]]:
        """The groups by the nodeSelector that reaches them (one selector may reach several taint sets)."""
        if self._by_selector is None:
            out: dict[Selector, list[Group]] = {}
            for g in self.groups.values():
                out.setdefault(g.selector, []).append(g)
            self._by_selector = out
        return self._by_selector

    def ordered(self) -> tuple[Group, ...]:
        """The groups in a fixed order (by selector and taints), so ties in packing go the same way
        whatever order the groups were made in."""
        if self._ordered is None:
            self._ordered = tuple(g for _, g in sorted(self.groups.items(), key=lambda kv: _group_order(kv[0])))
        return self._ordered

    def reach(self, pins: Selector) -> tuple[int, ...]:
        """Positions in `ordered()` of the groups a nodeSelector with these pool labels reaches."""
        found = self._reach.get(pins)
        if found is None:
            found = self._reach[pins] = tuple(i for i, g in enumerate(self.ordered()) if g.reached_by(pins))
        return found


def _group_order(key: GroupKey) -> tuple[Selector, tuple[tuple[str, str, str], ...], tuple[tuple[str, str, str], ...]]:
    selector, gpu_taints, other_taints = key
    return (
        selector,
        tuple((t.key, t.value, t.effect) for t in gpu_taints),
        tuple((t.key, t.value, t.effect) for t in other_taints),
    )


def pack(pool: Pool) -> None:
    """Place the pool's holds on its groups' usable nodes: largest first, each on the node with the
    fewest free GPUs that fits it (ties: the group first in `ordered()`); what fits nowhere stays pending.

    Best fit fills one node until the next hold no longer fits on it, then takes the next node of the
    same count, so all holds of one size and reach are placed per (group, free count) in one step.
    """
    groups = pool.ordered()
    counts = [dict(g.own_counts) for g in groups]
    placed = [0] * len(groups)
    most = max((max(c) for c in counts if c), default=0)  # most free GPUs on one node
    for pins, gpus in pool.packing_order():
        left = pool.holds[(pins, gpus)]
        reach = pool.reach(pins)
        # Fewest free GPUs first, so scan the counts upwards; what a step leaves on a node is below
        # `gpus` (or nothing is left to place), so the scan never meets it again.
        for free in range(gpus, most + 1):
            per_node = free // gpus
            for g in reach:
                nodes = counts[g].get(free)
                if not nodes:
                    continue
                full = min(nodes, left // per_node)  # nodes filled until less than `gpus` is left
                if full:
                    _move(counts[g], free, free - per_node * gpus, full)
                    left -= full * per_node
                    placed[g] += full * per_node * gpus
                if left and full < nodes:  # fewer holds left than one node takes
                    _move(counts[g], free, free - left * gpus, 1)
                    placed[g] += left * gpus
                    left = 0
                if not left:
                    break
            if not left:
                break
    for group, after, gpus_placed in zip(groups, counts, placed, strict=True):
        group.buckets = after
        group.free_total = group.own_total - gpus_placed


def _move(counts: dict[int, int], source: int, target: int, nodes: int) -> None:
    left = counts[source] - nodes
    if left:
        counts[source] = left
    else:
        del counts[source]
    counts[target] = counts.get(target, 0) + nodes


def _bump(counts: dict[int, int], key: int, by: int) -> None:
    """Add to a count, dropping it at zero (so `max(counts)` is the most free GPUs on a node)."""
    n = counts.get(key, 0) + by
    if n:
        counts[key] = n
    else:
        del counts[key]


def decrement(counter: Counter[Any], key: object) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
