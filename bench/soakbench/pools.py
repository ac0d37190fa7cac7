"""The benchmark's own pools in the simulator's cluster (the probe pool, the burst pool), and Pods for them."""

from __future__ import annotations

from typing import Any

from bench.soakbench.sim import SimApi

# Pools the benchmark adds to the synthetic cluster. Their nodes carry a taint that only the
# benchmark's own Pods tolerate, so neither the churn nor the soak's other Pods ever use them.
BENCH_TAINT = {"key": "gpupool.io/bench", "value": "reserved", "effect": "NoSchedule"}
BENCH_TOLERATION = {"key": "gpupool.io/bench", "operator": "Exists", "effect": "NoSchedule"}
PROBE_PRODUCT, PROBE_NS = "NVIDIA-A2", "bench-probe"  # one node, one GPU: counts show at once
BURST_PRODUCT, BURST_NS = "NVIDIA-A10", "bench-burst"  # 8 nodes x 8 GPUs, 14 in use: 50 free
BURST_NODES, BURST_GPUS_PER_NODE, BURST_USED = 8, 8, 14
BURST_FREE = BURST_NODES * BURST_GPUS_PER_NODE - BURST_USED


def gpu_node(name: str, product: str, gpus: int, memory_mib: int) -> dict[str, Any]:
    """A GPU node as GPU Feature Discovery labels it, tainted for the benchmark's Pods only."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(memory_mib),
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/cuda.driver-version.full": "550.90.07",
                "gpu.accelerator/class": "medium",
            },
        },
        "spec": {"taints": [BENCH_TAINT]},
        "status": {
            "capacity": {"cpu": "32", "memory": "131072000Ki", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": "31850m", "memory": "127000000Ki", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def add_bench_pools(api: SimApi) -> None:
    """The probe pool (1 node, 1 GPU) and the burst pool (64 GPUs, 14 held by Running Pods: 50 free)."""
    api.create(gpu_node("gpu-bench-a2-0", PROBE_PRODUCT, 1, 15356))
    for i in range(BURST_NODES):
        api.create(gpu_node(f"gpu-bench-a10-{i}", BURST_PRODUCT, BURST_GPUS_PER_NODE, 23028))
    for i in range(BURST_USED // 2):
        pod = bench_pod(BURST_NS, f"running-{i}", BURST_PRODUCT, gpus=2)
        pod["spec"]["nodeName"] = f"gpu-bench-a10-{i}"
        pod["status"] = {"phase": "Running"}
        api.create(pod)


def bench_pod(namespace: str, name: str, product: str, gpus: int = 1, generate: bool = False) -> dict[str, Any]:
    """A Pod for one of the benchmark's own pools (it tolerates their taint)."""
    token = product.rsplit("-", maxsplit=1)[-1]  # NVIDIA-A10 -> A10: only that pool matches
    meta: dict[str, Any] = {"namespace": namespace, "annotations": {"gpupool.io/gpu-product": token}}
    meta["generateName" if generate else "name"] = name
    container = {"name": "main", "image": "registry.example.com/cuda:12", "resources": {}}
    if gpus != 1 or not generate:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [container], "tolerations": [BENCH_TOLERATION]},
    }
