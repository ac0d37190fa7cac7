"""The synthetic cluster generator (webhook/testing/synthetic.py): deterministic, and shaped like a GPU fleet."""

from __future__ import annotations

from collections import Counter

import kubernetes
import orjson

from webhook.domain.groups import controller_of, workload_group
from webhook.domain.policy import load_policy
from webhook.sources.snapshot import build_index
from webhook.testing import synthetic_cluster


class TestSyntheticCluster:
    def test_same_seed_same_cluster(self) -> None:
        """The generator is deterministic for a seed and differs between seeds."""
        assert synthetic_cluster(nodes=20, pods=100, seed=1) == synthetic_cluster(nodes=20, pods=100, seed=1)
        assert synthetic_cluster(nodes=20, pods=100, seed=1) != synthetic_cluster(nodes=20, pods=100, seed=2)

    def test_cluster_looks_like_a_gpu_fleet(self) -> None:
        """GPU nodes carry GFD labels; GPU Pods never exceed their node's GPUs and belong to workload
        groups of several Pods, of every kind; quotas use the requests. prefix except one; the objects
        pass the client's typed models."""
        objects = synthetic_cluster(nodes=300, pods=3000, seed=0)
        nodes = [o for o in objects if o["kind"] == "Node"]
        pods = [o for o in objects if o["kind"] == "Pod"]
        quotas = [o for o in objects if o["kind"] == "ResourceQuota"]
        gpu_nodes = {n["metadata"]["name"]: n for n in nodes if "nvidia.com/gpu" in n["status"]["allocatable"]}
        assert 0.8 < len(gpu_nodes) / len(nodes) < 0.97
        products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in gpu_nodes.values()}
        assert products == {"Tesla-T4", "NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"}
        assert {n["status"]["allocatable"]["nvidia.com/gpu"] for n in gpu_nodes.values()} == {"4", "8"}
        assert any("gpu.accelerator/class" in n["metadata"]["labels"] for n in gpu_nodes.values())
        used: dict[str, int] = {}
        for p in pods:
            gpus = int(p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0))
            if gpus and p["status"]["phase"] == "Running":
                used[p["spec"]["nodeName"]] = used.get(p["spec"]["nodeName"], 0) + gpus
        assert used
        assert all(
            n in gpu_nodes and g <= int(gpu_nodes[n]["status"]["allocatable"]["nvidia.com/gpu"])
            for n, g in used.items()
        )
        gpu_pods = sum(1 for p in pods if "nvidia.com/gpu" in p["spec"]["containers"][0]["resources"]["limits"])
        assert 0.03 < gpu_pods / len(pods) < 0.07
        groups: Counter[tuple[str, str]] = Counter()
        for p in pods:
            meta = p["metadata"]
            if "nvidia.com/gpu" in p["spec"]["containers"][0]["resources"]["limits"]:
                group = workload_group(
                    meta.get("annotations", {}).get("gpupool.io/group"),
                    meta["labels"],
                    controller_of(meta["ownerReferences"]),
                )
                groups[(meta["namespace"], group)] += 1
        assert {g.split("/")[0] for _, g in groups if "/" in g} >= {"Job", "KubeflowJob", "JobSet", "ReplicaSet"}
        assert any("/" not in g for _, g in groups)  # a sweep named by gpupool.io/group
        assert max(groups.values()) > 1  # groups of several Pods (more of them in larger clusters)
        assert len({p["metadata"]["namespace"] for p in pods}) == 50
        assert 1200 < sum(len(orjson.dumps(p)) for p in pods) / len(pods) < 2500
        resources = [r for q in quotas for r in q["spec"]["hard"] if "gpu" in r]
        assert resources.count("nvidia.com/gpu") == 1
        assert resources.count("requests.nvidia.com/gpu") >= 3
        client = kubernetes.client.ApiClient()
        for kind in ("Node", "Pod", "ResourceQuota"):
            items = [o for o in objects if o["kind"] == kind]
            body = orjson.dumps({"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items})
            assert len(client.deserialize(body.decode(), f"V1{kind}List", "application/json").items) == len(items)

    def test_a_partitioned_fleet_has_mig_and_time_sliced_nodes_whose_pods_fit_their_devices(self) -> None:
        """With `partitioned=0.25` a quarter of the GPU nodes carry GFD's MIG (single and mixed strategy)
        or time-slicing labels; Pods on them request the node's devices and never more than it has; gpupool
        pools every node. Without it, the cluster is the whole-GPU one, unchanged."""
        objects = synthetic_cluster(nodes=800, pods=20_000, seed=1, partitioned=0.25)
        nodes = [o for o in objects if o["kind"] == "Node" and "nvidia.com/gpu.product" in o["metadata"]["labels"]]
        labels = [n["metadata"]["labels"] for n in nodes]
        single = sum("-MIG-" in lb["nvidia.com/gpu.product"] for lb in labels)
        mixed = sum(lb.get("nvidia.com/mig.strategy") == "mixed" for lb in labels)
        shared = sum(lb["nvidia.com/gpu.product"].endswith("-SHARED") for lb in labels)
        assert single and mixed and shared
        assert 0.2 < (single + mixed + shared) / len(nodes) < 0.3
        capacity = {n["metadata"]["name"]: n["status"]["allocatable"] for n in nodes}
        used: dict[tuple[str, str], int] = {}
        for p in (o for o in objects if o["kind"] == "Pod" and o["status"]["phase"] == "Running"):
            for resource, n in p["spec"]["containers"][0]["resources"]["limits"].items():
                if resource.startswith("nvidia.com/"):
                    key = (p["spec"]["nodeName"], resource)
                    used[key] = used.get(key, 0) + int(n)
        assert any(r.startswith("nvidia.com/mig-") for _, r in used)
        assert all(n <= int(capacity[node][resource]) for (node, resource), n in used.items())
        index = build_index(objects, load_policy(None))
        assert index.capacity.unclassified() == []
        assert {s.kind for s in index.capacity.pool_stats()} == {"gpu", "mig", "shared"}
        assert synthetic_cluster(nodes=20, pods=100, seed=1, partitioned=0.0) == synthetic_cluster(
            nodes=20, pods=100, seed=1
        )
