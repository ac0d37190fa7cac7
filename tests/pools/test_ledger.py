"""The ledger: what Pods and reservations hold, per node, per pool, per namespace and class, per quota;
told to the capacity index, and following the nodes when it says they changed."""

from __future__ import annotations

from tests.builders import decision_view, fleet, index_of, pod
from tests.pools.probes import (
    POLICY,
    RES,
    T4,
    T4_SELECTOR,
    TRAIN,
    a100,
    feed,
    free,
    train_cluster,
)
from webhook.admission.core import evaluate
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj

# --- through the index ----------------------------------------------------------------------------------


def test_reservations_hold_capacity_until_the_pod_shows_up_or_expires() -> None:
    """An admitted Pod counts against its pool until the watch shows it, then only once."""
    index = index_of(fleet())
    for _ in range(8):
        index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0)
    assert free(index, T4) == 0
    assert index.reserved("ml", "nvidia.com/gpu") == 8
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node="t4-a", phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert (index.reservations, free(index, T4)) == (7, 0)
    index.upsert_pod(pod_from_obj(seen, RES))  # the same Pod again settles nothing more
    assert index.reservations == 7
    assert index.expire(now=POLICY.defaults.reservation_seconds + 1) == 7
    assert free(index, T4) == 7
    assert index.reserved("ml", "nvidia.com/gpu") == 0
    assert index.class_used("ml", "medium") == 1


def test_class_quota_denies_a_pod_beyond_the_gpus_already_on_the_nodes() -> None:
    """`train` may hold 20 high GPUs and holds 16 on the nodes: a Pod asking for 8 more is denied naming
    the class quota, although a whole A100 node is free."""
    index = index_of(train_cluster(), TRAIN)
    ask = pod("more", namespace="train", annotations={"gpupool.io/gpu-class": "high", "gpupool.io/gpu-count": "8"})
    answer = evaluate(ask, "train", TRAIN, index)
    assert not answer.allowed
    assert answer.message == "class quota high in namespace train exceeded: used 16 + requested 8 > hard 20"
    four = pod("four", namespace="train", annotations={"gpupool.io/gpu-class": "high", "gpupool.io/gpu-count": "4"})
    assert evaluate(four, "train", TRAIN, index).allowed


def test_relabelled_node_moves_the_class_usage_of_its_pods() -> None:
    """A node relabelled from high to medium takes its Pods' GPUs to medium, and back."""
    index = index_of(train_cluster(), TRAIN)
    index.upsert_node(node_from_obj(a100("a100-a", gpu_class="medium"), RES))
    assert (index.class_used("train", "high"), index.class_used("train", "medium")) == (8, 8)
    index.upsert_node(node_from_obj(a100("a100-a"), RES))
    assert (index.class_used("train", "high"), index.class_used("train", "medium")) == (16, 0)
    index.remove_node("a100-b")
    assert index.class_used("train", "high") == 8


def test_pod_list_before_node_list_gives_the_same_usage() -> None:
    """Usage does not depend on whether Pods or nodes were listed first."""
    objects = train_cluster()
    nodes_first = feed(PoolIndex(TRAIN), objects)
    pods_first = feed(PoolIndex(TRAIN), objects[::-1])
    assert pods_first.class_used("train", "high") == nodes_first.class_used("train", "high") == 16
    assert decision_view(pods_first, ["train"]) == decision_view(nodes_first, ["train"])
