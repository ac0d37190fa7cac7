"""A pass decides a waiting shape again only when something it waits for changed (webhook.queue.parking):
with nothing changed it decides nothing, room on one pool re-decides only the shapes that wait for that
pool, a namespace's quota freeing re-decides its shapes, and what it answers is always what deciding
every shape again would answer (the order rules included). Work is counted in decisions, never timed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from itertools import chain

import pytest

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.fakes import Events, Inventory, Leading, SlowApi
from tests.queue.helpers import enqueue
from tests.queue.parkcases import (
    QUEUE,
    START,
    T4,
    Decisions,
    a_pass,
    answers,
    fleet,
    gpu_pod,
    large,
    queued,
    running,
    show,
    undone,
    waiting_pods,
)
from webhook.admission.pod import read_pod, shape_bytes, shape_digest
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj
from webhook.pools.memo import ENTRY_SHARE, MEMO_BYTES
from webhook.queue.parking import Parking
from webhook.queue.runner import Runner
from webhook.queue.waiting import PODS, Waiting


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> Decisions:
    return Decisions(monkeypatch)


def test_the_test_pods_are_over_what_a_memo_entry_may_weigh() -> None:
    """The shapes of these tests are the ones the memo never keeps (each is decided from scratch without
    parking)."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    obj = large(gpu_pod("big", "q", pol, index, gpus=2), "seed")
    assert shape_bytes(read_pod(obj).shape) > MEMO_BYTES // ENTRY_SHARE


def test_with_nothing_changed_a_pass_over_200_large_distinct_shapes_decides_none(decisions: Decisions) -> None:
    """200 large distinct Pods wait for room; the first pass decides each once, the next (nothing
    changed) decides none, and answers the same."""
    pol, index, waiting, parking = queued(200)
    first = a_pass(waiting, index, pol, parking)
    assert len(decisions.take()) == first.decisions == 200
    again = a_pass(waiting, index, pol, parking)
    assert decisions.take() == [] and again.decisions == 0
    assert answers(again) == answers(first)
    assert len(parking) == 200


def test_room_on_one_pool_decides_again_only_the_shapes_that_wait_for_it(decisions: Decisions) -> None:
    """A GPU frees on the T4 node (not enough for a 2-GPU Pod): the next pass decides again the 100
    shapes that wait for T4s, and none of the 100 that wait for L4s."""
    pol, index, waiting, parking = queued(200)
    a_pass(waiting, index, pol, parking)
    decisions.take()
    show(index, pol, running("busy-t4", "t4-a", 3))
    decided = a_pass(waiting, index, pol, parking)
    again = decisions.take()
    assert len(again) == decided.decisions == 100
    assert all(pools == (T4,) for pools in again)
    assert decided.releases == []


def test_a_running_pods_update_that_frees_nothing_decides_nothing(decisions: Decisions) -> None:
    """The watch shows a running Pod again (a status update: the same GPUs on the same node): no pool's
    room changed, so no shape is decided again."""
    pol, index, waiting, parking = queued(20)
    a_pass(waiting, index, pol, parking)
    decisions.take()
    show(index, pol, running("busy-t4", "t4-a", 4))
    assert a_pass(waiting, index, pol, parking).decisions == 0
    assert decisions.take() == []


def test_room_enough_releases_the_oldest_pod_that_waits_for_it() -> None:
    """The T4 node frees whole: the oldest T4 Pod goes (then the next, as room allows); every L4 Pod
    stays parked."""
    pol, index, waiting, parking = queued(20)
    a_pass(waiting, index, pol, parking)
    index.remove_pod(("other", "busy-t4"))
    decided = a_pass(waiting, index, pol, parking)
    assert [(r.queued.key, r.pool) for r in decided.releases] == [(("q", "p000"), T4), (("q", "p002"), T4)]
    assert decided.decisions == 10  # the 10 T4 shapes; the 10 L4 shapes stayed parked


def test_a_parked_pod_leaves_its_room_until_its_bound_then_holds_it_against_a_later_pod() -> None:
    """A parked 4-GPU Pod waits for the T4 node (2 free). Before its bound a later 1-GPU Pod of another
    shape is released into the room it cannot use (backfill); once the big Pod has waited
    queueHoldAfterSeconds, the parked answer is not taken as it was (the Pod may hold a pool now): it is
    decided again and holds the T4s, and the next 1-GPU Pod waits behind it; exactly as when every shape
    is decided again."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), running("busy", "t4-a", 2)], pol)
    waiting = Waiting(pol, clock=lambda: START)
    big = large(gpu_pod("big", "q", pol, index, gpus=4), "big")
    enqueue([big], index, waiting)
    parking = Parking()
    assert a_pass(waiting, index, pol, parking, now=START).waits[0].code == "capacity"
    small = gpu_pod("small", "q2", pol, index, gpus=1, created="2026-12-01T11:00:00Z")
    enqueue([small], index, waiting)
    early = START + pol.defaults.queue_hold_after_seconds - 1
    decided = a_pass(waiting, index, pol, parking, now=early)
    assert [r.queued.key for r in decided.releases] == [("q2", "small")]
    assert decided.decisions == 1  # the small one; the big one stayed parked
    assert answers(decided) == answers(
        a_pass(waiting, index, pol, None, now=early) if undone(decided, index) else decided
    )
    a_pass(waiting, index, pol, parking, now=early)  # released again: the pass the rest of the test follows
    later = gpu_pod("later", "q2", pol, index, gpus=1, created="2026-12-01T11:01:00Z")
    enqueue([later], index, waiting)
    late = START + pol.defaults.queue_hold_after_seconds
    expected = answers(a_pass(waiting, index, pol, None, now=late))
    decided = a_pass(waiting, index, pol, parking, now=late)
    assert decided.releases == []
    assert [(w.queued.key, w.code) for w in decided.waits] == [
        (("q", "big"), "capacity"),
        (("q2", "later"), "capacity"),
    ]
    assert answers(decided) == expected


def test_a_quota_that_frees_decides_the_namespace_again_and_releases() -> None:
    """Pods wait for their namespace's class quota with room on the pools; nothing changes: they stay
    parked; a Pod of the namespace ends: they are decided again, and the oldest goes."""
    pol = policy(QUEUE.replace("q: {placement: queue}", "q: {placement: queue, classQuota: {medium: 2}}"))
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), running("mine", "t4-a", 2, namespace="q")], pol)
    waiting = Waiting(pol)
    objs = [
        large(
            gpu_pod(f"w{k}", "q", pol, index, gpus=1, created=f"2026-12-01T10:00:0{k}Z"),
            f"w{k}",
        )
        for k in range(3)
    ]
    enqueue(objs, index, waiting)
    parking = Parking()
    first = a_pass(waiting, index, pol, parking)
    assert {w.code for w in first.waits} == {"quota"} and first.releases == []
    assert a_pass(waiting, index, pol, parking).decisions == 0
    index.remove_pod(("q", "mine"))
    decided = a_pass(waiting, index, pol, parking)
    assert [r.queued.key for r in decided.releases] == [("q", "w0"), ("q", "w1")]
    assert decided.decisions == 3


def test_a_new_policy_decides_every_shape_again() -> None:
    pol, index, waiting, parking = queued(6)
    a_pass(waiting, index, pol, parking)
    assert a_pass(waiting, index, pol, parking).decisions == 0
    assert a_pass(waiting, index, policy(QUEUE), parking).decisions == 6


def changes(index: PoolIndex, waiting: Waiting, pol: Policy) -> Iterator[str]:
    """A run of changes of every kind a parked answer reads: room, nodes, labels, quotas, Pods coming."""
    node = lambda obj: node_from_obj(obj, pol.gpu_resources, pol.partition_prefixes)  # noqa: E731
    show(index, pol, running("busy-t4", "t4-a", 4))
    yield "a running Pod is shown again, the same"
    show(index, pol, running("busy-t4", "t4-a", 3))
    yield "a T4 GPU frees"
    show(index, pol, running("busy-l4", "l4-a", 1))
    yield "three L4 GPUs free"
    index.upsert_node(node(gpu_node("l4-b", "NVIDIA-L4", 8, memory_mib=23034)))
    yield "a larger L4 node joins"
    show(index, pol, running("fill-l4b", "l4-b", 8))
    yield "it fills"
    later = gpu_pod("late", "q2", pol, index, gpus=1, created="2026-12-01T12:00:00Z")
    enqueue([later], index, waiting)
    yield "a small Pod of another namespace queues"
    index.remove_pod(("other", "busy-t4"))
    yield "the T4 node frees whole"
    index.upsert_node(node(gpu_node("t4-a", "Tesla-T4", 4, labels={"example.com/rack-0": "t40-0000-".ljust(60, "x")})))
    yield "the T4 node is relabelled"


def test_parked_answers_are_the_answers_of_deciding_every_shape_again() -> None:
    """After each change, a pass with parking answers what a pass deciding every shape answers (both
    over the same index; each pass's releases taken back before the other's)."""
    pol, index, waiting, parking = queued(12)
    for what in chain(["nothing yet"], changes(index, waiting, pol)):  # each change made after the last pass
        with_parking = a_pass(waiting, index, pol, parking)
        undone(with_parking, index)
        fresh = a_pass(waiting, index, pol, None)
        undone(fresh, index)
        assert answers(with_parking) == answers(fresh), what


def test_the_runner_decides_nothing_in_a_pass_over_an_unchanged_queue() -> None:
    """Through the leader's runner: a second pass, woken by a Pod that frees nothing, decides no shape."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    waiting_pods(pol, index, waiting, 30)
    runner = Runner(Inventory(index), waiting, Leading(), SlowApi({}, 1), events=Events())
    assert runner.run_pass().decisions == 30
    waiting.apply(PODS, "MODIFIED", pod("cpu", "other"))
    again = runner.run_pass()
    assert (again.decisions, again.visits) == (0, 0)


def test_equal_shapes_share_a_digest_and_different_ones_do_not() -> None:
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    a = gpu_pod("a", "q", pol, index, gpus=1)
    b = gpu_pod("b", "q", pol, index, gpus=1)
    c = gpu_pod("c", "q", pol, index, gpus=2)
    digests = [shape_digest(read_pod(o).shape) for o in (a, b, c, large(copy.deepcopy(a), "x"))]
    assert read_pod(a).shape == read_pod(b).shape
    assert digests[0] == digests[1]
    assert len(set(digests)) == 3
    assert all(len(d) == 16 for d in digests)


def test_a_request_much_heavier_than_its_shape_is_not_kept_but_its_answer_stays_parked() -> None:
    """Pods of 1,024 long tolerations (their request builds its own index of them, as heavy as the shape)
    and Pods of a large node affinity (whose request shares the shape's terms): only the latter's
    requests are kept, and neither shape is decided again while nothing changes."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    objs = []
    for k in range(3):
        tolerations = [
            {"key": f"example.com/t{k}-{i:04d}-".ljust(200, "x"), "operator": "Equal", "value": "v" * 63}
            for i in range(1023)
        ]
        objs.append(gpu_pod(f"tol{k}", "q", pol, index, gpus=2, tolerations=tolerations))
        objs.append(large(gpu_pod(f"aff{k}", "q", pol, index, gpus=2), f"a{k}"))
    enqueue(objs, index, waiting)
    parking = Parking()
    assert a_pass(waiting, index, pol, parking).decisions == 6
    assert parking.requests == 3
    assert a_pass(waiting, index, pol, parking).decisions == 0
