"""Small builders for Kubernetes objects as `kubectl get -o yaml` shows them, for the core's tests.

Fakes over mocks: tests build real-shaped objects and feed them through the real projections.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from webhook.domain.policy import Policy, load_policy_text
from webhook.pools.index import PoolIndex
from webhook.sources.snapshot import build_index


def gpu_node(  # noqa: PLR0913 (a test builder: each field a keyword)
    name: str,
    product: str = "Tesla-T4",
    gpus: int = 4,
    *,
    memory_mib: int | None = 15360,
    gpu_class: str | None = "medium",
    driver: str | None = "535.104.05",
    taints: list[dict[str, str]] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    resource: str = "nvidia.com/gpu",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/hostname": name}
    if resource == "nvidia.com/gpu":
        all_labels["nvidia.com/gpu.product"] = product
        if memory_mib is not None:
            all_labels["nvidia.com/gpu.memory"] = str(memory_mib)
        if driver is not None:
            all_labels["nvidia.com/cuda.driver-version.full"] = driver
    if gpu_class is not None:
        all_labels["gpu.accelerator/class"] = gpu_class
    all_labels.update(labels or {})
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "32", "memory": "128Gi", resource: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def mig_single_node(
    name: str, model: str = "NVIDIA-A100-SXM4-40GB", profile: str = "1g.5gb", count: int = 56, **kw: Any
) -> dict[str, Any]:
    """A node in GFD's single MIG strategy: every GPU cut into `count` instances of one profile, all on
    nvidia.com/gpu, described by the gpu.* labels."""
    memory = {"1g.5gb": 4864, "2g.10gb": 9984, "3g.20gb": 20096, "1g.10gb": 9856, "3g.40gb": 40192}.get(profile, 4864)
    labels = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": str(count), **kw.pop("labels", {})}
    kw.setdefault("gpu_class", "high")
    return gpu_node(name, f"{model}-MIG-{profile}", count, memory_mib=memory, labels=labels, **kw)


def mig_mixed_node(
    name: str,
    model: str = "NVIDIA-A100-SXM4-40GB",
    whole: int = 4,
    instances: dict[str, tuple[int, int]] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """A node in GFD's mixed MIG strategy: `whole` GPUs left whole on nvidia.com/gpu, and per profile
    (count, MiB) a resource nvidia.com/mig-<profile> described by its own labels."""
    instances = {"3g.20gb": (4, 20096), "1g.5gb": (14, 4864)} if instances is None else instances
    labels = {"nvidia.com/mig.strategy": "mixed", **kw.pop("labels", {})}
    for profile, (count, memory) in instances.items():
        resource = f"nvidia.com/mig-{profile}"
        labels |= {
            f"{resource}.count": str(count),
            f"{resource}.memory": str(memory),
            f"{resource}.product": f"{model}-MIG-{profile}",
            f"{resource}.replicas": "1",
        }
    kw.setdefault("gpu_class", "high")
    kw.setdefault("memory_mib", 40960)
    obj = gpu_node(name, model, whole, labels=labels, **kw)
    for profile, (count, _) in instances.items():
        for part in ("allocatable", "capacity"):
            obj["status"].setdefault(part, {})[f"nvidia.com/mig-{profile}"] = str(count)
    return obj


def shared_node(
    name: str, product: str = "Tesla-T4", gpus: int = 1, replicas: int = 4, memory_mib: int = 15360, **kw: Any
) -> dict[str, Any]:
    """A node whose GPUs are time-sliced into `replicas` each, as GFD labels it: `-SHARED` product,
    gpu.replicas, sharing-strategy; nvidia.com/gpu counts the replicas."""
    labels = {
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/gpu.count": str(gpus),
        **kw.pop("labels", {}),
    }
    return gpu_node(name, f"{product}-SHARED", gpus * replicas, memory_mib=memory_mib, labels=labels, **kw)


def renamed_shared_node(
    name: str, product: str = "NVIDIA-H100-80GB-HBM3", gpus: int = 4, replicas: int = 4, **kw: Any
) -> dict[str, Any]:
    """A node time-sliced with GFD's `renameByDefault: true`: the replicas are on nvidia.com/gpu.shared
    (and nvidia.com/gpu is gone), described by the nvidia.com/gpu.* labels, the product not suffixed."""
    labels = {
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/gpu.count": str(gpus),
        **kw.pop("labels", {}),
    }
    kw.setdefault("memory_mib", 81559)
    kw.setdefault("gpu_class", None)
    obj = gpu_node(name, product, gpus * replicas, labels=labels, **kw)
    allocatable = obj["status"]["allocatable"]
    allocatable["nvidia.com/gpu.shared"] = allocatable.pop("nvidia.com/gpu")
    return obj


def ascend_node(name: str, card: str = "Ascend910", devices: dict[str, int] | None = None, **kw: Any) -> dict[str, Any]:
    """An Ascend node as its device plugin and labels show it: `accelerator=huawei-<card>`, and per
    resource (`huawei.com/Ascend910`, a virtual NPU `huawei.com/Ascend910-4c`) its count."""
    kw.setdefault("gpu_class", None)
    labels = {"accelerator": f"huawei-{card}", **kw.pop("labels", {})}
    devices = {f"huawei.com/{card}": 8} if devices is None else devices
    obj = gpu_node(name, card, 0, labels=labels, resource="ascend", **kw)
    allocatable = obj["status"]["allocatable"]
    del allocatable["ascend"]
    allocatable.update({resource: str(n) for resource, n in devices.items()})
    return obj


def issue_fleet() -> list[dict[str, Any]]:
    """The nodes of issue 10: an A100 in single-strategy MIG (56 1g.5gb) beside whole A100-40GBs (8 and 4
    GPUs); a time-sliced T4 (4 replicas) beside a dedicated one; a mixed-strategy A100 with two 3g.20gb."""
    return [
        mig_single_node("mig-a"),
        gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high"),
        gpu_node("a100-b", "NVIDIA-A100-SXM4-40GB", 4, memory_mib=40960, gpu_class="high"),
        gpu_node("t4-a", "Tesla-T4", 1),
        shared_node("ts-a"),
        mig_mixed_node("mixed-a", whole=0, instances={"3g.20gb": (2, 20096)}),
    ]


def pod(  # noqa: PLR0913 (a test builder: each field a keyword)
    name: str = "job",
    namespace: str = "ml",
    *,
    annotations: dict[str, str] | None = None,
    gpus: int | None = None,
    resource: str = "nvidia.com/gpu",
    node: str | None = None,
    phase: str | None = None,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04"}
    if gpus is not None:
        container["resources"] = {"limits": {resource: str(gpus)}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"containers": containers if containers is not None else [container]}
    if node:
        spec["nodeName"] = node
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations is not None:
        spec["tolerations"] = list(tolerations)
    if affinity is not None:
        spec["affinity"] = copy.deepcopy(affinity)
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def quota(name: str, namespace: str, hard: dict[str, str], used: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": dict(hard)},
        "status": {"hard": dict(hard), "used": dict(used or {})},
    }


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def fleet() -> list[dict[str, Any]]:
    """A small mixed fleet used across the core's tests."""
    return [
        gpu_node("t4-a", "Tesla-T4", 4, memory_mib=15360),
        gpu_node("t4-b", "Tesla-T4", 4, memory_mib=15360),
        gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034),
        gpu_node(
            "a100-a",
            "NVIDIA-A100-SXM4-40GB",
            8,
            memory_mib=40960,
            gpu_class="high",
            taints=[GPU_TAINT],
            driver="535.129.03",
        ),
        gpu_node(
            "h100-a",
            "NVIDIA-H100-80GB-HBM3",
            8,
            memory_mib=81559,
            gpu_class=None,
            taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
            driver="550.54.15",
        ),
        gpu_node("rtx-a", "NVIDIA-GeForce-RTX-4090", 2, memory_mib=24564, gpu_class="low", driver="545.23.08"),
    ]


def policy(text: str | None = None) -> Policy:
    """A policy for the tests of admission-time placement: `text` merged over the built-in default, with
    `defaults.placement: now` unless `text` says otherwise (the shipped default queues; its own tests load
    it with `load_policy(None)`). Text that is not a YAML mapping is loaded as it is, for its error."""
    try:
        data = yaml.safe_load(text or "")
    except yaml.YAMLError:
        return load_policy_text(text)
    if data is None:
        data = {}
    if not isinstance(data, dict) or not isinstance(data.get("defaults", {}), dict):
        return load_policy_text(text)
    data["defaults"] = {"placement": "now", **(data.get("defaults") or {})}
    return load_policy_text(yaml.safe_dump(data, sort_keys=False))


def index_of(objects: list[dict[str, Any]], pol: Policy | None = None) -> PoolIndex:
    return build_index(objects, pol or policy())


def eventually(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll until `check` holds. The deadline is generous because CI machines are shared and noisy;
    it bounds a hang, it does not assert a latency."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.02)


def decision_view(index: PoolIndex, namespaces: Iterable[str]) -> dict[str, Any]:
    """Everything decisions and `gpupool inventory` read from an index, to compare two of them: per pool
    its capacity, free and pending GPUs; per node group how many usable nodes have each number of free
    GPUs left (so its most free on one node and its total) and each node's own free GPUs; per namespace
    its class usage and the GPUs it has reserved."""
    policy = index.policy
    return {
        "stats": index.capacity.pool_stats(),
        "groups": sorted(
            (
                str(p.key),
                g.selector,
                str(g.gpu_taints),
                str(g.other_taints),
                sorted(g.buckets.items()),
                sorted(g.own_free.items()),
            )
            for p in index.capacity.pools()
            for g in p.groups.values()
        ),
        "class": {(ns, c): index.usage.class_used(ns, c) for ns in namespaces for c in policy.classes},
        "reserved": {(ns, r): index.usage.reserved(ns, r) for ns in namespaces for r in sorted(policy.gpu_resources)},
        "requested": {(ns, r): index.usage.requested(ns, r) for ns in namespaces for r in sorted(policy.gpu_resources)},
        "memory": {ns: (index.usage.memory_used(ns), index.usage.memory_pending(ns)) for ns in namespaces},
    }
