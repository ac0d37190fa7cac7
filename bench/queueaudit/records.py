"""What the judge keeps of each node and Pod it follows, read once from the objects the audit log stores."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.testing.kubefit import TERMINAL, NodeFit, PodNeed, pod_requests

GPU = "nvidia.com/gpu"
QUEUE_GATE = "gpupool.io/queue"
POOL = "gpupool.io/pool"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
CLASS_LABEL = "gpu.accelerator/class"
BEFORE = -math.inf  # the stamp of room that was there before the run

Obj = Mapping[str, Any]


@dataclass(slots=True)
class Node:
    fit: NodeFit
    product: str
    gpus: int
    memory_mib: int
    gpu_class: str
    usable: bool
    used: int = 0


@dataclass(slots=True)
class Pod:
    namespace: str
    node: str
    phase: str
    gpus: int
    gated: bool
    pool: str  # gpupool.io/pool
    need: PodNeed | None
    created: float  # store time of its creation (BEFORE for Pods listed at the start)
    queued: bool  # in a queue namespace
    released_at: float | None = None
    counted: tuple[tuple[int, int], ...] = ()  # (quota rule index, amount) it holds
    room_taken: int = 0  # capacity units taken at its release, not yet bound

    @property
    def holds(self) -> bool:
        """Bound and not terminated: uses GPUs on its node."""
        return bool(self.node) and self.phase not in TERMINAL

    @property
    def counts(self) -> bool:
        """Holds quota: ungated and not terminated."""
        return self.queued and not self.gated and self.phase not in TERMINAL

    @property
    def pool_product(self) -> str:
        parts = self.pool.split("/")
        return parts[2] if len(parts) >= 3 else ""

    @property
    def pool_class(self) -> str:
        parts = self.pool.split("/")
        return parts[1] if len(parts) >= 3 else ""


def node_record(obj: Obj, class_of: Mapping[str, str]) -> Node:
    fit = NodeFit.of(obj)
    labels = fit.labels
    product = labels.get(PRODUCT_LABEL, "")
    memory = labels.get(MEMORY_LABEL, "0")
    gpu_class = labels.get(CLASS_LABEL) or class_of.get(product, "")
    ready_taints = {t.key for t in fit.taints if t.key.startswith("node.kubernetes.io/")}
    return Node(
        fit=fit,
        product=product,
        gpus=fit.allocatable.get(GPU, 0),
        memory_mib=int(memory) if memory.isdigit() else 0,
        gpu_class=gpu_class,
        usable=not fit.unschedulable and not ready_taints,
    )


def pod_record(obj: Obj, created: float, queue_namespaces: frozenset[str]) -> Pod | None:
    """The Pod as the judge follows it; None for one that requests no GPU and is not gated (never counts)."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    gated = any((g or {}).get("name") == QUEUE_GATE for g in spec.get("schedulingGates") or [])
    gpus = pod_requests(spec).get(GPU, 0)
    if not gpus and not gated:
        return None
    namespace = str(meta.get("namespace") or "")
    pool = str((meta.get("annotations") or {}).get(POOL) or "")
    released = namespace in queue_namespaces and not gated and not spec.get("nodeName")
    return Pod(
        namespace=namespace,
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        gpus=gpus,
        gated=gated,
        pool=pool,
        need=PodNeed.of(obj) if released else None,
        created=created,
        queued=namespace in queue_namespaces,
    )


def key_of(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
