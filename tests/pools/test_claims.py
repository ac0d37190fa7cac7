"""Where a Pod's GPUs count: a bound Pod against its node's class, whatever its annotations say; an
unbound Pod in the pool its nodeSelector, else its gpupool.io/pool annotation, pins it to."""

from __future__ import annotations

import pytest

from tests.builders import GPU_TAINT, fleet, gpu_node, index_of, mig_mixed_node, pod, policy
from tests.pools.probes import A100, A100_SELECTOR, POLICY, RES, T4, T4_SELECTOR, TRAIN, a100, stats, train_cluster
from webhook.domain.model import PoolKey
from webhook.pools.capacity import Capacity
from webhook.pools.claims import Claim, bound_claim, node_classes, node_memory, unbound_claim
from webhook.pools.kubeobj import node_from_obj, pod_from_obj

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# --- through the index ----------------------------------------------------------------------------------


def test_bound_pods_count_against_their_nodes_class_without_the_annotation() -> None:
    """Pods on high-class nodes count 16 high GPUs for `train`, whatever their annotations say."""
    assert index_of(train_cluster(), TRAIN).usage.class_used("train", "high") == 16


def test_removing_the_pool_annotation_changes_no_usage() -> None:
    """A placed Pod whose gpupool.io/pool annotation is removed still counts the same, bound or not."""
    placed = {"gpupool.io/pool": str(A100)}
    bound = pod("b", namespace="train", gpus=8, node="a100-a", phase="Running", annotations=placed)
    waiting = pod("w", namespace="train", gpus=4, annotations=placed, node_selector=dict(A100_SELECTOR))
    waiting["spec"]["tolerations"] = [GPU_TOLERATION]
    index = index_of([a100("a100-a"), a100("a100-b"), bound, waiting], TRAIN)
    before = (index.usage.class_used("train", "high"), stats(index, A100).pending, stats(index, A100).gpus_free)
    assert before == (12, 4, 4)
    for obj in (bound, waiting):
        del obj["metadata"]["annotations"]
        index.upsert_pod(pod_from_obj(obj, RES))
    assert (index.usage.class_used("train", "high"), stats(index, A100).pending, stats(index, A100).gpus_free) == before


@pytest.mark.parametrize(
    ("annotation", "selector", "expected"),
    [
        # The nodeSelector gpupool wrote reaches one pool: that pool, whatever the annotation says.
        (None, dict(A100_SELECTOR), {"high": 4, "pending": 4}),
        (str(T4), {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, {"high": 4, "pending": 4}),
        # No nodeSelector on pool labels reaches several pools: the annotation's pool.
        (str(A100), None, {"high": 4, "pending": 4}),
        # The nodeSelector contradicts the annotation: the class of the pools it reaches (T4 and L4).
        (str(A100), {"gpu.accelerator/class": "medium"}, {"medium": 4}),
        # It contradicts the annotation and reaches no pool: not counted until bound.
        (str(A100), {"gpu.accelerator/class": "low", "nvidia.com/gpu.product": "Tesla-T4"}, {}),
        # The reachable pools share one class: that class, but no pool to hold GPUs in.
        (None, {"gpu.accelerator/class": "high"}, {"high": 4}),
        # Pinned to the A100s, but no node can ever take it (a label no node has): the quota counts it,
        # the pool holds nothing for it.
        (str(A100), {**dict(A100_SELECTOR), "zone": "nowhere"}, {"high": 4}),
        # Nothing says where it goes, and the pools it could go to differ in class.
        (None, None, {}),
    ],
)
def test_unbound_pod_counts_against_the_pool_it_is_pinned_to(
    annotation: str | None, selector: dict[str, str] | None, expected: dict[str, int]
) -> None:
    """An unbound Pod counts where its nodeSelector, else its gpupool.io/pool annotation, pins it."""
    h100 = gpu_node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, gpu_class="high", taints=[GPU_TAINT])
    index = index_of([*fleet(), h100, a100("a100-b")], TRAIN)
    waiting = pod(
        "w",
        namespace="train",
        gpus=4,
        annotations={"gpupool.io/pool": annotation} if annotation else None,
        node_selector=selector,
        tolerations=[GPU_TOLERATION],  # as gpupool's patch tolerates the GPU taint
    )
    index.upsert_pod(pod_from_obj(waiting, RES))
    counted = {c: index.usage.class_used("train", c) for c in POLICY.classes}
    counted["pending"] = sum(s.pending for s in index.capacity.pool_stats())
    assert {k: v for k, v in counted.items() if v} == expected


# --- claims worked out from the capacity index alone ----------------------------------------------------


def capacity_of(objects: list[dict[str, object]]) -> Capacity:
    capacity = Capacity(POLICY)
    for obj in objects:
        capacity.upsert_node(node_from_obj(obj, RES), None)
    return capacity


def test_a_bound_claim_uses_the_pods_requests_on_its_node_and_counts_its_class() -> None:
    """Bound: the requests are used on the node and counted against the class of its pool; on a node the
    capacity index does not know (yet), against no class."""
    capacity = capacity_of(fleet())
    running = pod_from_obj(pod("a", gpus=2, node="a100-a", phase="Running"), RES)
    assert bound_claim(running, capacity.facts("a100-a")) == Claim(
        "ml",
        node="a100-a",
        requests=(("nvidia.com/gpu", 2),),
        classes=(("high", 2),),
        counted=(("nvidia.com/gpu", 2),),
        memory_mib=2 * 40960,
    )
    assert node_classes(capacity.facts("not-seen"), (("nvidia.com/gpu", 2),)) == ()
    assert node_memory(capacity.facts("not-seen"), (("nvidia.com/gpu", 2),)) == 0


def test_an_unbound_claim_holds_in_the_one_pool_its_node_selector_reaches() -> None:
    """Unbound and pinned to one pool by its nodeSelector (and by a label only the T4s have): held there,
    only on the groups its pins reach, and counted against that pool's class."""
    nodes = fleet()
    for node in nodes:
        if node["metadata"]["labels"].get("nvidia.com/gpu.product") == "Tesla-T4":
            node["metadata"]["labels"]["other"] = "label"
    capacity = capacity_of(nodes)
    waiting = pod_from_obj(pod("w", gpus=3, node_selector={**dict(T4_SELECTOR), "other": "label"}), RES)
    claim = unbound_claim(waiting, capacity.all_pools(), POLICY, capacity.pool_memory_mib, capacity.runnable)
    assert claim._replace(watched=()) == Claim(
        "ml",
        holds=((T4, 3),),
        pins=T4_SELECTOR,
        classes=(("medium", 3),),
        counted=(("nvidia.com/gpu", 3),),
        memory_mib=3 * 15360,
    )


def test_a_placed_pod_of_a_group_is_a_member_on_its_annotated_pool() -> None:
    """A Pod with a workload group and a gpupool.io/pool annotation is one member of its group on that
    pool, bound or not; without either it is a member nowhere."""
    capacity = capacity_of(fleet())
    job = [{"kind": "Job", "name": "train", "controller": True}]
    placed = pod("p", gpus=1, annotations={"gpupool.io/pool": str(T4)})
    placed["metadata"]["ownerReferences"] = job
    bound = pod("b", gpus=1, node="t4-a", annotations={"gpupool.io/pool": str(T4)})
    bound["metadata"]["ownerReferences"] = job
    unplaced = pod("u", gpus=1)
    unplaced["metadata"]["ownerReferences"] = job
    claims = [
        unbound_claim(
            pod_from_obj(placed, RES), capacity.all_pools(), POLICY, capacity.pool_memory_mib, capacity.runnable
        ),
        bound_claim(pod_from_obj(bound, RES), capacity.facts("t4-a")),
        unbound_claim(
            pod_from_obj(unplaced, RES), capacity.all_pools(), POLICY, capacity.pool_memory_mib, capacity.runnable
        ),
    ]
    assert [c.group for c in claims] == [("Job/train", T4), ("Job/train", T4), None]


# --- devices: each resource counts against its own pool's class ------------------------------------------

MIG_CLASSES = policy(
    "products: [{match: A100, class: high}, {match: A100-MIG-3g.20gb, class: medium}]\n"
    "namespaces: {train: {classQuota: {high: 20, medium: 20}}}"
)
BIG_MIG = PoolKey("nvidia", "medium", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/mig-3g.20gb")


def test_a_bound_pod_counts_its_devices_against_the_class_of_their_pool() -> None:
    """On a node offering whole high GPUs and medium 3g.20gb instances, a Pod on two instances counts
    two medium devices, and one on a whole GPU one high GPU."""
    node = mig_mixed_node("mixed-a", gpu_class=None)
    on_mig = pod("m", "train", gpus=2, node="mixed-a", phase="Running", resource="nvidia.com/mig-3g.20gb")
    on_gpu = pod("g", "train", gpus=1, node="mixed-a", phase="Running")
    index = index_of([node, on_mig, on_gpu], MIG_CLASSES)
    assert (index.usage.class_used("train", "medium"), index.usage.class_used("train", "high")) == (2, 1)


def test_an_unbound_pod_pinned_to_a_mig_pool_holds_an_instance_there() -> None:
    """A Pending Pod that requests an instance and carries gpupool's placement holds an instance of that
    pool (its nodeSelector's MIG product label is the profile's own), not a whole GPU."""
    placed = pod(
        "w",
        "train",
        gpus=1,
        resource="nvidia.com/mig-3g.20gb",
        annotations={"gpupool.io/pool": str(BIG_MIG)},
        node_selector={"nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"},
    )
    index = index_of(
        [mig_mixed_node("mixed-a", gpu_class=None), mig_mixed_node("mixed-b", gpu_class=None), placed], MIG_CLASSES
    )
    assert (stats(index, BIG_MIG).pending, index.usage.class_used("train", "medium")) == (1, 1)
    assert stats(index, PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")).pending == 0


def test_a_mig_product_label_pins_the_pool_an_unbound_pod_holds_in() -> None:
    """The same profile on two models (1g.10gb on A100-80GB and H100) is two pools of one resource. A
    Pending Pod pinned by the profile's own product label to the H100's, with no pool annotation, holds an
    instance of the H100 pool: the ledger reads the nodeSelector with the rule admission uses
    (Policy.pins_pool), not only the class and product labels."""
    a100 = mig_mixed_node("a100", "NVIDIA-A100-SXM4-80GB", instances={"1g.10gb": (7, 9856)}, memory_mib=81920)
    h100 = mig_mixed_node("h100", "NVIDIA-H100-80GB-HBM3", instances={"1g.10gb": (7, 9856)}, memory_mib=81559)
    waiting = pod(
        "w",
        "ml",
        gpus=1,
        resource="nvidia.com/mig-1g.10gb",
        node_selector={"nvidia.com/mig-1g.10gb.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"},
        phase="Pending",
    )
    index = index_of([a100, h100, waiting], POLICY)
    pending = {s.pool.product: s.pending for s in index.capacity.pool_stats() if s.resource == "nvidia.com/mig-1g.10gb"}
    assert pending == {"NVIDIA-H100-80GB-HBM3-MIG-1g.10gb": 1, "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb": 0}
