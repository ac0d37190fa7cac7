"""Reservations of admissions the watch has not shown yet: found by the Pod they wait for, by a
re-invocation of that Pod, and by age; each one object for the garbage collector."""

from __future__ import annotations

from tests.builders import fleet, index_of, pod
from tests.pools.probes import RES, T4, T4_SELECTOR, free_per_node
from webhook.domain.model import PoolKey
from webhook.pools.kubeobj import pod_from_obj

# --- through the index ----------------------------------------------------------------------------------


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


def test_a_reservation_is_settled_by_its_pods_name_or_generate_name() -> None:
    """A reservation that knows its Pod is taken over by that Pod when the watch shows it (a Pod made
    from a generateName by any Pod with that generateName, oldest reservation first), whatever the Pod
    carries: a Pod that named its node has no pool annotation at all."""
    index = index_of(fleet())
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, name="infer")
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, generate_name="train-")
    index.reserve("ml", T4, T4_SELECTOR, 2, now=0.0, name="bound", node="t4-b")
    assert free_per_node(index, T4)["t4-b"] == 2  # held on the node it names, not in the pool
    index.upsert_pod(pod_from_obj(pod("someone-else", gpus=1, node="t4-a", phase="Running"), RES))
    assert index.reservations == 3
    made = pod("train-x7k2p", gpus=1, node="t4-a", phase="Running")
    made["metadata"]["generateName"] = "train-"
    for shown in (pod("infer", gpus=1, node="t4-a", phase="Running"), made, pod("bound", gpus=2, node="t4-b")):
        before = index.reservations
        index.upsert_pod(pod_from_obj(shown, RES))
        assert index.reservations == before - 1, shown["metadata"]["name"]


def test_a_reinvocation_takes_back_only_its_own_unmatched_reservation() -> None:
    """take_echo finds the reservation of the same Pod, pool (or node) and GPUs, once: a second call, or
    another pool or size, finds none."""
    index = index_of(fleet())
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, name="infer")
    l4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
    assert not index.take_echo("ml", "infer", "", pool=l4, node="", gpus=1)
    assert not index.take_echo("ml", "infer", "", pool=T4, node="", gpus=2)
    assert not index.take_echo("ml", "other", "", pool=T4, node="", gpus=1)
    assert index.take_echo("ml", "infer", "", pool=T4, node="", gpus=1)
    assert index.reservations == 0
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, name="infer", echoed=True)
    assert not index.take_echo("ml", "infer", "", pool=T4, node="", gpus=1)
