"""A gang that could not go stays parked (webhook.queue.parking): a pass does not visit it again until a
member arrives or leaves, the room of its pools or its namespace's quotas move, the Pods ahead hold other
pools, or its oldest member's bound passes; while parked it keeps what it holds from the Pods behind it,
and what the pass answers is what deciding it again would answer."""

from __future__ import annotations

from tests.builders import gpu_node, index_of, policy
from tests.queue.gangcases import QUEUE, START, members, outcome, small, two_busy_t4s
from tests.queue.helpers import T4, busy, enqueue, queued_pod
from tests.queue.parkcases import a_pass, undone
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue.parking import Parking
from webhook.queue.release import Plan
from webhook.queue.waiting import Waiting


def answers(decided: Plan) -> tuple[list[tuple[str, object]], list[tuple[str, str, str]]]:
    return (
        [(r.queued.key[1], r.pool) for r in decided.releases],
        [(w.queued.key[1], w.code, w.reason) for w in decided.waits],
    )


def test_a_gang_that_cannot_go_is_not_visited_until_its_room_moves_then_goes() -> None:
    """Two 4-GPU members (class medium) with 2 free GPUs per T4 node wait: the next pass visits no one; room
    freeing on the A100 pool (class high), which the gang does not use, visits no one either; the T4 node
    freeing visits the gang, which goes."""
    pol = policy(QUEUE)
    a100 = gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 4, memory_mib=40960, gpu_class="high")
    fleet = [*two_busy_t4s(), a100, busy("a100-a", 4)]
    index, waiting = index_of(fleet, pol), Waiting(pol, clock=lambda: START)
    enqueue(members(2, 2, 4, pol, index), index, waiting)
    parking = Parking()
    first = a_pass(waiting, index, pol, parking, START + 1)
    assert (first.visits, outcome(first)) == (1, ({}, {"g-0": "capacity", "g-1": "capacity"}))
    steady = a_pass(waiting, index, pol, parking, START + 2)
    assert steady.visits == 0 and answers(steady) == answers(first)
    index.upsert_pod(pod_from_obj(busy("a100-a", 2), pol.gpu_resources, pol.partition_prefixes))
    assert a_pass(waiting, index, pol, parking, START + 3).visits == 0
    index.remove_pod(("other", "busy-t4-0"))
    decided = a_pass(waiting, index, pol, parking, START + 4)
    assert decided.visits == 1
    assert outcome(decided)[0] == {"g-0": T4, "g-1": T4}


def test_a_member_arriving_wakes_its_gang() -> None:
    """A gang of 3 with 2 members waits for its third: parked meanwhile; the third arrives and the gang,
    which fits now, goes whole."""
    pol = policy(QUEUE)
    index, waiting = index_of([gpu_node("t4-0", "Tesla-T4", 8)], pol), Waiting(pol, clock=lambda: START)
    gang = members(3, 3, 2, pol, index)
    enqueue(gang[:2], index, waiting)
    parking = Parking()
    assert outcome(a_pass(waiting, index, pol, parking, START + 1))[1] == {"g-0": "gang", "g-1": "gang"}
    assert a_pass(waiting, index, pol, parking, START + 2).visits == 0
    enqueue(gang[2:], index, waiting)
    decided = a_pass(waiting, index, pol, parking, START + 3)
    assert decided.visits == 1
    assert outcome(decided)[0] == {"g-0": T4, "g-1": T4, "g-2": T4}


def test_a_parked_gang_that_waited_long_holds_its_pool_against_a_later_pod_without_being_visited() -> None:
    """Past queueHoldAfterSeconds the gang is visited once (its bound passed) and holds the T4s; a 1-GPU Pod
    queued later is visited and waits behind it, the gang not visited again; as when deciding it again."""
    pol = policy(QUEUE)
    index, waiting = index_of(two_busy_t4s(), pol), Waiting(pol, clock=lambda: START)
    enqueue(members(2, 2, 4, pol, index), index, waiting)
    parking = Parking()
    a_pass(waiting, index, pol, parking, START + 1)
    late = START + pol.defaults.queue_hold_after_seconds
    held = a_pass(waiting, index, pol, parking, late)
    assert held.visits == 1 and f"pool {T4} is held for it" in held.waits[0].reason
    enqueue([small("small", index, pol)], index, waiting)
    decided = a_pass(waiting, index, pol, parking, late + 1)
    assert decided.visits == 1  # the small Pod
    assert outcome(decided) == ({}, {"g-0": "capacity", "g-1": "capacity", "small": "behind"})
    assert answers(decided) == answers(a_pass(waiting, index, pol, None, late + 1))


def test_a_parked_gang_is_answered_as_deciding_it_again_would_after_each_change() -> None:
    """Gang, a later gang and single Pods, through changes of room, members and time: each pass with parking
    answers what a pass without it answers (each pass's releases taken back before the other's)."""
    pol = policy(QUEUE)
    fleet = [*two_busy_t4s(), gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034), busy("l4-a", 4)]
    index, waiting = index_of(fleet, pol), Waiting(pol, clock=lambda: START)
    enqueue([*members(2, 2, 4, pol, index), *members(1, 2, 2, pol, index, name="h")], index, waiting)
    parking = Parking()
    info = lambda obj: pod_from_obj(obj, pol.gpu_resources, pol.partition_prefixes)  # noqa: E731
    steps = [
        lambda: None,
        lambda: index.upsert_pod(info(busy("l4-a", 1))),
        lambda: enqueue([small("small", index, pol)], index, waiting),
        lambda: index.upsert_pod(info(busy("t4-1", 2))),
        lambda: None,
        lambda: index.remove_pod(("other", "busy-t4-0")),
    ]
    for k, step in enumerate(steps):
        step()
        now = START + k * pol.defaults.queue_hold_after_seconds / 2
        with_parking = undone(a_pass(waiting, index, pol, parking, now), index)
        fresh = undone(a_pass(waiting, index, pol, None, now), index)
        assert answers(with_parking) == answers(fresh), k


def group_pod(name: str, group: str, gpus: int, pol: object, index: PoolIndex, created: str) -> dict[str, object]:
    ann = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": group}
    return queued_pod(name, "q", pol, index, annotations=ann, gpus=gpus, created=created)  # type: ignore[arg-type]


def test_pods_of_a_workload_group_stay_parked_and_are_answered_as_deciding_them_again() -> None:
    """Three 4-GPU Pods of group svc and one of group etl (one shape) wait for room: the next pass visits
    none of them (they were decided every pass); after each change (a sibling running on a pool, room
    freeing) a pass with parking answers what one without it answers."""
    pol = policy(QUEUE)
    fleet = [*two_busy_t4s(), gpu_node("l4-a", "NVIDIA-L4", 8, memory_mib=23034), busy("l4-a", 8)]
    index, waiting = index_of(fleet, pol), Waiting(pol, clock=lambda: START)
    pods = [group_pod(f"svc-{k}", "svc", 4, pol, index, f"2026-12-01T09:00:0{k}Z") for k in range(3)]
    enqueue([*pods, group_pod("etl-0", "etl", 4, pol, index, "2026-12-01T09:00:09Z")], index, waiting)
    parking = Parking()
    first = a_pass(waiting, index, pol, parking, START + 1)
    assert first.releases == [] and {w.code for w in first.waits} == {"capacity"}
    steady = a_pass(waiting, index, pol, parking, START + 2)
    assert steady.visits == 0 and answers(steady) == answers(first)
    info = lambda obj: pod_from_obj(obj, pol.gpu_resources, pol.partition_prefixes)  # noqa: E731
    sibling = queued_pod("svc-run", "q", pol, index, annotations={"gpupool.io/group": "svc"}, gpus=1)
    sibling["spec"]["nodeName"] = "l4-a"
    sibling["spec"].pop("schedulingGates", None)
    sibling["metadata"]["annotations"]["gpupool.io/pool"] = "nvidia/medium/NVIDIA-L4"
    sibling["status"] = {"phase": "Running"}
    steps = [
        lambda: index.upsert_pod(info(busy("l4-a", 4))),
        lambda: index.upsert_pod(info(sibling)),
        lambda: None,
        lambda: index.remove_pod(("other", "busy-t4-0")),
    ]
    for k, step in enumerate(steps):
        step()
        with_parking = undone(a_pass(waiting, index, pol, parking, START + 3 + k), index)
        fresh = undone(a_pass(waiting, index, pol, None, START + 3 + k), index)
        assert answers(with_parking) == answers(fresh), k
