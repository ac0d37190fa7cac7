"""The status of each pool's GPUPool object (manifests/base/crd.yaml), as the queue's leader publishes it
(webhook.queue.status) and webhook.sources.poolstatus writes it: the index's figures for the pool and the
Pods the queue holds for it, by object name (`object_names`: DNS-1123 labels, stable from the pool key,
unique). Pure.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.domain.model import PoolKey
from webhook.pools.capacity import PoolStats

NAME_MAX = 63  # a DNS-1123 label: readable in `kubectl get`, and a valid object name
_HASHED = NAME_MAX - 9  # room left for "-" and 8 hex digits

Status = dict[str, Any]


def _base_name(key: PoolKey) -> str:
    """The key lowercased, every run of other characters than [a-z0-9] one `-`, trimmed."""
    return re.sub(r"[^a-z0-9]+", "-", str(key).lower()).strip("-")


def _hashed(key: PoolKey, base: str) -> str:
    digest = hashlib.sha256(str(key).encode()).hexdigest()[:8]
    return f"{base[:_HASHED].rstrip('-')}-{digest}".lstrip("-")


def object_names(keys: Iterable[PoolKey]) -> dict[PoolKey, str]:
    """Each pool's object name: its key as a DNS-1123 label (`nvidia/medium/NVIDIA-L4` is
    `nvidia-medium-nvidia-l4`); one longer than NAME_MAX, or one another key of `keys` would share, is cut
    and ends in 8 hex digits of the key's SHA-256, so no two pools share a name and none changes as long as
    no such pool comes along."""
    keys = list(keys)
    bases = {key: _base_name(key) for key in keys}
    counts: dict[str, int] = {}
    for base in bases.values():
        counts[base] = counts.get(base, 0) + 1
    return {
        key: base if len(base) <= NAME_MAX and counts[base] == 1 and base else _hashed(key, base)
        for key, base in bases.items()
    }


def pool_statuses(stats: Iterable[PoolStats], queued: Mapping[PoolKey, int]) -> dict[str, Status]:
    """The status of each pool's object, by object name: what the CRD's schema names, from the index's
    figures and the Pods the queue holds for each pool."""
    stats = list(stats)
    names = object_names(s.pool for s in stats)
    return {
        names[s.pool]: {
            "pool": str(s.pool),
            "vendor": s.pool.vendor,
            "class": s.pool.gpu_class,
            "product": s.pool.product,
            "deviceKind": s.kind,
            "resource": s.resource,
            "nodes": s.nodes,
            "usableNodes": s.usable_nodes,
            "capacity": s.gpus_total,
            "allocated": s.gpus_allocated,
            "free": s.gpus_free,
            "largestFree": s.largest_free,
            "queued": queued.get(s.pool, 0),
        }
        for s in stats
    }
