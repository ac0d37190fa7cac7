"""The simulator's churn (webhook/testing/kubechurn.py): Pod writes at a steady number of Pods.

Driven step by step on a store (`Churn.step`), so nothing here depends on timing; one test runs the
thread through KubeSim and only checks that it writes and stops cleanly.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import orjson
import pytest

from tests.conftest import wait_until
from webhook.testing import KubeSim, synthetic_cluster
from webhook.testing.kubechurn import Churn, pod_gpus
from webhook.testing.kubestore import Store, kind_of

PODS, NODES = kind_of("pods"), kind_of("nodes")
GPU = "nvidia.com/gpu"


def cluster_store(nodes: int = 40, pods: int = 600) -> Store:
    store = Store()
    store.load(synthetic_cluster(nodes=nodes, pods=pods, seed=3))
    return store


def objects(store: Store, kind: str) -> dict[str, dict[str, Any]]:
    snap = store.snapshot(kind_of(kind))
    return {k: orjson.loads(b) for k, b in zip(snap.keys, snap.bodies, strict=True)}


def run(churn: Churn, steps: int, writes: int, start: float, seconds_per_step: float = 0.5) -> float:
    now = start
    for _ in range(steps):
        now += seconds_per_step
        churn.step(writes, now)
    return now


def gpu_pod(name: str, namespace: str, gpus: int, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "cuda", "resources": {"limits": {GPU: str(gpus)}}}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [container], **spec},
        "status": {"phase": "Pending"},
    }


def tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    return any(
        (t.get("operator") == "Exists" and t.get("key") in (None, "", taint["key"]))
        or (t.get("key") == taint["key"] and t.get("value") == taint.get("value"))
        for t in tolerations
        if t.get("effect") in (None, "", taint["effect"])
    )


class TestSteps:
    def test_every_step_writes_exactly_its_budget(self) -> None:
        store = cluster_store()
        churn = Churn(store, 100, seed=1)
        before = store.rv
        churn.step(100)
        assert store.rv == before + 100
        stats = churn.stats()
        assert stats["events"] == 100
        assert {"add", "delete", "modify"} <= stats.keys()

    def test_the_number_of_gpu_and_cpu_pods_stays_where_it_started(self) -> None:
        store = cluster_store()
        churn = Churn(store, 100, seed=2)
        counts = churn.stats()
        run(churn, steps=40, writes=50, start=time.monotonic())
        after = churn.stats()
        for kind in ("gpu_pods", "cpu_pods"):
            assert abs(after[kind] - counts[kind]) <= 5, (kind, counts[kind], after[kind])
        assert after["add"] > 100 and after["delete"] > 100 and after["bind"] > 50 and after["complete"] > 0

    def test_binds_respect_capacity_node_selectors_and_taints(self) -> None:
        """Whatever it binds fits: no node holds more GPUs than it has, every bound Pod matches its
        node's labels and tolerates its NoSchedule taints."""
        store = cluster_store()
        churn = Churn(store, 100, seed=3, gpu_share=0.8)
        run(churn, steps=60, writes=60, start=time.monotonic())
        assert churn.stats()["bind"] > 100
        nodes = objects(store, "nodes")
        used: Counter[str] = Counter()
        for pod in objects(store, "pods").values():
            spec = pod["spec"]
            node_name = spec.get("nodeName")
            if not node_name:
                continue
            node = nodes[node_name]
            labels = node["metadata"].get("labels", {})
            assert all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())
            for taint in node["spec"].get("taints") or []:
                assert tolerated(taint, spec.get("tolerations") or []), (pod["metadata"]["name"], taint)
            if pod["status"]["phase"] not in ("Succeeded", "Failed"):
                used[node_name] += pod_gpus(spec, [GPU])
        for name, gpus in used.items():
            assert gpus <= int(nodes[name]["status"]["allocatable"].get(GPU, "0")), name

    def test_pods_created_by_others_are_bound_and_balanced_by_deletions(self) -> None:
        """Pods written by someone else (kube-apiserver creating admitted Pods) are bound after
        bind_delay, and as many Pods are deleted, so the cluster does not grow."""
        store = cluster_store()
        churn = Churn(store, 100, seed=4, bind_delay=1.0)
        start = time.monotonic()
        total = len(objects(store, "pods"))
        for i in range(30):
            store.put(gpu_pod(f"admitted-{i}", "team-a", 1), exists=False)
        churn.step(10, start + 0.1)  # too early to bind, but deletions make room already
        assert store.get(PODS, "team-a", "admitted-0") is not None
        pods = objects(store, "pods")
        assert not any(pods.get(f"team-a/admitted-{i}", {}).get("spec", {}).get("nodeName") for i in range(30))
        run(churn, steps=6, writes=40, start=start + 0.1)
        pods = objects(store, "pods")
        left = [p for k, p in pods.items() if k.startswith("team-a/admitted-")]
        assert left  # GPU Pods to delete are picked at random: some of the admitted ones went
        assert all(p["spec"].get("nodeName") and p["status"]["phase"] != "Pending" for p in left)
        assert abs(len(pods) - total) <= 5

    def test_namespaces_created_later_are_bound_but_never_touched(self) -> None:
        store = cluster_store()
        churn = Churn(store, 100, seed=5, bind_delay=0.0)
        start = time.monotonic()
        for i in range(5):
            store.put(gpu_pod(f"mine-{i}", "bench", 1), exists=False)
        run(churn, steps=40, writes=100, start=start)
        mine = {k: p for k, p in objects(store, "pods").items() if k.startswith("bench/")}
        assert len(mine) == 5
        for pod in mine.values():
            assert pod["spec"].get("nodeName") and pod["status"]["phase"] == "Running"
            assert "kubesim.io/churn" not in pod["metadata"].get("annotations", {})

    def test_a_pod_that_fits_nowhere_stays_pending(self) -> None:
        store = cluster_store()
        churn = Churn(store, 100, seed=6, bind_delay=0.0)
        store.put(gpu_pod("huge", "bench", 64), exists=False)
        store.put(gpu_pod("nowhere", "bench", 1, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-B200"}), exists=False)
        run(churn, steps=10, writes=20, start=time.monotonic(), seconds_per_step=10.0)
        pods = objects(store, "pods")
        for name in ("huge", "nowhere"):
            assert not pods[f"bench/{name}"]["spec"].get("nodeName")
        # Both were given up on; a clone the churn added may have found its nodes full too.
        assert churn.stats()["unschedulable"] >= 2

    def test_node_capacity_follows_nodes_added_later(self) -> None:
        """A node written after the churn started is a bind target, with its taints honoured."""
        store = cluster_store(nodes=5, pods=20)
        churn = Churn(store, 100, seed=7, bind_delay=0.0)
        node = {
            "kind": "Node",
            "metadata": {"name": "gpu-new", "labels": {"pool": "new"}},
            "spec": {"taints": [{"key": "bench", "value": "x", "effect": "NoSchedule"}]},
            "status": {"allocatable": {GPU: "2", "pods": "110"}, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        store.put(node, exists=False)
        toleration = [{"key": "bench", "operator": "Exists", "effect": "NoSchedule"}]
        for i in range(3):
            store.put(gpu_pod(f"p{i}", "bench", 1, nodeSelector={"pool": "new"}, tolerations=toleration), exists=False)
        store.put(gpu_pod("intolerant", "bench", 1, nodeSelector={"pool": "new"}), exists=False)
        run(churn, steps=10, writes=10, start=time.monotonic(), seconds_per_step=10.0)
        pods = objects(store, "pods")
        assert sum(1 for i in range(3) if pods[f"bench/p{i}"]["spec"].get("nodeName") == "gpu-new") == 2
        assert not pods["bench/intolerant"]["spec"].get("nodeName")

    def test_pods_pinned_to_rare_labels_find_their_nodes(self) -> None:
        """Candidates come from the rarest label of the nodeSelector, not from a sample of all nodes: a
        node among hundreds is found at the first bind (a sample of 30 would miss it most times)."""
        store = cluster_store(nodes=300, pods=300)
        for i in range(5):
            node = {
                "kind": "Node",
                "metadata": {"name": f"gpu-rare-{i}", "labels": {"pool": f"rare-{i}"}},
                "status": {
                    "allocatable": {GPU: "8", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
            store.put(node, exists=False)
        churn = Churn(store, 100, seed=8, bind_delay=0.0)
        for i in range(5):
            store.put(gpu_pod(f"rare-{i}", "bench", 2, nodeSelector={"pool": f"rare-{i}"}), exists=False)
        churn.step(10, time.monotonic())
        pods = objects(store, "pods")
        assert [pods[f"bench/rare-{i}"]["spec"].get("nodeName") for i in range(5)] == [
            f"gpu-rare-{i}" for i in range(5)
        ]

    def test_bad_arguments_are_refused(self) -> None:
        store = cluster_store(nodes=2, pods=5)
        with pytest.raises(ValueError, match="rate"):
            Churn(store, 0)
        with pytest.raises(ValueError, match="gpu_share"):
            Churn(store, 10, gpu_share=2)


@pytest.mark.slow
def test_kubesim_churns_from_a_thread_until_stopped() -> None:
    with KubeSim() as sim:
        sim.load(synthetic_cluster(nodes=20, pods=200, seed=8))
        churn = sim.churn(500)
        with pytest.raises(RuntimeError, match="already"):
            sim.churn(10)
        wait_until(lambda: churn.stats()["events"] >= 50, 20, "the churn's first writes")
    stopped = churn.stats()
    assert churn.errors == []
    assert churn.stats()["events"] == stopped["events"]
    assert int(sim.resource_version) >= stopped["events"]
