"""What the queue would do now, without doing it: the leader's own pass, every release taken back, and a
Pod about to be queued put in its place in the order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch

from tests.builders import gpu_node, pod
from tests.queue.helpers import A100, GPU_TOLERATION, L4, QUEUE, T4, enqueue, fleet, queued_pod, setup
from webhook.admission.core import evaluate
from webhook.pools.charges import Charge
from webhook.pools.index import PoolIndex
from webhook.pools.quotas.report import quota_rows
from webhook.queue.preview import STAND_IN, arriving, preview
from webhook.queue.release import plan
from webhook.queue.waiting import Queued, Waiting

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def counted(index: PoolIndex) -> tuple[Any, ...]:
    """Everything a decision reads that a release changes: per pool, free and held devices; per quota,
    used and pending; which Pods wait."""
    pools = sorted((str(s.pool), s.gpus_free, s.gpus_allocated, s.pending) for s in index.capacity.pool_stats())
    quotas = [(r.namespace, r.quota, r.resource, r.used, r.pending) for r in quota_rows(index, index.policy, None)]
    return (pools, quotas, sorted(k for k in index.usage.pod_keys() if index.usage.is_queued(k)))


def outcomes(found: list[Any]) -> list[tuple[str, int, str]]:
    """(name, position, pool released to or the wait's code) of each Pod."""
    return [(o.queued.key[1], o.position, str(o.release.pool) if o.release else o.wait.code) for o in found]


def about_to_queue(
    index: PoolIndex, waiting: Waiting, name: str = "new", annotations: dict[str, str] | None = None, priority: int = 0
) -> Queued:
    """A Pod admission queues now in namespace q, as `gpupool explain` puts it in the queue."""
    obj = pod(name, "q", annotations=annotations or {"gpupool.io/gpu-class": "medium"})
    obj["spec"]["priority"] = priority
    verdict = evaluate(obj, "q", index.policy, index)
    assert verdict.queued, verdict.message
    patched = jsonpatch.apply_patch(obj, list(verdict.patch))
    taken = index.usage.pod_keys() | {q.key for q in waiting.ordered()}
    found = arriving(patched, "q", index.policy, NOW, taken)
    assert found is not None
    return found


def test_the_preview_is_the_leaders_pass_and_leaves_the_index_as_it_was() -> None:
    """Two Pods waiting for one free L4 (the older goes), one for the A100s: the preview says what `plan`
    says on the same cluster, in release order; the index counts what it counted before, so the same
    preview again gives the same answer and a real pass after it still releases them."""
    index, waiting = setup(fleet(t4_busy=4, l4_busy=3))
    enqueue([queued_pod("old", "q", index.policy, index, created="2026-12-01T09:00:00Z"),
             queued_pod("new", "q", index.policy, index, created="2026-12-01T10:00:00Z"),
             queued_pod("high", "q2", index.policy, index, annotations={"gpupool.io/gpu-class": "high"},
                        created="2026-12-01T11:00:00Z")], index, waiting)  # fmt: skip
    before = counted(index)
    found = preview(waiting.ordered(), index, index.policy)
    assert outcomes(found) == [("old", 1, str(L4)), ("new", 2, "capacity"), ("high", 3, str(A100))]
    assert counted(index) == before
    assert outcomes(preview(waiting.ordered(), index, index.policy)) == outcomes(found)
    decided = plan(waiting.ordered(), index, index.policy)
    assert {r.queued.key[1]: r.pool for r in decided.releases} == {"old": L4, "high": A100}
    assert {w.queued.key[1]: w.code for w in decided.waits} == {"new": "capacity"}


def test_a_release_says_the_constraints_it_adds() -> None:
    index, waiting = setup(fleet(t4_busy=3))
    enqueue([queued_pod("job", "q", index.policy, index)], index, waiting)
    (only,) = preview(waiting.ordered(), index, index.policy)
    assert only.release is not None and only.release.pool == T4
    assert only.constraints == "gpu.accelerator/class=medium, nvidia.com/gpu.product=Tesla-T4"


def test_a_charge_holds_its_room_for_the_preview_only_while_it_counts() -> None:
    """The last free T4 charged to a Pod naming node t4-a that the index does not hold: the preview's pass
    counts it as the leader's does, so the queued Pod waits for capacity; the charge is taken back after
    (the index counts what it did), and one that has expired counts no more."""
    index, waiting = setup(fleet(t4_busy=3))
    enqueue([queued_pod("job", "q", index.policy, index)], index, waiting)
    before = counted(index)
    charges = [Charge("other", "charged", "t4-a", (("nvidia.com/gpu", 1),), expires=1000.0)]
    found = preview(waiting.ordered(), index, index.policy, now=999.0, charges=charges, made=5.0)
    assert outcomes(found) == [("job", 1, "capacity")]
    assert counted(index) == before
    found = preview(waiting.ordered(), index, index.policy, now=1000.0, charges=charges, made=5.0)
    assert outcomes(found) == [("job", 1, str(T4))]


def test_a_pod_about_to_queue_takes_its_place_by_priority_then_age() -> None:
    """One free T4, one Pod waiting for it: a new Pod of the same priority comes after it and would wait
    for room; one of higher priority comes first and would take the T4, the other then waiting. The
    new Pod is not left in the index."""
    index, waiting = setup(fleet(t4_busy=3))
    enqueue([queued_pod("waiting", "q", index.policy, index, created="2026-12-01T09:00:00Z")], index, waiting)
    before = counted(index)
    same = about_to_queue(index, waiting)
    found = preview(waiting.ordered(), index, index.policy, extra=[same])
    assert outcomes(found) == [("waiting", 1, str(T4)), ("new", 2, "capacity")]
    assert found[1].wait is not None and "no node of" in found[1].wait.reason
    urgent = about_to_queue(index, waiting, priority=1000)
    assert outcomes(preview(waiting.ordered(), index, index.policy, extra=[urgent])) == [
        ("new", 1, str(T4)),
        ("waiting", 2, "capacity"),
    ]
    assert counted(index) == before


def test_a_pod_about_to_queue_waits_for_the_quota_the_pods_before_it_take() -> None:
    """classQuota medium 2 and two Pods queued before it, room for all: they would take the quota, and
    the new Pod would wait for it."""
    index, waiting = setup(
        [gpu_node("t4-a", "Tesla-T4", 8)], "namespaces:\n  q: {placement: queue, classQuota: {medium: 2}}\n"
    )
    enqueue([queued_pod(f"p{i}", "q", index.policy, index) for i in range(2)], index, waiting)
    found = preview(waiting.ordered(), index, index.policy, extra=[about_to_queue(index, waiting)])
    assert outcomes(found)[-1] == ("new", 3, "quota")


def test_a_pod_about_to_queue_counts_as_created_now_with_its_own_priority() -> None:
    index, waiting = setup(fleet())
    new = about_to_queue(index, waiting, priority=7)
    assert (new.key, new.priority, new.created, new.info.queued) == (("q", "new"), 7, "2026-12-01T12:00:00Z", True)
    assert new.age(NOW + timedelta(minutes=5)) == 300.0


def test_a_pod_about_to_queue_never_stands_for_a_pod_of_the_same_name() -> None:
    """A Pod of the same name already runs (explain of a manifest that was applied): the one about to
    queue gets a stand-in key, so the running Pod keeps counting and is not replaced for the preview."""
    running = pod("job", "q", gpus=3, node="t4-a", phase="Running", tolerations=[GPU_TOLERATION])
    index, waiting = setup([gpu_node("t4-a", "Tesla-T4", 4), running], QUEUE)
    before = counted(index)
    new = about_to_queue(index, waiting, name="job")
    assert new.key == ("q", "job" + STAND_IN)
    (only,) = preview(waiting.ordered(), index, index.policy, extra=[new])
    assert only.release is not None and only.release.pool == T4  # the running Pod's 3 GPUs still count
    assert counted(index) == before


def test_the_pod_that_completes_a_gang_would_release_it_whole() -> None:
    """Two members of a gang of three wait for the third; with the third about to queue, all three would
    be released together to one pool."""
    index, waiting = setup([gpu_node(f"t4-{i}", "Tesla-T4", 4) for i in range(3)], QUEUE)
    ann = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "sweep", "gpupool.io/group-size": "3"}
    enqueue([queued_pod(f"m{i}", "q", index.policy, index, annotations=ann) for i in range(2)], index, waiting)
    found = preview(waiting.ordered(), index, index.policy)
    assert [o.wait.code if o.wait else None for o in found] == ["gang", "gang"]
    assert found[0].wait is not None and "group sweep: 2 of 3 Pods exist" in found[0].wait.reason
    third = about_to_queue(index, waiting, annotations=ann)
    assert {
        o.release.pool if o.release else None for o in preview(waiting.ordered(), index, index.policy, extra=[third])
    } == {T4}
