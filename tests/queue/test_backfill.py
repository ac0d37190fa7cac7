"""Backfill with a bounded wait: a queued Pod that cannot fit now leaves the room it cannot use to the Pods
behind it, until it has waited `defaults.queueHoldAfterSeconds`; then it holds the pool closest to
fitting it, which drains, and it goes as soon as one node there has its room. On a simulated clock: the
queue's `since` is START, and each pass is decided at a given `now`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import gpu_node, index_of, policy
from tests.queue.helpers import T4, busy, enqueue, queued_pod
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue.release import Plan, plan, settle
from webhook.queue.waiting import Waiting

QUEUE = "namespaces:\n  q: {placement: queue}\n  q2: {placement: queue}\n  q3: {placement: queue}\n"
START = 1000.0
MEDIUM = {"gpupool.io/gpu-class": "medium"}


def served_t4s() -> list[dict[str, Any]]:
    """Two 4-GPU T4 nodes, each running a 1-GPU service: 6 GPUs idle, no node with 4."""
    nodes = [gpu_node("t4-0", "Tesla-T4", 4), gpu_node("t4-1", "Tesla-T4", 4)]
    return [*nodes, busy("t4-0", 1, "svc"), busy("t4-1", 1, "svc")]


def big(pol: Policy, index: PoolIndex, gpus: int = 4, name: str = "big", namespace: str = "q") -> dict[str, Any]:
    annotations = MEDIUM | {"gpupool.io/gpu-count": str(gpus)}
    return queued_pod(name, namespace, pol, index, annotations=annotations, created="2026-12-01T09:00:00Z")


def smalls(pol: Policy, index: PoolIndex, n: int = 6, first: int = 0) -> list[dict[str, Any]]:
    """`n` 1-GPU Pods of two other namespaces, in turn, each created a minute after the last."""
    return [
        queued_pod(f"s{i}", ("q2", "q3")[i % 2], pol, index, created=f"2026-12-01T10:{i:02d}:00Z")
        for i in range(first, first + n)
    ]


def queue_of(objects: list[dict[str, Any]], text: str = QUEUE) -> tuple[Policy, PoolIndex, Waiting]:
    pol = policy(text)
    return pol, index_of(objects, pol), Waiting(pol, clock=lambda: START)


def outcome(decided: Plan) -> tuple[dict[str, Any], dict[str, str]]:
    return {r.queued.key[1]: r.pool for r in decided.releases}, {w.queued.key[1]: w.code for w in decided.waits}


def finish(index: PoolIndex, pod_name: str) -> None:
    """A running Pod of namespace `other` finishes: its GPUs are free."""
    index.remove_pod(("other", pod_name))


def test_a_big_pod_that_cannot_fit_leaves_the_idle_gpus_to_the_small_pods_behind_it() -> None:
    """A 4-GPU Pod no node has room for, and six 1-GPU Pods of two other namespaces behind it with six GPUs
    idle: the six are released at once; the big one waits for room, holding nothing yet."""
    pol, index, waiting = queue_of(served_t4s())
    enqueue([big(pol, index), *smalls(pol, index)], index, waiting)
    released, waits = outcome(plan(waiting.ordered(), index, pol, now=START + 1))
    assert released == {f"s{i}": T4 for i in range(6)}
    assert waits == {"big": "capacity"}


def test_a_later_pod_never_takes_the_room_of_an_earlier_one_that_can_fit() -> None:
    """Behind the big Pod, a 3-GPU Pod that fits on one node, then six 1-GPU Pods: the 3-GPU Pod goes first,
    and only the three oldest 1-GPU Pods go into the room left; the younger three wait."""
    pol, index, waiting = queue_of(served_t4s())
    three = queued_pod("three", "q2", pol, index, annotations=MEDIUM | {"gpupool.io/gpu-count": "3"},
                       created="2026-12-01T09:30:00Z")  # fmt: skip
    enqueue([big(pol, index), three, *smalls(pol, index)], index, waiting)
    released, waits = outcome(plan(waiting.ordered(), index, pol, now=START + 1))
    assert released == {"three": T4, "s0": T4, "s1": T4, "s2": T4}
    assert waits == {"big": "capacity", "s3": "capacity", "s4": "capacity", "s5": "capacity"}


def test_after_its_bound_the_big_pod_holds_a_node_and_goes_once_that_node_has_room() -> None:
    """Past queueHoldAfterSeconds the big Pod holds t4-0 (3 free, as t4-1: the first by name) and is told
    so; the 1-GPU Pod behind it still goes, into the rest of the pool. Once the service on t4-0 finishes,
    the big Pod goes."""
    pol, index, waiting = queue_of(served_t4s())
    enqueue([big(pol, index), *smalls(pol, index, n=1)], index, waiting)
    bound = START + pol.defaults.queue_hold_after_seconds
    decided = plan(waiting.ordered(), index, pol, now=bound)
    assert outcome(decided) == ({"s0": T4}, {"big": "capacity"})
    assert f"node t4-0 of pool {T4} is held for it" in decided.waits[0].reason
    assert index.capacity.excluded == {"t4-0"}
    finish(index, "svc-t4-0")
    released, waits = outcome(plan(waiting.ordered(), index, pol, now=bound + 1))
    assert released == {"big": T4} and waits == {}
    assert index.capacity.excluded == frozenset()


def test_the_held_node_drains_while_the_rest_of_the_pool_still_takes_small_pods() -> None:
    """Six 1-GPU Pods behind the big one that holds t4-0: the three that fit go to t4-1, every release
    leaving t4-0 out by hostname, and none is counted on t4-0; t4-0 keeps its 3 GPUs idle for the big Pod
    while its service runs."""
    pol, index, waiting = queue_of(served_t4s())
    enqueue([big(pol, index), *smalls(pol, index)], index, waiting)
    decided = plan(waiting.ordered(), index, pol, now=START + pol.defaults.queue_hold_after_seconds)
    released, waits = outcome(decided)
    assert released == {"s0": T4, "s1": T4, "s2": T4}
    assert waits == {"big": "capacity", "s3": "capacity", "s4": "capacity", "s5": "capacity"}
    for release in decided.releases:
        affinity = json.dumps([op["value"] for op in release.patch if "affinity" in op["path"]])
        assert '{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["t4-0"]}' in affinity
    assert index.usage.used_on("t4-0") == {"nvidia.com/gpu": 1}


def test_a_hold_ends_when_its_pod_is_gone() -> None:
    """The big Pod holding t4-0 is deleted: the next pass lets t4-0 serve again."""
    pol, index, waiting = queue_of(served_t4s())
    enqueue([big(pol, index)], index, waiting)
    bound = START + pol.defaults.queue_hold_after_seconds
    plan(waiting.ordered(), index, pol, now=bound)
    assert index.capacity.excluded == {"t4-0"}
    index.remove_pod(("q", "big"))
    waiting.apply("pods", "DELETED", {"metadata": {"namespace": "q", "name": "big"}})
    plan(waiting.ordered(), index, pol, now=bound + 1)
    assert index.capacity.excluded == frozenset()


def test_before_its_bound_the_big_pod_holds_nothing() -> None:
    """One second before queueHoldAfterSeconds the 1-GPU Pod behind the big one still goes."""
    pol, index, waiting = queue_of(served_t4s())
    enqueue([big(pol, index), *smalls(pol, index, n=1)], index, waiting)
    decided = plan(waiting.ordered(), index, pol, now=START + pol.defaults.queue_hold_after_seconds - 1)
    assert outcome(decided) == ({"s0": T4}, {"big": "capacity"})


def test_the_node_held_is_of_the_pool_closest_to_fitting_and_the_others_stay_open() -> None:
    """The big Pod could use the T4s (3 free on one node) or the L4 (2 free): past its bound it holds a T4
    node, of the closer pool, and the L4 stays open too."""
    objects = [*served_t4s(), gpu_node("l4-0", "NVIDIA-L4", 4, memory_mib=23034), busy("l4-0", 2)]
    pol, index, waiting = queue_of(objects)
    enqueue([big(pol, index), *smalls(pol, index, n=1)], index, waiting)
    decided = plan(waiting.ordered(), index, pol, now=START + pol.defaults.queue_hold_after_seconds)
    assert outcome(decided)[1] == {"big": "capacity"}
    assert f"node t4-0 of pool {T4} is held for it" in decided.waits[0].reason


@pytest.mark.parametrize("namespace", ["q", "q2"], ids=["same-shape", "other-namespace"])
def test_a_second_big_pod_waits_for_room_behind_the_first_without_claiming_the_hold(namespace: str) -> None:
    """Two 4-GPU Pods past their bound: the first holds the T4s; the second is told it waits for room, not
    that a pool is held for it (its turn there comes after the first's)."""
    pol, index, waiting = queue_of(served_t4s())
    enqueue([big(pol, index), big(pol, index, name="big2", namespace=namespace)], index, waiting)
    decided = plan(waiting.ordered(), index, pol, now=START + pol.defaults.queue_hold_after_seconds)
    first, second = decided.waits
    assert "held for it" in first.reason
    assert (second.code, "held" in second.reason) == ("capacity", False)


@pytest.mark.parametrize("members", [0, 2], ids=["single-pod", "gang"])
def test_one_policy_field_bounds_the_wait_of_single_pods_and_gangs(members: int) -> None:
    """`defaults.queueHoldAfterSeconds: 30`: a 4-GPU Pod, or a gang of two, holds its pool from 30 s of
    waiting, not at 29 s."""
    pol, index, waiting = queue_of(served_t4s(), QUEUE + "defaults: {queueHoldAfterSeconds: 30}\n")
    gang = MEDIUM | {"gpupool.io/gpu-count": "4", "gpupool.io/group": "sweep", "gpupool.io/group-size": str(members)}
    ahead = [
        queued_pod(f"g-{i}", "q", pol, index, annotations=gang, created="2026-12-01T09:00:00Z") for i in range(members)
    ] or [big(pol, index)]
    enqueue([*ahead, *smalls(pol, index, n=1)], index, waiting)
    early = plan(waiting.ordered(), index, pol, now=START + 29)
    assert outcome(early)[0] == {"s0": T4}
    assert "held for it" not in early.waits[0].reason
    for release in early.releases:  # not written: the next pass decides it again
        settle(index, release, None)
    late = plan(waiting.ordered(), index, pol, now=START + 30)
    assert "held for it" in late.waits[0].reason
    if members:  # a gang holds its pool: the Pod behind it waits
        assert outcome(late)[1]["s0"] == "behind"


def test_a_hold_moves_only_to_a_node_strictly_closer_to_fitting() -> None:
    """The big Pod holds t4-0; a Pod placed past the queue (`placement: now`) takes two of t4-0's GPUs, so
    t4-1 is closer now: the hold moves there. With the two alike again, it stays where it is."""
    pol, index, waiting = queue_of(served_t4s())
    enqueue([big(pol, index)], index, waiting)
    bound = START + pol.defaults.queue_hold_after_seconds
    plan(waiting.ordered(), index, pol, now=bound)
    assert index.capacity.excluded == {"t4-0"}
    index.upsert_pod(pod_from_obj(busy("t4-0", 2, "now"), pol.gpu_resources, pol.partition_prefixes))
    plan(waiting.ordered(), index, pol, now=bound + 1)
    assert index.capacity.excluded == {"t4-1"}
    finish(index, "now-t4-0")
    plan(waiting.ordered(), index, pol, now=bound + 2)
    assert index.capacity.excluded == {"t4-1"}
