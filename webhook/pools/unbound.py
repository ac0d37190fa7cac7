"""Pods not on a node yet, indexed by what a change of the nodes could change for them.

An unbound Pod holds its GPUs in its pool only while a node of the pool could take it (webhook.pools.claims).
When a node comes, goes or changes, working every unbound Pod out again would cost the number of Pods per
node event (a cold sync lists thousands of nodes); so each Pod is indexed, for each pool its pins reach
(its claim's `watched`), by what can change whether it can run there:

- where it can run, by the node found to take it (its witness): only a change of that node can end it;
- where it cannot, by the pool: only a node of that pool can change it.

Pools its pins do not reach change only when a selector comes to a pool, and then every unbound Pod is
worked out again (webhook.pools.index). `affected` answers, for the nodes and pools a change touched, which
Pods to work out again.
"""

from __future__ import annotations

from collections.abc import Collection

from webhook.domain.model import PodInfo, PodKey, PoolKey
from webhook.pools.claims import Claim

Entry = tuple[str, object]  # ("witness", node) | ("pool", PoolKey)


class Unbound:
    """Unbound Pods and, for each, the node, pool or resources whose change could change its claim."""

    def __init__(self) -> None:
        self.pods: dict[PodKey, PodInfo] = {}
        self._entries: dict[PodKey, tuple[Entry, ...]] = {}
        self._index: dict[Entry, set[PodKey]] = {}

    def add(self, key: PodKey, pod: PodInfo, claim: Claim) -> None:
        self.remove(key)
        self.pods[key] = pod
        entries: tuple[Entry, ...] = tuple(
            dict.fromkeys(("witness", node) if node else ("pool", pool) for pool, node in claim.watched)
        )
        self._entries[key] = entries
        for entry in entries:
            self._index.setdefault(entry, set()).add(key)

    def remove(self, key: PodKey) -> None:
        self.pods.pop(key, None)
        for entry in self._entries.pop(key, ()):
            keys = self._index[entry]
            keys.discard(key)
            if not keys:
                del self._index[entry]

    def affected(self, nodes: Collection[str], pools: Collection[PoolKey]) -> set[PodKey]:
        """The Pods whose claim a change of these nodes (in these pools, before or after) may change."""
        found: set[PodKey] = set()
        for kind, values in (("witness", nodes), ("pool", pools)):
            for value in values:
                found |= self._index.get((kind, value), set())
        return found
