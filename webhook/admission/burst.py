"""How many of a workload's Pods fit now: its Pods admitted one after another, as its controller creates
them, each counted against the pools (reserved, as admission reserves it) before the next is decided, and
every reservation taken back at the end, so the index is left as it was.

`gpupool explain` asks it of a template whose workload makes several Pods at once (a Job's parallelism,
a Deployment's replicas): the first Pod's verdict alone says nothing of the other three. Each Pod is
decided by `prepare` and `place`, as admission decides it, so its workload group (siblings kept on one
pool), the namespace's quotas and onNoCapacity weigh as they will in the cluster.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from webhook.admission.core import place, reserve_for
from webhook.admission.prepared import prepare
from webhook.admission.verdict import Verdict
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex


@dataclass(frozen=True, slots=True)
class Burst:
    """The Pods of one template admitted in turn: how many were placed with room, where, and the verdict
    of the first that was not (None when every one was)."""

    pods: int
    fit: int
    pools: tuple[tuple[PoolKey, int], ...]  # where those that fit go, pool by pool, in the order first used
    rest: Verdict | None


def admit_in_turn(pod: object, namespace: str, pods: int, policy: Policy, index: PoolIndex) -> Burst:
    """Admit `pods` copies of `pod` in `namespace` one after another on `index`, each reserved before the
    next is decided, until one is not placed with room; then take every reservation back."""
    tokens: list[int] = []
    where: Counter[PoolKey] = Counter()
    rest: Verdict | None = None
    now = time.monotonic()
    try:
        for _ in range(pods):
            prepared = prepare(pod, namespace, policy)
            result = prepared if isinstance(prepared, Verdict) else place(prepared, policy, index, explain=False)
            placement = result.placement
            if isinstance(prepared, Verdict) or placement is None or not placement.has_capacity:
                rest = result
                break
            tokens.append(reserve_for(index, prepared.pod, placement, now, echoed=False))
            where[placement.pool] += 1
    finally:
        for token in reversed(tokens):
            index.release(token)
    return Burst(pods=pods, fit=len(tokens), pools=tuple(where.items()), rest=rest)
