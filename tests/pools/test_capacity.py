"""The capacity index: pools and each node's own free GPUs, from the nodes and what the ledger says is
used on them and held in their pools; and the signals that make the ledger follow the nodes."""

from __future__ import annotations

from tests.builders import fleet, gpu_node, index_of, pod
from tests.pools.probes import RES, T4, free_per_node, stats
from webhook.domain.model import PoolKey
from webhook.pools.kubeobj import node_from_obj, pod_from_obj

# --- through the index ----------------------------------------------------------------------------------


def test_free_gpus_are_allocatable_minus_running_pods() -> None:
    """Pods on a node take its GPUs; finished Pods and Pods elsewhere do not."""
    index = index_of(
        [
            *fleet(),
            pod("a", gpus=3, node="t4-a", phase="Running"),
            pod("b", gpus=1, node="t4-a", phase="Succeeded"),
            pod("c", gpus=1, node="t4-b", phase="Failed"),
        ]
    )
    assert free_per_node(index, T4) == {"t4-a": 1, "t4-b": 4}
    s = stats(index, T4)
    assert (s.gpus_total, s.gpus_allocated, s.gpus_free, s.nodes, s.usable_nodes) == (8, 3, 5, 2, 2)


def test_pod_finishing_frees_its_gpus() -> None:
    """A Running Pod turning Succeeded gives its GPUs back; deleting it does too."""
    index = index_of(fleet())
    index.upsert_pod(pod_from_obj(pod("a", gpus=4, node="t4-a", phase="Running"), RES))
    assert free_per_node(index, T4)["t4-a"] == 0
    index.upsert_pod(pod_from_obj(pod("a", gpus=4, node="t4-a", phase="Succeeded"), RES))
    assert free_per_node(index, T4)["t4-a"] == 4
    index.upsert_pod(pod_from_obj(pod("a", gpus=4, node="t4-a", phase="Running"), RES))
    index.remove_pod(("ml", "a"))
    assert free_per_node(index, T4)["t4-a"] == 4


def test_cordon_uncordon_and_removal_change_the_pool() -> None:
    """A cordoned node stops offering GPUs, comes back when uncordoned, and removal drops it."""
    index = index_of(fleet())
    index.upsert_node(node_from_obj(gpu_node("t4-a", unschedulable=True), RES))
    assert "t4-a" not in free_per_node(index, T4)
    assert (stats(index, T4).nodes, stats(index, T4).usable_nodes) == (2, 1)
    index.upsert_node(node_from_obj(gpu_node("t4-a"), RES))
    assert free_per_node(index, T4)["t4-a"] == 4
    index.remove_node("t4-a")
    index.remove_node("t4-b")
    assert T4 not in {s.pool for s in index.pool_stats()}


def test_relabelled_node_moves_pool_keeping_its_usage() -> None:
    """A node relabelled to another class moves with the Pods running on it."""
    index = index_of([*fleet(), pod("a", gpus=2, node="t4-a", phase="Running")])
    index.upsert_node(node_from_obj(gpu_node("t4-a", gpu_class="low"), RES))
    assert free_per_node(index, PoolKey("nvidia", "low", "Tesla-T4")) == {"t4-a": 2}
    assert free_per_node(index, T4) == {"t4-b": 4}


def test_pod_usage_beyond_allocatable_never_goes_negative() -> None:
    """Overcommitted nodes (stale views) show zero free, not negative."""
    index = index_of([*fleet(), pod("a", gpus=6, node="t4-a", phase="Running")])
    assert free_per_node(index, T4)["t4-a"] == 0
