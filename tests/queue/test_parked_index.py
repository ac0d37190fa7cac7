"""A pass visits only the parked shapes that something they wait for changed for (webhook.queue.parking's
index by counter): with nothing changed it visits none, room on one pool visits only that pool's shapes, and
the order rules hold for the shapes it does not visit (what they wait for stays theirs; a bound that passes
wakes its shape). Work is counted in the visits the pass returns, never timed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.builders import gpu_node, index_of, policy
from tests.queue.fakes import Events, Inventory, Leading, SlowApi
from tests.queue.helpers import GPU_TOLERATION, enqueue, queued_pod, wait_for
from tests.queue.parkcases import QUEUE, START, T4, a_pass, answers, fleet, large, running, waiting_pods
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue import release as release_module
from webhook.queue import runner as runner_module
from webhook.queue.parking import Parking
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting


def test_a_steady_pass_over_200_parked_shapes_visits_none() -> None:
    """200 large distinct Pods wait for room: the first pass visits (decides) each; the next, with nothing
    changed, visits none of them and answers the same."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    waiting_pods(pol, index, waiting, 200)
    parking = Parking()
    first = a_pass(waiting, index, pol, parking)
    assert first.visits == 200
    again = a_pass(waiting, index, pol, parking)
    assert (again.visits, again.decisions) == (0, 0)
    assert answers(again) == answers(first)


def test_room_on_one_pool_visits_only_the_shapes_that_wait_for_that_pool() -> None:
    """A GPU frees on the T4 node: the next pass visits the 100 T4 shapes, not one of the 100 L4 shapes;
    and the pass after visits none again."""
    pol = policy(QUEUE)
    index = index_of(fleet(), pol)
    waiting = Waiting(pol)
    waiting_pods(pol, index, waiting, 200)
    parking = Parking()
    a_pass(waiting, index, pol, parking)
    index.upsert_pod(pod_from_obj(running("busy-t4", "t4-a", 3), pol.gpu_resources, pol.partition_prefixes))
    decided = a_pass(waiting, index, pol, parking)
    assert decided.visits == 100
    assert a_pass(waiting, index, pol, parking).visits == 0


def test_a_bound_that_passes_wakes_its_shape_and_the_hold_keeps_later_pods_out() -> None:
    """A parked 4-GPU Pod waits for the T4 node (2 free). With nothing changed, the pass once it has waited
    queueHoldAfterSeconds visits it (and only it): it holds the T4s now. A 1-GPU Pod queued after it is
    visited and waits behind it, while the parked big one is not visited again: what it holds stays its."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), running("busy", "t4-a", 2)], pol)
    waiting = Waiting(pol, clock=lambda: START)
    big = large(queued_pod("big", "q", pol, index, gpus=4, tolerations=[GPU_TOLERATION]), "big")
    enqueue([big], index, waiting)
    parking = Parking()
    assert a_pass(waiting, index, pol, parking, now=START).waits[0].code == "capacity"
    early = START + pol.defaults.queue_hold_after_seconds - 1
    assert a_pass(waiting, index, pol, parking, now=early).visits == 0
    late = early + 1
    held = a_pass(waiting, index, pol, parking, now=late)
    assert held.visits == 1
    assert held.waits[0].reason.endswith(f"pool {T4} is held for it")
    small = queued_pod("small", "q2", pol, index, gpus=1, created="2026-12-01T11:00:00Z", tolerations=[GPU_TOLERATION])
    enqueue([small], index, waiting)
    decided = a_pass(waiting, index, pol, parking, now=late)
    assert decided.releases == []
    assert [(w.queued.key, w.code) for w in decided.waits] == [
        (("q", "big"), "capacity"),
        (("q2", "small"), "capacity"),
    ]
    assert decided.visits == 1  # the small one
    assert answers(decided) == answers(a_pass(waiting, index, pol, None, now=late))
    assert a_pass(waiting, index, pol, parking, now=late + 1).visits == 0


def test_a_woken_shape_does_not_take_the_quota_an_unvisited_earlier_one_waits_for() -> None:
    """q may hold 3 medium GPUs and holds 2; an older 2-GPU Pod of q waits for that quota (for the T4s),
    parked. A GPU frees on the L4 node, waking only a younger 1-GPU Pod of q that may go there: it is
    visited, the older one is not, and the younger does not take the quota the older waits for."""
    pol = policy(QUEUE.replace("q: {placement: queue}", "q: {placement: queue, classQuota: {medium: 3}}"))
    index = index_of(fleet(), pol)
    info = lambda obj: pod_from_obj(obj, pol.gpu_resources, pol.partition_prefixes)  # noqa: E731
    index.upsert_pod(info(running("busy-t4", "t4-a", 2)))
    index.upsert_pod(info(running("mine", "t4-a", 2, namespace="q")))
    waiting = Waiting(pol)
    pods = [
        queued_pod(
            name,
            "q",
            pol,
            index,
            gpus=gpus,
            annotations={"gpupool.io/gpu-product": product},
            created=created,
            tolerations=[GPU_TOLERATION],
        )
        for name, gpus, product, created in [
            ("old", 2, "Tesla-T4", "2026-12-01T10:00:00Z"),
            ("young", 1, "NVIDIA-L4", "2026-12-01T10:00:01Z"),
        ]
    ]
    enqueue(pods, index, waiting)
    parking = Parking()
    first = a_pass(waiting, index, pol, parking)
    assert [(w.queued.key[1], w.code) for w in first.waits] == [("old", "quota"), ("young", "capacity")]
    index.upsert_pod(info(running("busy-l4", "l4-a", 3)))
    decided = a_pass(waiting, index, pol, parking)
    assert decided.releases == []
    assert decided.visits == 1
    assert [(w.queued.key[1], w.code) for w in decided.waits] == [("old", "quota"), ("young", "behind")]
    assert answers(decided) == answers(a_pass(waiting, index, pol, None))


def test_the_loop_makes_a_pass_when_a_parked_pods_bound_passes_though_nothing_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 4-GPU Pod waits, parked, for the T4 node (2 free). Nothing changes, so the loop's ticks make no
    pass; once it has waited queueHoldAfterSeconds (the queue's clock), the next tick makes one, and the Pod
    holds the T4s from then on."""
    monkeypatch.setattr(runner_module, "TICK_SECONDS", 0.02)
    passes: list[release_module.Plan] = []
    decide_batch = runner_module.decide_batch

    def counted(*args: Any, **kwargs: Any) -> release_module.Plan:
        passes.append(decide_batch(*args, **kwargs))
        return passes[-1]

    monkeypatch.setattr(runner_module, "decide_batch", counted)
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), running("busy", "t4-a", 2)], pol)
    clock = [START]
    waiting = Waiting(pol, clock=lambda: clock[0])
    big = queued_pod("big", "q", pol, index, gpus=4, tolerations=[GPU_TOLERATION])
    inventory = Inventory(index)
    runner = Runner(inventory, waiting, Leading(), SlowApi({}, 1), events=Events())
    with inventory.read():
        enqueue([big], index, waiting)
    runner.start()
    try:
        assert wait_for(lambda: len(passes) >= 1)
        time.sleep(0.3)  # some 15 ticks
        assert len(passes) == 1 and "held for it" not in passes[0].waits[0].reason
        clock[0] = START + pol.defaults.queue_hold_after_seconds
        assert wait_for(lambda: len(passes) >= 2), "no pass when the bound passed"
        assert passes[1].waits[0].reason.endswith(f"pool {T4} is held for it")
        time.sleep(0.3)
        assert len(passes) == 2  # and none after: the bound is judged
    finally:
        runner.stop()
