"""The queue's pass: which waiting Pods go where now, exactly, in order, and never jumping ahead."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import gpu_node, quota
from tests.queue.helpers import A100, L4, T4, busy, enqueue, fleet, queued_pod, setup
from webhook.domain.model import PoolKey
from webhook.pools.index import PoolIndex
from webhook.queue.release import plan
from webhook.queue.waiting import Waiting


def released(index: PoolIndex, waiting: Waiting) -> dict[str, PoolKey]:
    decided = plan(waiting.ordered(), index, index.policy)
    return {r.queued.key[1]: r.pool for r in decided.releases}


def test_a_medium_pod_goes_to_the_pool_that_has_room_now() -> None:
    """Every T4 busy, an L4 free: the medium Pod waits for no T4, it goes to the L4."""
    index, waiting = setup(fleet(t4_busy=4, l4_busy=3))
    enqueue([queued_pod("job", "q", index.policy, index)], index, waiting)
    assert released(index, waiting) == {"job": L4}


def test_nothing_free_nothing_released_and_the_pod_is_told_why() -> None:
    index, waiting = setup(fleet())
    enqueue([queued_pod("job", "q", index.policy, index)], index, waiting)
    decided = plan(waiting.ordered(), index, index.policy)
    assert decided.releases == []
    ((wait),) = decided.waits
    assert wait.code == "capacity" and "free now" in wait.reason


def test_higher_priority_first_then_older() -> None:
    """One free GPU, three Pods: the higher priority goes; of equal priority the older goes first."""
    index, waiting = setup(fleet(t4_busy=3))
    pods = [
        queued_pod("old-low", "q", index.policy, index, created="2026-12-01T09:00:00Z"),
        queued_pod("new-high", "q", index.policy, index, priority=100, created="2026-12-01T11:00:00Z"),
        queued_pod("newer-low", "q", index.policy, index, created="2026-12-01T10:00:00Z"),
    ]
    enqueue(pods, index, waiting)
    assert released(index, waiting) == {"new-high": T4}


def test_a_pod_that_cannot_go_does_not_block_later_ones() -> None:
    """A 4-GPU medium Pod waits (2 T4s free); a later 1-GPU Pod goes into the T4 room it cannot use now
    (webhook.queue.backfill), and a later high Pod goes to the A100s."""
    index, waiting = setup(fleet(t4_busy=2))
    enqueue(
        [
            queued_pod(
                "big",
                "q",
                index.policy,
                index,
                annotations={"gpupool.io/gpu-count": "4", "gpupool.io/gpu-class": "medium"},
                created="2026-12-01T09:00:00Z",
            ),
            queued_pod("small", "q", index.policy, index, created="2026-12-01T10:00:00Z"),
            queued_pod(
                "high",
                "q2",
                index.policy,
                index,
                annotations={"gpupool.io/gpu-class": "high"},
                created="2026-12-01T11:00:00Z",
            ),
        ],
        index,
        waiting,
    )
    decided = plan(waiting.ordered(), index, index.policy)
    assert {r.queued.key[1]: r.pool for r in decided.releases} == {"small": T4, "high": A100}
    assert {w.queued.key[1]: w.code for w in decided.waits} == {"big": "capacity"}


@pytest.mark.parametrize(
    ("rules", "quotas"),
    [
        ("  q: {placement: queue, classQuota: {medium: 2}}\n", []),
        ("  q: {placement: queue, memoryQuota: 30Gi}\n", []),
        ("  q: {placement: queue}\n", [quota("tutorial", "q", {"nvidia.com/gpu": "2"})]),
        ("  q: {placement: queue}\n", [quota("limits-form", "q", {"limits.nvidia.com/gpu": "2"})]),
    ],
    ids=["class-quota", "memory-quota", "bare-resourcequota", "limits-resourcequota"],
)
def test_every_quota_is_counted_exactly_at_release(rules: str, quotas: list[dict[str, Any]]) -> None:
    """Five Pods queued, room for all: a quota of 2 T4 GPUs (2 x 15Gi within 30Gi) releases exactly 2;
    the others wait for the quota, and later Pods of the namespace wait behind them."""
    index, waiting = setup([gpu_node("t4-a", "Tesla-T4", 8), *quotas], "namespaces:\n" + rules)
    enqueue([queued_pod(f"p{i}", "q", index.policy, index, created=f"2026-12-01T10:0{i}:00Z") for i in range(5)],
            index, waiting)  # fmt: skip
    decided = plan(waiting.ordered(), index, index.policy)
    assert sorted(r.queued.key[1] for r in decided.releases) == ["p0", "p1"]
    assert {w.code for w in decided.waits} <= {"quota", "behind"}
    # The released ones count: a second pass (before the watch shows them) releases nothing more.
    assert plan(waiting.ordered(), index, index.policy).releases == []


def test_the_requests_form_charged_at_creation_is_not_counted_twice() -> None:
    """Kubernetes charged the queued Pods to `requests.nvidia.com/gpu` at creation: used 2 of hard 2 with
    both of them queued must still release both."""
    objects = [gpu_node("t4-a", "Tesla-T4", 8),
               quota("gpus", "q", {"requests.nvidia.com/gpu": "2"}, {"requests.nvidia.com/gpu": "2"})]  # fmt: skip
    index, waiting = setup(objects)
    enqueue([queued_pod(f"p{i}", "q", index.policy, index) for i in range(2)], index, waiting)
    assert len(plan(waiting.ordered(), index, index.policy).releases) == 2


def gang(n: int, index: PoolIndex, size: int = 3) -> list[dict[str, Any]]:
    ann = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "sweep", "gpupool.io/group-size": str(size),
           "gpupool.io/gpu-count": "2"}  # fmt: skip
    return [queued_pod(f"m{i}", "q", index.policy, index, annotations=ann) for i in range(n)]


def test_a_gang_waits_for_all_its_members() -> None:
    index, waiting = setup([gpu_node(f"t4-{i}", "Tesla-T4", 4) for i in range(3)])
    enqueue(gang(2, index), index, waiting)
    decided = plan(waiting.ordered(), index, index.policy)
    assert decided.releases == [] and {w.code for w in decided.waits} == {"gang"}


def test_a_gang_goes_whole_when_all_fit_at_once_and_not_at_all_otherwise() -> None:
    """Three 2-GPU members: room for three at once (two 4-GPU nodes) releases all three to one pool;
    room for two releases none, and nothing is left held."""
    index, waiting = setup([gpu_node(f"t4-{i}", "Tesla-T4", 4) for i in range(2)])
    enqueue(gang(3, index), index, waiting)
    assert released(index, waiting) == {"m0": T4, "m1": T4, "m2": T4}
    index, waiting = setup([gpu_node("t4-0", "Tesla-T4", 4), gpu_node("t4-1", "Tesla-T4", 4), busy("t4-1", 3)])
    enqueue(gang(3, index), index, waiting)
    decided = plan(waiting.ordered(), index, index.policy)
    assert decided.releases == []
    assert sum(s.pending for s in index.capacity.pool_stats()) == 0
