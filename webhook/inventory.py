"""The inventory interface: where the pool state comes from (snapshot file or live watch cache).

Both sources keep a `PoolIndex` (webhook.pool_index) up to date and hand it out, locked, for the length
of one decision under `read()`. The admission path only ever reads the index, so it costs the same whether the
cluster has 50 Pods or 150,000.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from webhook.model import PoolKey

if TYPE_CHECKING:
    from webhook.pool_index import PoolIndex


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


class Inventory(Protocol):
    """A source of pool state. Implementations: SnapshotInventory (a file), LiveInventory (the API)."""

    def read(self) -> AbstractContextManager[PoolIndex]:
        """Hold a consistent view for the length of one decision."""
        ...

    @property
    def ready(self) -> bool:
        """True once the first full load or sync is done."""
        ...

    def age_seconds(self) -> float:
        """Seconds since the view was last known to be current (0 for a snapshot file)."""
        ...

    def close(self) -> None:
        """Stop background work (watches); a no-op for a snapshot."""
        ...
