"""The pool index: free GPUs per node, kept right through every change, and burst-safe reservations."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import GPU_TAINT, fleet, gpu_node, index_of, pod, policy, quota
from webhook.kubeobj import node_from_obj, pod_from_obj, quota_from_obj
from webhook.model import PoolKey
from webhook.pool_index import PoolIndex

POLICY = policy()
RES = POLICY.gpu_resources
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
T4_SELECTOR = (("gpu.accelerator/class", "medium"), ("nvidia.com/gpu.product", "Tesla-T4"))


def stats(index: PoolIndex, key: PoolKey):  # type: ignore[no-untyped-def]
    return next(s for s in index.pool_stats() if s.pool == key)


def free_per_node(index: PoolIndex, key: PoolKey) -> dict[str, int]:
    pool = next(p for p in index.pools() if p.key == key)
    return {n: f for g in pool.groups.values() for n, f in g.free_of.items()}


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


def test_pod_seen_before_its_node_is_counted_when_the_node_arrives() -> None:
    """Watch events arrive in any order; usage is kept per node name."""
    index = PoolIndex(POLICY)
    index.upsert_pod(pod_from_obj(pod("a", gpus=3, node="t4-a", phase="Running"), RES))
    index.upsert_node(node_from_obj(gpu_node("t4-a"), RES))
    assert free_per_node(index, T4) == {"t4-a": 1}


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


def test_nodes_are_grouped_by_selector_and_taints() -> None:
    """Nodes the scheduler can tell apart (other labels or taints) are separate groups of one pool."""
    index = index_of(
        [
            gpu_node("a", gpu_class=None),
            gpu_node("b"),
            gpu_node("c", taints=[GPU_TAINT]),
        ]
    )
    pool = next(index.pools())
    assert len(pool.groups) == 3
    assert len(pool.by_selector()) == 2


def test_pending_pinned_pod_is_placed_virtually_on_best_fit_node() -> None:
    """A Pending Pod pinned by gpupool holds GPUs on the fullest node that still fits it."""
    index = index_of([*fleet(), pod("run", gpus=2, node="t4-a", phase="Running")])
    waiting = pod("w", annotations={"gpupool.io/pool": str(T4)}, gpus=2, node_selector=dict(T4_SELECTOR))
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_per_node(index, T4) == {"t4-a": 0, "t4-b": 4}
    assert stats(index, T4).pending == 2
    assert index.class_used("ml", "medium") == 2
    # Scheduled: the virtual hold is replaced by the real one on the chosen node.
    waiting["spec"]["nodeName"] = "t4-b"
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_per_node(index, T4) == {"t4-a": 2, "t4-b": 2}
    assert stats(index, T4).pending == 0
    assert index.class_used("ml", "medium") == 2


def test_reservations_hold_capacity_until_the_pod_shows_up_or_expires() -> None:
    """An admitted Pod counts against its pool until the watch shows it, then only once."""
    index = index_of(fleet())
    for _ in range(8):
        index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0)
    assert sum(free_per_node(index, T4).values()) == 0
    assert index.reserved("ml", "nvidia.com/gpu") == 8
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node="t4-a", phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert (index.reservations, sum(free_per_node(index, T4).values())) == (7, 0)
    index.upsert_pod(pod_from_obj(seen, RES))  # the same Pod again settles nothing more
    assert index.reservations == 7
    assert index.expire(now=POLICY.defaults.reservation_seconds + 1) == 7
    assert sum(free_per_node(index, T4).values()) == 7
    assert index.reserved("ml", "nvidia.com/gpu") == 0
    assert index.class_used("ml", "medium") == 1


@pytest.mark.parametrize("landed_on", ["t4-a", "t4-b"])
def test_pod_landing_where_holds_were_guessed_moves_the_holds(landed_on: str) -> None:
    """Virtual holds are guesses: when a Pod really lands on a node they filled, they move elsewhere,
    so the pool's free count stays exact whichever node the scheduler picked."""
    index = index_of(fleet())
    for _ in range(7):
        index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0)
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node=landed_on, phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert index.reservations == 6
    assert sum(free_per_node(index, T4).values()) == 1
    assert stats(index, T4).pending == 6


def test_reservation_is_settled_only_by_a_matching_pod() -> None:
    """Another namespace, pool or size does not settle a reservation."""
    index = index_of(fleet())
    index.reserve("ml", T4, T4_SELECTOR, 2, now=0.0)
    for other in (
        pod("x", namespace="other", annotations={"gpupool.io/pool": str(T4)}, gpus=2),
        pod("y", annotations={"gpupool.io/pool": "nvidia/medium/NVIDIA-L4"}, gpus=2),
        pod("z", annotations={"gpupool.io/pool": str(T4)}, gpus=1),
    ):
        index.upsert_pod(pod_from_obj(other, RES))
    assert index.reservations == 1


def test_quotas_are_kept_per_namespace() -> None:
    """Quotas are looked up by namespace and replaced or removed by name."""
    index = index_of(
        [*fleet(), quota("gpu", "team", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "1"})]
    )
    assert [q.name for q in index.quotas("team")] == ["gpu"]
    index.upsert_quota(quota_from_obj(quota("gpu", "team", {"requests.nvidia.com/gpu": "8"}), RES))
    assert index.quotas("team")[0].hard == {"requests.nvidia.com/gpu": 8}
    index.upsert_quota(None, "team", "gpu")
    assert index.quotas("team") == []


def test_pod_usage_beyond_allocatable_never_goes_negative() -> None:
    """Overcommitted nodes (stale views) show zero free, not negative."""
    index = index_of([*fleet(), pod("a", gpus=6, node="t4-a", phase="Running")])
    assert free_per_node(index, T4)["t4-a"] == 0


# --- the index kept incrementally equals the index built from the final objects -------------------------

NODE_NAMES = ("n1", "n2", "n3")
POOLS = ("nvidia/medium/Tesla-T4", "nvidia/medium/NVIDIA-L4", "nvidia/high/bogus", "not-a-pool")
nodes_st = st.builds(
    lambda name, product, gpus, ready, cordoned, labelled: gpu_node(
        name, product, gpus, ready=ready, unschedulable=cordoned, gpu_class="medium" if labelled else None
    ),
    st.sampled_from(NODE_NAMES),
    st.sampled_from(["Tesla-T4", "NVIDIA-L4", "Tesla-T4-SHARED"]),
    st.integers(0, 8),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
pods_st = st.builds(
    lambda name, node, gpus, phase, pool: pod(
        name, gpus=gpus, node=node, phase=phase, annotations={"gpupool.io/pool": pool} if pool else None
    ),
    st.sampled_from(["p1", "p2", "p3", "p4"]),
    st.sampled_from([None, *NODE_NAMES]),
    st.integers(0, 4),
    st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
    st.sampled_from([None, *POOLS]),
)
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("node"), nodes_st),
        st.tuples(st.just("pod"), pods_st),
        st.tuples(st.just("del-node"), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("del-pod"), st.sampled_from(["p1", "p2", "p3", "p4"])),
        st.tuples(st.just("reserve"), st.integers(1, 3)),
    ),
    max_size=30,
)


def _real_view(index: PoolIndex) -> dict[str, Any]:
    """What must not depend on history: real usage per node, pending and class usage per pool."""
    return {
        "stats": [
            (s.pool, s.nodes, s.usable_nodes, s.gpus_total, s.gpus_allocated, s.pending) for s in index.pool_stats()
        ],
        "class": {c: index.class_used("ml", c) for c in POLICY.classes},
    }


@settings(max_examples=150, deadline=None)
@given(ops_st)
def test_incremental_index_matches_a_rebuild(ops: list[tuple[str, Any]]) -> None:
    """Any sequence of watch events (and expired reservations) leaves the same index as building it
    from the final objects, and free GPUs are always allocatable minus real and virtual holds."""
    index = PoolIndex(POLICY)
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    for kind, arg in ops:
        if kind == "node":
            nodes[arg["metadata"]["name"]] = arg
            index.upsert_node(node_from_obj(arg, RES))
        elif kind == "pod":
            pods[arg["metadata"]["name"]] = arg
            index.upsert_pod(pod_from_obj(arg, RES), key=("ml", arg["metadata"]["name"]))
        elif kind == "del-node":
            nodes.pop(arg, None)
            index.remove_node(arg)
        elif kind == "del-pod":
            pods.pop(arg, None)
            index.remove_pod(("ml", arg))
        else:
            index.reserve("ml", T4, T4_SELECTOR, arg, now=0.0)
        for pool in index.pools():
            for group in pool.groups.values():
                for name, free in group.free_of.items():
                    f = group.nodes[name]
                    held = index._used.get(name, {}).get(f.resource, 0) + index._virtual.get(name, {}).get(
                        f.resource, 0
                    )
                    assert free == max(f.allocatable - held, 0)
    index.expire(now=10**9)
    assert index.reserved("ml", "nvidia.com/gpu") == 0
    rebuilt = index_of([*nodes.values(), *pods.values()]) if nodes else PoolIndex(POLICY)
    if not nodes:
        for p in pods.values():
            rebuilt.upsert_pod(pod_from_obj(p, RES), key=("ml", p["metadata"]["name"]))
    assert _real_view(index) == _real_view(rebuilt)
