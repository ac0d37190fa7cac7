"""What the tests of the pool index read from it, and the objects they share: a pool's stats, each node's
own free GPUs, how many nodes have each number of free GPUs left, feeding objects in a given order, and
the high-class cluster of issue 13."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.builders import GPU_TAINT, gpu_node, pod, policy
from webhook.domain.model import PoolKey
from webhook.pools.capacity import PoolStats
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj

POLICY = policy()
RES = POLICY.gpu_resources
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
T4_SELECTOR = (("gpu.accelerator/class", "medium"), ("nvidia.com/gpu.product", "Tesla-T4"))
A100 = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
A100_SELECTOR = (("gpu.accelerator/class", "high"), ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"))
TRAIN = policy("namespaces: {train: {classQuota: {high: 20}}}")


def stats(index: PoolIndex, key: PoolKey) -> PoolStats:
    return next(s for s in index.capacity.pool_stats() if s.pool == key)


def free_per_node(index: PoolIndex, key: PoolKey) -> dict[str, int]:
    """Each usable node's own free GPUs: allocatable minus the Pods bound to it."""
    pool = next(p for p in index.capacity.pools() if p.key == key)
    return {n: f for g in pool.groups.values() for n, f in g.own_free.items()}


def free_counts(index: PoolIndex, key: PoolKey) -> Counter[int]:
    """How many usable nodes of the pool have each number of free GPUs once its holds are placed."""
    pool = next(p for p in index.capacity.pools() if p.key == key)
    return sum((Counter(g.buckets) for g in pool.groups.values()), Counter())


def free(index: PoolIndex, key: PoolKey) -> int:
    return stats(index, key).gpus_free


def feed(index: PoolIndex, objects: list[dict[str, Any]]) -> PoolIndex:
    """Apply objects one at a time in the order given, as watch events would."""
    for obj in objects:
        if obj["kind"] == "Node":
            index.upsert_node(node_from_obj(obj, RES))
        else:
            meta = obj["metadata"]
            index.upsert_pod(pod_from_obj(obj, RES), key=(meta["namespace"], meta["name"]))
    return index


def a100(name: str, gpu_class: str = "high") -> dict[str, Any]:
    return gpu_node(name, "NVIDIA-A100-SXM4-40GB", 8, gpu_class=gpu_class, taints=[GPU_TAINT])


def train_cluster() -> list[dict[str, Any]]:
    """16 high-class GPUs in use in `train` by Pods placed before gpupool was installed (no annotation)."""
    return [
        a100("a100-a"),
        a100("a100-b"),
        a100("a100-c"),
        pod("old-1", namespace="train", gpus=8, node="a100-a", phase="Running"),
        pod("old-2", namespace="train", gpus=8, node="a100-b", phase="Running"),
    ]
