"""The gangs' test set-up, shared by the gang tests (tests/queue/test_gangs.py, test_parked_gangs.py): a
queue policy, gang members and a small Pod, two busy T4 nodes."""

from __future__ import annotations

from typing import Any

from tests.builders import gpu_node
from tests.queue.helpers import busy, queued_pod
from webhook.pools.index import PoolIndex
from webhook.queue.release import Plan

QUEUE = "namespaces:\n  q: {placement: queue}\n  q2: {placement: queue}\n"
START = 1000.0


def members(n: int, size: int, gpus: int, pol: Any, index: PoolIndex, name: str = "g") -> list[dict[str, Any]]:
    ann = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "sweep", "gpupool.io/group-size": str(size),
           "gpupool.io/gpu-count": str(gpus)}  # fmt: skip
    return [
        queued_pod(f"{name}-{i}", "q", pol, index, annotations=ann, created="2026-12-01T09:00:00Z") for i in range(n)
    ]


def small(name: str, index: PoolIndex, pol: Any) -> dict[str, Any]:
    return queued_pod(name, "q2", pol, index, created="2026-12-01T10:00:00Z")


def outcome(decided: Plan) -> tuple[dict[str, Any], dict[str, str]]:
    return {r.queued.key[1]: r.pool for r in decided.releases}, {w.queued.key[1]: w.code for w in decided.waits}


def two_busy_t4s() -> list[dict[str, Any]]:
    """Two 8-GPU T4 nodes, 6 GPUs busy on each: 2 free per node, 16 in all once empty."""
    return [gpu_node("t4-0", "Tesla-T4", 8), gpu_node("t4-1", "Tesla-T4", 8), busy("t4-0", 6), busy("t4-1", 6)]
