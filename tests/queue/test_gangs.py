"""A gang in the queue is judged whole: one that cannot go now leaves the room to others until it has
waited long, one that can never go is parked holding nothing, and one partly released is completed on
its siblings' pool, which is held for it."""

from __future__ import annotations

from tests.builders import gpu_node, index_of, policy
from tests.queue.gangcases import (
    QUEUE,
    START,
    members,
    outcome,
    small,
    two_busy_t4s,
)
from tests.queue.helpers import L4, T4, busy, enqueue, queued_pod
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue.release import plan, settle
from webhook.queue.waiting import Waiting


def test_a_gang_that_cannot_go_now_leaves_the_room_it_cannot_use_to_the_pods_behind_it() -> None:
    """Two 4-GPU members with 2 free GPUs per node wait; a later 1-GPU Pod of another namespace goes into
    the room the gang cannot use yet instead of waiting behind it."""
    pol = policy(QUEUE)
    index, waiting = index_of(two_busy_t4s(), pol), Waiting(pol, clock=lambda: START)
    enqueue([*members(2, 2, 4, pol, index), small("small", index, pol)], index, waiting)
    released, waits = outcome(plan(waiting.ordered(), index, pol, now=START + 1))
    assert released == {"small": T4}
    assert waits == {"g-0": "capacity", "g-1": "capacity"}


def test_a_gang_that_has_waited_long_holds_the_pool_closest_to_fitting_it() -> None:
    """The bounded wait: past defaults.queueHoldAfterSeconds the gang holds its pool, and the later Pod waits
    behind it; the gang is told so."""
    pol = policy(QUEUE)
    index, waiting = index_of(two_busy_t4s(), pol), Waiting(pol, clock=lambda: START)
    enqueue([*members(2, 2, 4, pol, index), small("small", index, pol)], index, waiting)
    decided = plan(waiting.ordered(), index, pol, now=START + pol.defaults.queue_hold_after_seconds)
    released, waits = outcome(decided)
    assert released == {} and waits == {"g-0": "capacity", "g-1": "capacity", "small": "behind"}
    assert f"pool {T4} is held for it" in decided.waits[0].reason


def test_a_gang_over_a_quota_lowered_after_admission_is_parked_naming_the_quota_and_holding_nothing() -> None:
    """Admitted under classQuota medium 8, the quota is then lowered to 4: the gang of five can never go.
    It is parked saying so (not blaming room), and a 1-GPU Pod of another namespace goes."""
    objects = [gpu_node("t4-0", "Tesla-T4", 8), busy("t4-0", 2)]
    before = policy("namespaces:\n  q: {placement: queue, classQuota: {medium: 8}}\n  q2: {placement: queue}\n")
    pods = [*members(5, 5, 1, before, index_of(objects, before)), small("small", index_of(objects, before), before)]
    pol = policy("namespaces:\n  q: {placement: queue, classQuota: {medium: 4}}\n  q2: {placement: queue}\n")
    index, waiting = index_of(objects, pol), Waiting(pol, clock=lambda: START)
    enqueue(pods, index, waiting)
    decided = plan(waiting.ordered(), index, pol, now=START + 2 * pol.defaults.queue_hold_after_seconds)
    released, waits = outcome(decided)
    assert released == {"small": T4}
    assert set(waits.values()) == {"parked"}
    reason = decided.waits[0].reason
    assert "class quota medium" in reason and "hard 4" in reason and "room" not in reason


def test_a_gang_whose_nodes_went_away_is_parked_naming_the_room() -> None:
    """Admitted with two 4-GPU nodes for its two 4-GPU members; one node is gone: parked, holding nothing."""
    both = [gpu_node("t4-0", "Tesla-T4", 4), gpu_node("t4-1", "Tesla-T4", 4)]
    pol = policy(QUEUE)
    pods = members(2, 2, 4, pol, index_of(both, pol))
    index, waiting = index_of([both[0], busy("t4-0", 1)], pol), Waiting(pol, clock=lambda: START)
    enqueue([*pods, small("small", index, pol)], index, waiting)
    decided = plan(waiting.ordered(), index, pol, now=START + 2 * pol.defaults.queue_hold_after_seconds)
    released, waits = outcome(decided)
    assert released == {"small": T4} and waits == {"g-0": "parked", "g-1": "parked"}
    assert "could ever hold" in decided.waits[0].reason


def test_a_gang_left_half_released_is_completed_on_its_siblings_pool_which_is_held_for_it() -> None:
    """Four 2-GPU members; a leader released g-0 and g-1 to the T4s and stopped, and a Pod placed `now`
    took the rest of the T4s' room. The next pass keeps the room the T4s free for g-2 and g-3 (a later
    Pod waits behind them), sends them to no other pool (the L4 is free), and completes the gang once the
    room is back."""
    nodes = [gpu_node("t4-0", "Tesla-T4", 4), gpu_node("t4-1", "Tesla-T4", 4),
             gpu_node("l4-0", "NVIDIA-L4", 8, memory_mib=23034)]  # fmt: skip
    pol = policy(QUEUE)
    index, waiting = index_of(nodes, pol), Waiting(pol, clock=lambda: START)
    gang = members(4, 4, 2, pol, index)
    enqueue(gang, index, waiting)
    first = plan(waiting.ordered(), index, pol, now=START)
    assert {r.pool for r in first.releases} == {T4} and len(first.releases) == 4
    for release in first.releases[2:]:  # two of four PATCHes reached the API
        settle(index, release, None)
    now_pod = busy("t4-1", 3, name="now")  # 1 GPU left: room for `later`, not for g-2 and g-3
    index.upsert_pod(pod_from_obj(now_pod, pol.gpu_resources, pol.partition_prefixes))
    rest = [q for q in waiting.ordered() if q.key[1] in ("g-2", "g-3")]
    enqueue([queued_pod("later", "q2", pol, index, annotations={"gpupool.io/gpu-class": "medium",
             "gpupool.io/gpu-product": "Tesla-T4"}, created="2026-12-01T10:00:00Z")], index, waiting)  # fmt: skip
    later = [q for q in waiting.ordered() if q.key[1] == "later"]
    decided = plan(rest + later, index, pol, now=START + 1)
    released, waits = outcome(decided)
    assert released == {}
    assert waits == {"g-2": "repair", "g-3": "repair", "later": "behind"}
    assert "2 of 4 Pods released already" in decided.waits[0].reason
    index.remove_pod(("other", "now-t4-1"))
    released, _ = outcome(plan(rest, index, pol, now=START + 2))
    assert released == {"g-2": T4, "g-3": T4}
    assert L4 not in released.values()
