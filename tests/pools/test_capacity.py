"""The capacity index: pools and each node's own free GPUs, from the nodes and what the ledger says is
used on them and held in their pools; and the signals that make the ledger follow the nodes."""

from __future__ import annotations

from tests.builders import fleet, gpu_node, index_of, mig_mixed_node, pod, shared_node
from tests.pools.probes import POLICY, RES, T4, T4_SELECTOR, free_per_node, stats
from webhook.domain.model import PoolKey
from webhook.pools.capacity import Capacity
from webhook.pools.kubeobj import node_from_obj, pod_from_obj
from webhook.pools.nodes import NodeFacts

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
    assert T4 not in {s.pool for s in index.capacity.pool_stats()}


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


# --- the capacity index alone: its interface with the ledger --------------------------------------------


def t4_facts(capacity: Capacity, name: str) -> NodeFacts:
    facts = capacity.node_facts(name, "nvidia.com/gpu")
    assert isinstance(facts, NodeFacts)
    return facts


def test_a_nodes_own_free_gpus_are_its_allocatable_minus_what_the_ledger_says_is_used() -> None:
    """Usage counted before the node came is given with it; later changes come through set_used."""
    capacity = Capacity(POLICY)
    capacity.upsert_node(node_from_obj(gpu_node("t4-a"), RES), {"nvidia.com/gpu": 3})
    assert capacity.node_free(t4_facts(capacity, "t4-a")) == 1
    capacity.set_used("t4-a", {"nvidia.com/gpu": 1, "amd.com/gpu": 2})
    assert capacity.node_free(t4_facts(capacity, "t4-a")) == 3
    capacity.set_used("t4-a", None)
    assert capacity.node_free(t4_facts(capacity, "t4-a")) == 4
    capacity.set_used("unknown-node", {"nvidia.com/gpu": 1})  # counted once the node comes, not before
    assert capacity.node_names() == {"t4-a"}


def test_upsert_node_says_when_the_nodes_pools_changed() -> None:
    """True when the node came, moved to another pool or lost its GPUs (its Pods count against other
    classes now); False for a heartbeat, or a change within its pool such as a cordon."""
    capacity = Capacity(POLICY)
    node = gpu_node("t4-a")
    assert capacity.upsert_node(node_from_obj(node, RES), None)
    assert not capacity.upsert_node(node_from_obj(node, RES), None)
    assert not capacity.upsert_node(node_from_obj(gpu_node("t4-a", unschedulable=True), RES), None)
    assert capacity.upsert_node(node_from_obj(gpu_node("t4-a", gpu_class="low"), RES), None)
    assert capacity.upsert_node(node_from_obj(gpu_node("t4-a", gpu_class="low", memory_mib=16384), RES), None)
    cpu_only = gpu_node("t4-a", gpus=0)
    del cpu_only["status"]["allocatable"]["nvidia.com/gpu"]
    assert capacity.upsert_node(node_from_obj(cpu_only, RES), None)
    assert list(capacity.pools()) == []


def test_a_pools_memory_is_the_least_of_its_nodes_and_a_change_reshapes_it() -> None:
    """Memory per GPU of a pool, which the GPU memory of Pods placed in it is counted with: the least of
    its nodes'. A node that lowers it, or the last one of that memory leaving, says so once
    (take_reshaped), so the ledger counts unbound Pods' memory again; a node like the others does not."""
    capacity = Capacity(POLICY)
    assert capacity.pool_memory_mib(T4) == 0
    capacity.upsert_node(node_from_obj(gpu_node("t4-a", memory_mib=16384), RES), None)
    capacity.take_reshaped()
    capacity.upsert_node(node_from_obj(gpu_node("t4-b", memory_mib=16384), RES), None)
    assert (capacity.pool_memory_mib(T4), capacity.take_reshaped()) == (16384, False)
    capacity.upsert_node(node_from_obj(gpu_node("t4-c", memory_mib=15360), RES), None)
    assert (capacity.pool_memory_mib(T4), capacity.take_reshaped(), capacity.take_reshaped()) == (15360, True, False)
    capacity.remove_node("t4-c")
    assert (capacity.pool_memory_mib(T4), capacity.take_reshaped()) == (16384, True)


def test_a_hold_in_a_pool_without_nodes_waits_for_them() -> None:
    """Held GPUs make their pool, pending, until the nodes come; taken back, the empty pool is gone."""
    capacity = Capacity(POLICY)
    capacity.hold(T4, T4_SELECTOR, 2, +1)
    capacity.pack()
    (only,) = capacity.pool_stats()
    assert (only.pool, only.nodes, only.gpus_free, only.pending) == (T4, 0, 0, 2)
    capacity.upsert_node(node_from_obj(gpu_node("t4-a"), RES), None)
    capacity.pack()
    assert (capacity.pool_stats()[0].gpus_free, capacity.pool_stats()[0].pending) == (2, 2)
    capacity.remove_node("t4-a")
    capacity.hold(T4, T4_SELECTOR, 2, -1)
    assert capacity.pool_stats() == []


def test_holds_are_packed_once_per_change_when_asked() -> None:
    """A hold changes what is free only when the change ends in pack(), however many steps it took."""
    capacity = Capacity(POLICY)
    capacity.upsert_node(node_from_obj(gpu_node("t4-a"), RES), None)
    capacity.pack()
    for _ in range(3):
        capacity.hold(T4, T4_SELECTOR, 1, +1)
    assert capacity.pool_stats()[0].gpus_free == 4
    capacity.pack()
    assert capacity.pool_stats()[0].gpus_free == 1


def test_take_reshaped_says_once_that_a_selector_came_or_went() -> None:
    """The first node of a selector and the last one to go reshape the pool; others do not."""
    capacity = Capacity(POLICY)
    capacity.upsert_node(node_from_obj(gpu_node("t4-a"), RES), None)
    assert capacity.take_reshaped()
    assert not capacity.take_reshaped()
    capacity.upsert_node(node_from_obj(gpu_node("t4-b"), RES), None)
    capacity.remove_node("t4-a")
    assert not capacity.take_reshaped()
    capacity.remove_node("t4-b")
    assert capacity.take_reshaped()


def test_the_memo_lasts_until_a_node_changes() -> None:
    """Values derived from the nodes are computed once, and again after a node changes."""
    capacity = Capacity(POLICY)
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert [capacity.memo("k", compute), capacity.memo("k", compute)] == [1, 1]
    capacity.upsert_node(node_from_obj(gpu_node("t4-a"), RES), None)
    assert capacity.memo("k", compute) == 2


# --- devices: MIG instances and replicas are pools of their own -------------------------------------------


def test_a_mixed_node_offers_each_device_in_its_pool_with_its_own_free_count() -> None:
    """A mixed-strategy node's whole GPUs, 3g.20gb and 1g.5gb instances are three pools; a Pod running
    on one MIG instance takes one instance, not a GPU; each pool says what its devices are."""
    running = pod("r", gpus=1, node="mixed-a", phase="Running", resource="nvidia.com/mig-3g.20gb")
    index = index_of([mig_mixed_node("mixed-a"), shared_node("ts-a"), running], POLICY)
    by_product = {s.pool.product: s for s in index.capacity.pool_stats()}
    whole, big = by_product["NVIDIA-A100-SXM4-40GB"], by_product["NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"]
    assert (whole.kind, whole.resource, whole.gpus_total, whole.gpus_free, whole.memory_mib) == (
        "gpu",
        "nvidia.com/gpu",
        4,
        4,
        40960,
    )
    assert (big.kind, big.profile, big.resource, big.gpus_total, big.gpus_free, big.memory_mib) == (
        "mig",
        "3g.20gb",
        "nvidia.com/mig-3g.20gb",
        4,
        3,
        20096,
    )
    shared = by_product["Tesla-T4-SHARED"]
    assert (shared.kind, shared.replicas, shared.gpus_total, shared.memory_mib) == ("shared", (4,), 4, 3840)


def test_a_nodes_facts_are_found_by_the_resource_requested() -> None:
    """On a node with whole GPUs and MIG instances, each resource finds its own pool's facts."""
    capacity = Capacity(POLICY)
    capacity.upsert_node(node_from_obj(mig_mixed_node("mixed-a"), RES, POLICY.partition_prefixes), None)
    whole = capacity.node_facts("mixed-a", "nvidia.com/gpu")
    mig = capacity.node_facts("mixed-a", "nvidia.com/mig-1g.5gb")
    assert isinstance(whole, NodeFacts) and whole.pool.product == "NVIDIA-A100-SXM4-40GB"
    assert isinstance(mig, NodeFacts) and mig.pool.product == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert capacity.node_facts("mixed-a", "nvidia.com/mig-7g.40gb") is None
