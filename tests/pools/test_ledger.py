"""The ledger: what Pods and reservations hold, per node, per pool, per namespace and class, per quota;
told to the capacity index, and following the nodes when it says they changed."""

from __future__ import annotations

from typing import Any

from tests.builders import decision_view, fleet, gpu_node, index_of, pod
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
from webhook.pools.capacity import Capacity
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj
from webhook.pools.ledger import Ledger
from webhook.pools.reservations import Reservation

# --- through the index ----------------------------------------------------------------------------------


def test_reservations_hold_capacity_until_the_pod_shows_up_or_expires() -> None:
    """An admitted Pod counts against its pool until the watch shows it, then only once."""
    index = index_of(fleet())
    for _ in range(8):
        index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1), now=0.0)
    assert free(index, T4) == 0
    assert index.usage.reserved("ml", "nvidia.com/gpu") == 8
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node="t4-a", phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert (index.usage.reservations, free(index, T4)) == (7, 0)
    index.upsert_pod(pod_from_obj(seen, RES))  # the same Pod again settles nothing more
    assert index.usage.reservations == 7
    assert index.expire(now=POLICY.defaults.reservation_seconds + 1) == 7
    assert free(index, T4) == 7
    assert index.usage.reserved("ml", "nvidia.com/gpu") == 0
    assert index.usage.class_used("ml", "medium") == 1


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
    assert (index.usage.class_used("train", "high"), index.usage.class_used("train", "medium")) == (8, 8)
    index.upsert_node(node_from_obj(a100("a100-a"), RES))
    assert (index.usage.class_used("train", "high"), index.usage.class_used("train", "medium")) == (16, 0)
    index.remove_node("a100-b")
    assert index.usage.class_used("train", "high") == 8


def job_pod(name: str, job: str = "train", **fields: Any) -> dict[str, Any]:
    """A Pod a Job controller made, as the watch shows it once gpupool placed it on the T4 pool."""
    obj = pod(name, annotations={"gpupool.io/pool": str(T4)}, gpus=1, node_selector=dict(T4_SELECTOR), **fields)
    obj["metadata"]["ownerReferences"] = [{"kind": "Job", "name": job, "uid": "u", "controller": True}]
    return obj


def test_a_group_holds_its_pool_through_reservations_then_pods_until_they_finish() -> None:
    """A burst of a Job's admissions makes the group a member of the pool before the watch shows any
    Pod; each Pod that shows up takes over its reservation; finished Pods leave the group, and a group
    with no member left is forgotten."""
    index = index_of(fleet())
    for i in range(3):
        index.reserve(
            Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name=f"p{i}", group="Job/train"), now=0.0
        )
    assert index.usage.group_pools("ml", "Job/train") == {T4: 3}
    assert index.usage.group_pools("other", "Job/train") == {}  # groups are namespace-scoped
    for i in range(3):
        index.upsert_pod(pod_from_obj(job_pod(f"p{i}"), RES))
    assert (index.usage.reservations, index.usage.group_pools("ml", "Job/train")) == (0, {T4: 3})
    index.upsert_pod(pod_from_obj(job_pod("p0", node="t4-a", phase="Running"), RES))
    index.upsert_pod(pod_from_obj(job_pod("p1", node="t4-a", phase="Succeeded"), RES))
    index.remove_pod(("ml", "p2"))
    assert index.usage.group_pools("ml", "Job/train") == {T4: 1}
    index.remove_pod(("ml", "p0"))
    assert index.usage.group_pools("ml", "Job/train") == {}


def test_gpupool_counts_each_namespaces_gpu_requests_itself() -> None:
    """The GPUs a namespace's Pods request, bound or waiting, as long as they are not Succeeded or Failed:
    what a quota Kubernetes does not enforce is held to. Reservations are counted apart."""
    index = index_of(fleet())
    index.upsert_pod(pod_from_obj(pod("run", gpus=2, node="t4-a", phase="Running"), RES))
    index.upsert_pod(pod_from_obj(pod("wait", gpus=3), RES))
    index.upsert_pod(pod_from_obj(pod("done", gpus=4, node="t4-b", phase="Succeeded"), RES))
    index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="next"), now=0.0)
    assert (index.usage.requested("ml", "nvidia.com/gpu"), index.usage.reserved("ml", "nvidia.com/gpu")) == (5, 1)
    index.upsert_pod(pod_from_obj(pod("wait", gpus=3, phase="Failed"), RES))
    assert index.usage.requested("ml", "nvidia.com/gpu") == 2


def test_gpu_memory_follows_the_node_or_pool_a_pod_is_on() -> None:
    """GPU memory held is devices x memory per device: the node's for a bound Pod, the pool's for a
    placed Pod not on a node yet or a reservation; it moves when a node's memory label changes, and a
    Pod pinned to a pool whose nodes are not seen yet holds memory once they are."""
    index = index_of([gpu_node("t4-a", memory_mib=15360), gpu_node("l4-a", "NVIDIA-L4", memory_mib=23034)])
    a100_pool = {"gpupool.io/pool": "nvidia/high/NVIDIA-A100-SXM4-40GB"}
    index.upsert_pod(pod_from_obj(pod("run", gpus=2, node="t4-a", phase="Running"), RES))
    index.upsert_pod(pod_from_obj(pod("wait", gpus=1, annotations=a100_pool), RES))
    index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1, name="next"), now=0.0)
    assert (index.usage.memory_used("ml"), index.usage.memory_pending("ml")) == (3 * 15360, 15360)
    index.upsert_node(node_from_obj(gpu_node("t4-a", memory_mib=16384), RES))
    assert index.usage.memory_used("ml") == 2 * 16384 + 15360  # the reservation keeps what it was made with
    a100_node = gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high")
    index.upsert_node(node_from_obj(a100_node, RES))
    assert index.usage.memory_used("ml") == 2 * 16384 + 15360 + 40960
    index.expire(now=POLICY.defaults.reservation_seconds + 1)
    index.remove_pod(("ml", "run"))
    assert (index.usage.memory_used("ml"), index.usage.memory_pending("ml")) == (40960, 0)


def test_pod_list_before_node_list_gives_the_same_usage() -> None:
    """Usage does not depend on whether Pods or nodes were listed first."""
    objects = train_cluster()
    nodes_first = feed(PoolIndex(TRAIN), objects)
    pods_first = feed(PoolIndex(TRAIN), objects[::-1])
    assert pods_first.usage.class_used("train", "high") == nodes_first.usage.class_used("train", "high") == 16
    assert decision_view(pods_first, ["train"]) == decision_view(nodes_first, ["train"])


# --- the ledger with a capacity index, without the façade -----------------------------------------------


def parts() -> tuple[Capacity, Ledger]:
    capacity = Capacity(POLICY)
    for obj in fleet():
        capacity.upsert_node(node_from_obj(obj, RES), None)
    capacity.take_reshaped()
    capacity.pack()
    return capacity, Ledger(POLICY, capacity)


def free_and_pending(capacity: Capacity) -> tuple[int, int]:
    capacity.pack()
    t4 = next(s for s in capacity.pool_stats() if s.pool == T4)
    return t4.gpus_free, t4.pending


def test_the_ledger_tells_the_capacity_index_what_claims_take_and_takes_it_back_exactly() -> None:
    """A bound Pod's GPUs are used on its node, an unbound pinned Pod's and a reservation's are held in
    the pool; each taken back leaves the capacity index as it was."""
    capacity, ledger = parts()
    bound = pod_from_obj(pod("a", gpus=3, node="t4-a", phase="Running"), RES)
    waiting = pod_from_obj(pod("w", gpus=2, node_selector=dict(T4_SELECTOR)), RES)
    ledger.upsert_pod(bound, bound.key)
    ledger.upsert_pod(waiting, waiting.key)
    token = ledger.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=1), 0.0)
    assert free_and_pending(capacity) == (2, 3)
    assert (ledger.used_on("t4-a"), ledger.class_used("ml", "medium"), ledger.reserved("ml", "nvidia.com/gpu")) == (
        {"nvidia.com/gpu": 3},
        6,
        1,
    )
    ledger.release(token)
    ledger.remove_pod(waiting.key)
    ledger.remove_pod(bound.key)
    assert free_and_pending(capacity) == (8, 0)
    assert (ledger.used_on("t4-a"), ledger.class_used("ml", "medium"), ledger.pod_keys()) == (None, 0, set())


def test_the_ledger_follows_the_nodes_only_when_told() -> None:
    """Class usage of a bound Pod moves when the capacity index's word is passed on (reclass); unbound
    Pods are placed again when a selector came (place_unbound_again)."""
    capacity, ledger = parts()
    bound = pod_from_obj(pod("a", gpus=2, node="t4-a", phase="Running"), RES)
    ledger.upsert_pod(bound, bound.key)
    assert capacity.upsert_node(node_from_obj(gpu_node("t4-a", gpu_class="low"), RES), ledger.used_on("t4-a"))
    assert (ledger.class_used("ml", "medium"), ledger.class_used("ml", "low")) == (2, 0)
    ledger.reclass("t4-a")
    assert (ledger.class_used("ml", "medium"), ledger.class_used("ml", "low")) == (0, 2)

    zone = {"topology.kubernetes.io/zone": "z", "nvidia.com/gpu.product": "NVIDIA-L40S"}
    waiting = pod_from_obj(pod("w", gpus=1, node_selector=zone), RES)
    ledger.upsert_pod(waiting, waiting.key)
    assert ledger.class_used("ml", "medium") == 0  # no L40S pool yet: not counted
    l40s = gpu_node("l40s-a", "NVIDIA-L40S", labels={"topology.kubernetes.io/zone": "z"})
    capacity.upsert_node(node_from_obj(l40s, RES), None)
    assert capacity.take_reshaped()
    ledger.place_unbound_again()
    assert ledger.class_used("ml", "medium") == 1
