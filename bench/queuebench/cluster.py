"""The cluster the benchmark adds to the simulator's: the queue namespaces with their quotas and policy, the
Pods and nodes it creates, and the probes' namespaces."""

from __future__ import annotations

import copy
import random
import time
from typing import Any, NamedTuple

from bench.queueaudit import GPU, QUEUE_LEASE, QuotaRule

LEASE_NAMESPACE, LEASE = QUEUE_LEASE.split("/")
FINISH_LABEL = "bench.gpupool.io/finish"
FILL_NAMESPACE = "bench-fill"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PROBE_NAMESPACE = "team-a"  # placement: now (the synthetic cluster's), to time ordinary admissions
PROBE_POD_NAMESPACE = "bench-probe"  # the probes' own Pods (probe_pod), PATCHed to time the API's writes

# Queue namespaces: (name, classes its Pods ask for, share of the queue). The quota namespaces' Pods run 2
# to 8 s, so each quota is at its limit most of the time and freed again and again.


class Space(NamedTuple):
    """A queue namespace: the classes its Pods ask for, and its share of the queue."""

    name: str
    classes: tuple[str, ...]
    share: float


OPEN = [
    Space("q-medium-0", ("medium",), 0.2),
    Space("q-medium-1", ("medium",), 0.2),
    Space("q-high-0", ("high",), 0.2),
    Space("q-high-1", ("high",), 0.2),
]
QUOTA = [Space(ns, ("medium", "high"), 0.05) for ns in ("q-tutorial", "q-limits", "q-class", "q-memory")]
NAMESPACES = OPEN + QUOTA
# `--backlog`: Pods queued beyond their namespace's classQuota of one high GPU, whose one Pod released never
# finishes (no FINISH_LABEL): they wait the whole run for a quota that never frees, as a team's queue far
# past its quota does, while room keeps appearing on the pools they would go to.
BACKLOG = Space("q-backlog", ("high",), 0.0)
MEMORY_QUOTA_GI = 400
RULES = [
    QuotaRule("q-tutorial", "gpus", "nvidia.com/gpu", 16),
    QuotaRule("q-limits", "gpus", "limits.nvidia.com/gpu", 16),
    QuotaRule("q-class", "class", "medium", 12),
    QuotaRule("q-class", "class", "high", 6),
    QuotaRule("q-memory", "memory", "gpu-memory", MEMORY_QUOTA_GI * 1024),
    QuotaRule(BACKLOG.name, "class", "high", 1),
]
POLICY = f"""
namespaces:
  q-medium-0: {{placement: queue}}
  q-medium-1: {{placement: queue}}
  q-high-0: {{placement: queue}}
  q-high-1: {{placement: queue}}
  q-tutorial: {{placement: queue}}
  q-limits: {{placement: queue}}
  q-class: {{placement: queue, classQuota: {{medium: 12, high: 6}}}}
  q-memory: {{placement: queue, memoryQuota: {MEMORY_QUOTA_GI}Gi}}
  {BACKLOG.name}: {{placement: queue, classQuota: {{high: 1}}}}
"""


def now() -> float:
    return time.monotonic()


def filler(node: str, k: int) -> dict[str, Any]:
    """One GPU taken on `node`, by a Pod bound there (as a Pod of another scheduler would be)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"fill-{node}-{k}", "namespace": FILL_NAMESPACE, "labels": {FINISH_LABEL: "true"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.com/cuda:12",
                    "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
                }
            ],
            "tolerations": [GPU_TOLERATION],
        },
    }


def queued_pod(namespace: str, gpu_class: str, name: str, rng: random.Random, quota: bool) -> dict[str, Any]:
    """A Pod as its owner writes it for a queue namespace: a class and one GPU, nothing else gpupool sets
    (the backlog's never finishes once running)."""
    annotations = {"gpupool.io/gpu-class": gpu_class, "gpupool.io/gpu-count": "1"}
    if quota:
        annotations["kubesim.io/run-seconds"] = f"{rng.uniform(2, 8):.1f}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": annotations,
            "labels": {"app": "bench-queue", **({} if namespace == BACKLOG.name else {FINISH_LABEL: "true"})},
        },
        "spec": {
            "containers": [{"name": "main", "image": "registry.example.com/cuda:12"}],
            "priority": 100 if rng.random() < 0.1 else 0,
        },
    }


def resource_quota(namespace: str, key: str, hard: int) -> dict[str, Any]:
    spec = {"hard": {key: str(hard)}}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu-quota", "namespace": namespace},
        "spec": spec,
        "status": {"hard": spec["hard"], "used": {key: "0"}},
    }


def burst_node(template: dict[str, Any], k: int) -> dict[str, Any]:
    node = copy.deepcopy(template)
    name = f"gpu-l4-burst-{k:04d}"
    meta = node["metadata"]
    for drop in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(drop, None)
    meta["name"] = name
    meta["labels"]["kubernetes.io/hostname"] = name
    node["kind"], node["apiVersion"] = "Node", "v1"
    node["spec"].pop("providerID", None)
    return node


def probe_pod(name: str) -> dict[str, Any]:
    """A Pod no scheduler takes (its scheduler does not exist) and gpupool never counts (no GPU): something
    to PATCH, to time the API's writes under the run's load."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": PROBE_POD_NAMESPACE},
        "spec": {"schedulerName": "bench-none", "containers": [{"name": "main", "image": "busybox"}]},
    }
