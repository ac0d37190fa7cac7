"""Queued Pods as kube-apiserver stores them after gpupool's admission, for the queue's tests."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import jsonpatch

from tests.builders import gpu_node, index_of, pod, policy
from webhook.admission.core import evaluate
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue.waiting import Waiting

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def queued_pod(  # noqa: PLR0913 (a test builder: each field a keyword)
    name: str,
    namespace: str,
    policy: Policy,
    index: PoolIndex,
    *,
    annotations: dict[str, str] | None = None,
    priority: int = 0,
    created: str = "2026-12-01T10:00:00Z",
    rv: int = 100,
    **kw: Any,
) -> dict[str, Any]:
    """The Pod as admission queues it (its patch applied), with what the API adds: uid, resourceVersion,
    creationTimestamp, priority."""
    obj = pod(name, namespace, annotations=annotations or {"gpupool.io/gpu-class": "medium"}, **kw)
    verdict = evaluate(obj, namespace, policy, index)
    assert verdict.allowed and verdict.queued, verdict.message
    stored = jsonpatch.apply_patch(copy.deepcopy(obj), list(verdict.patch))
    stored["metadata"] |= {"uid": f"uid-{namespace}-{name}", "resourceVersion": str(rv), "creationTimestamp": created}
    stored["spec"]["priority"] = priority
    return stored


def enqueue(objs: list[dict[str, Any]], index: PoolIndex, waiting: Waiting) -> None:
    """As the watch delivers them: into the index (where a queued Pod holds nothing) and the queue."""
    for obj in objs:
        index.upsert_pod(pod_from_obj(obj, index.policy.gpu_resources, index.policy.partition_prefixes))
        waiting.apply("pods", "ADDED", obj)


T4 = PoolKey("nvidia", "medium", "Tesla-T4")
L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
A100 = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
QUEUE = "namespaces:\n  q: {placement: queue}\n  q2: {placement: queue}\n"
# The annotations of the random queues' Pods: for a T4, for an L4, any medium GPU, a gang of 2, a workload
# group that is not a gang (tests/queue/test_standing.py, test_lines.py)
MIXED = [
    {"gpupool.io/gpu-product": "Tesla-T4"},
    {"gpupool.io/gpu-product": "NVIDIA-L4"},
    None,
    {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "gang", "gpupool.io/group-size": "2"},
    {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "workers"},
]


def busy(node: str, gpus: int, name: str = "busy") -> dict[str, Any]:
    return pod(f"{name}-{node}", "other", gpus=gpus, node=node, phase="Running", tolerations=[GPU_TOLERATION])


def fleet(t4_busy: int = 4, l4_busy: int = 4) -> list[dict[str, Any]]:
    nodes = [gpu_node("t4-a", "Tesla-T4", 4), gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034),
             gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 4, memory_mib=40960, gpu_class="high")]  # fmt: skip
    running = [busy("t4-a", t4_busy)] if t4_busy else []
    return nodes + running + ([busy("l4-a", l4_busy)] if l4_busy else [])


def setup(objects: list[dict[str, Any]], text: str = QUEUE) -> tuple[PoolIndex, Waiting]:
    pol = policy(text)
    index = index_of(objects, pol)
    return index, Waiting(pol)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
