"""What callers read of the pool index, each part on its own: what the nodes offer (`CapacityView`), what
Pods and reservations hold (`UsageView`), and the namespaces' ResourceQuotas (`QuotaView`).

The index (webhook.pools.index) hands out its parts as these read-only views, `index.capacity`,
`index.usage` and `index.quotas`, and keeps every write to itself (nodes, Pods and quotas fed in,
reservations made and taken back), since each write must end in the index's own settling. A decision
reads the views; the inventory sources and the Admitter write through the index. Protocols, so that the
parts (webhook.pools.capacity.Capacity, webhook.pools.ledger.Ledger, webhook.pools.quotas.store) are read
directly, without a forwarding call, and no caller can reach their writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterator
from typing import Protocol, TypeVar

from webhook.domain.affinity import PoolConstraint
from webhook.domain.model import NodeInfo, PodInfo, PodKey, PoolKey, QuotaInfo
from webhook.pools.capacity import PoolStats
from webhook.pools.constraints import Inseparable
from webhook.pools.nodes import NodeFacts, Unclassified
from webhook.pools.pool import Pool

T = TypeVar("T")


class CapacityView(Protocol):
    """The pools, their nodes and free devices (webhook.pools.capacity): what a decision reads about room."""

    def pools(self, vendor: str | None = None) -> Iterator[Pool]:
        """The pools (of one vendor)."""
        ...

    def constraint(self, key: PoolKey) -> PoolConstraint | Inseparable:
        """What sends a Pod to exactly the pool's nodes (webhook.pools.constraints), or why nothing can."""
        ...

    def inseparable(self) -> list[tuple[PoolKey, Inseparable]]:
        """Every pool no constraint can reach exactly, for warnings."""
        ...

    def node(self, name: str) -> NodeInfo | None:
        """A node that offers a GPU resource, as last seen; None for any other (or one not seen)."""
        ...

    def gpu_nodes(self) -> Collection[NodeInfo]:
        """Every node that offers a GPU resource (a live view: do not hold it across changes)."""
        ...

    def members(self, key: PoolKey) -> list[NodeInfo]:
        """The nodes of a pool, usable or not, by name."""
        ...

    @property
    def excluded(self) -> frozenset[str]:
        """The nodes the queue's leader keeps from new Pods (webhook.pools.index.PoolIndex.exclude_nodes)."""
        ...

    def unclassified(self) -> list[Unclassified]:
        """The nodes whose devices gpupool cannot pool, and why."""
        ...

    def node_facts(self, name: str, resource: str) -> NodeFacts | Unclassified | None:
        """What is known of the devices of one resource on a node: their facts, why the vendor's devices
        are not pooled, or None when the node has none (or is not known yet)."""
        ...

    def node_free(self, facts: NodeFacts) -> int:
        """Free devices of the node's pool resource now (0 when the node is not usable)."""
        ...

    def pool_memory_mib(self, key: PoolKey) -> int:
        """Memory per device of a pool (the least of its nodes'); 0 when not known."""
        ...

    def pool_stats(self) -> list[PoolStats]:
        """Each pool's capacity, for metrics and `gpupool inventory`."""
        ...

    def node_names(self) -> set[str]:
        """Every node held (for a re-list to drop those gone)."""
        ...

    @property
    def structure(self) -> int:
        """How often the node structure changed (pools, their nodes, node facts and labels): what `memo`
        is dropped for. Equal counts, equal structure."""
        ...

    def room_changes(self, key: PoolKey) -> int:
        """How often what a decision reads of pool `key`'s free devices changed: equal counts, equal room."""
        ...

    def memo(self, key: Hashable, compute: Callable[[], T], size: Callable[[T], int] | None = None) -> T:
        """A value derived from the nodes but not from usage: computed once per key until a node changes.
        `size` weighs an entry (webhook.pools.memo.Memo.get)."""
        ...


class UsageView(Protocol):
    """What Pods and reservations hold (webhook.pools.ledger): what quotas and workload groups read."""

    @property
    def reservations(self) -> int:
        """Reservations waiting for their Pod."""
        ...

    def reserved(self, namespace: str, resource: str) -> int:
        """Devices admitted in the namespace that no quota's status.used can include yet."""
        ...

    def class_used(self, namespace: str, gpu_class: str) -> int:
        """Devices of the class the namespace holds: on nodes of the class, pinned to a pool of it, or
        reserved for admissions the watch has not shown yet."""
        ...

    def class_pending(self, namespace: str, gpu_class: str) -> int:
        """The part of `class_used` reserved for admissions the watch has not shown yet."""
        ...

    def requested(self, namespace: str, resource: str) -> int:
        """Devices of `resource` the namespace's non-terminated Pods request, as gpupool counts them
        (without reservations: `reserved`)."""
        ...

    def memory_used(self, namespace: str) -> int:
        """GPU memory (MiB) the namespace's Pods and reservations hold."""
        ...

    def memory_pending(self, namespace: str) -> int:
        """The part of `memory_used` reserved for admissions the watch has not shown yet."""
        ...

    def group_pools(self, namespace: str, group: str) -> dict[PoolKey, int]:
        """Per pool, the workload group's members on it. One lookup."""
        ...

    def used_on(self, name: str) -> Counter[str] | None:
        """GPUs per resource the Pods bound to a node request; None when they request none."""
        ...

    def pod_info(self, key: PodKey) -> PodInfo | None:
        """An unbound Pod as it is counted; None for a bound Pod or one not held."""
        ...

    def is_queued(self, key: PodKey) -> bool:
        """Is the Pod known, unbound and still waiting in gpupool's queue (webhook.queue)?"""
        ...

    def pod_keys(self) -> set[PodKey]:
        """Every Pod held (for a re-list to drop those gone)."""
        ...

    def holds(self, key: PodKey) -> bool:
        """Whether the watch has shown the Pod (and it holds GPUs)."""
        ...


class QuotaView(Protocol):
    """The namespaces' ResourceQuotas on GPU resources, as last seen (webhook.pools.quotas.store)."""

    def of(self, namespace: str) -> list[QuotaInfo]:
        """The namespace's quotas."""
        ...

    def all(self) -> list[QuotaInfo]:
        """Every namespace's quotas."""
        ...

    def keys(self) -> set[tuple[str, str]]:
        """(namespace, name) of every quota held (for a re-list to drop those gone)."""
        ...
