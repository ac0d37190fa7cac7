"""Pods being deleted (`metadata.deletionTimestamp` set, kept stored by a finalizer): kube-scheduler never
places one and ResourceQuota stops charging it, so the queue never releases one, it holds no place in
line, and an unbound one holds no room in the pools, for the queue or for `now` admissions. A Pod being
deleted on a node holds its devices until it is gone."""

from __future__ import annotations

import copy
from typing import Any

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.fakes import Events, Inventory, Leading, SlowApi
from tests.queue.helpers import enqueue, queued_pod
from webhook.admission.core import evaluate
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting

POLICY = "namespaces:\n  q: {placement: queue}\n  v: {placement: queue}\n"


def deleting(obj: dict[str, Any]) -> dict[str, Any]:
    """The Pod as the API stores it once deleted while a finalizer keeps it."""
    gone = copy.deepcopy(obj)
    gone["metadata"] |= {
        "finalizers": ["example.com/keep"],
        "deletionTimestamp": "2026-12-01T10:05:00Z",
        "deletionGracePeriodSeconds": 0,
    }
    return gone


def watch(objs: list[dict[str, Any]], index: PoolIndex, waiting: Waiting) -> None:
    """As the watch delivers a modification: into the index and the queue."""
    for obj in objs:
        index.upsert_pod(pod_from_obj(obj, index.policy.gpu_resources, index.policy.partition_prefixes))
        waiting.apply("pods", "MODIFIED", obj)


def now_admits(index: PoolIndex, gpus: int) -> bool:
    """Whether a `now` Pod of another namespace asking for `gpus` T4s is placed on a T4 with room now
    (placed, and not warned that it will wait for a node with free GPUs)."""
    obj = pod("now-job", "n", annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus)})
    verdict = evaluate(obj, "n", index.policy, index)
    return verdict.allowed and not verdict.queued and bool(verdict.patch) and not verdict.warnings


def big(name: str, index: PoolIndex, created: str) -> dict[str, Any]:
    annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": "4"}
    return queued_pod(name, "q", index.policy, index, annotations=annotations, created=created)


def test_queued_pods_being_deleted_are_never_released_and_hold_no_place() -> None:
    """Two queued 4-GPU Pods kept by a finalizer are deleted before their turn: the leader releases neither,
    a later 1-GPU Pod of another namespace is released, and `now` admissions see the T4s free."""
    pol = policy(POLICY)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), gpu_node("t4-b", "Tesla-T4", 4)], pol)
    waiting = Waiting(pol)
    bigs = [big(f"big-{k}", index, f"2026-12-01T10:00:0{k}Z") for k in range(2)]
    victim = queued_pod("victim", "v", pol, index, created="2026-12-01T10:01:00Z")
    enqueue([*bigs, victim], index, waiting)
    watch([deleting(o) for o in bigs], index, waiting)
    pods = {("q", o["metadata"]["name"]): o for o in bigs} | {("v", "victim"): victim}
    events = Events()
    runner = Runner(Inventory(index), waiting, Leading(), SlowApi(pods, together=1), events=events)  # type: ignore[arg-type]

    result = runner.run_pass()

    assert [e.pod for e in events.recorded if e.reason == "Released"] == ["victim"]
    assert result.released == 1
    assert waiting.get(("q", "big-0")) is None and waiting.get(("q", "big-1")) is None
    assert now_admits(index, 4)  # a whole T4 node is free


def test_released_pods_deleted_before_they_are_bound_free_their_room() -> None:
    """Two 4-GPU Pods released but not bound yet are deleted (a finalizer keeps them): their 8 GPUs are free
    for `now` admissions at once."""
    pol = policy(POLICY)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), gpu_node("t4-b", "Tesla-T4", 4)], pol)
    waiting = Waiting(pol)
    bigs = [big(f"big-{k}", index, f"2026-12-01T10:00:0{k}Z") for k in range(2)]
    enqueue(bigs, index, waiting)
    answered: list[dict[str, Any]] = []
    api = SlowApi({("q", o["metadata"]["name"]): o for o in bigs}, together=1)
    release = api.release

    def keep(namespace: str, name: str, patch: list[dict[str, Any]]) -> Any:
        result = release(namespace, name, patch)
        answered.append(result.obj)
        return result

    api.release = keep  # type: ignore[method-assign]
    runner = Runner(Inventory(index), waiting, Leading(), api, events=Events())  # type: ignore[arg-type]
    assert runner.run_pass().released == 2
    assert not now_admits(index, 1)

    watch([deleting(o) for o in answered], index, waiting)

    assert now_admits(index, 4)


def test_a_pod_being_deleted_on_its_node_holds_its_gpus_until_it_is_gone() -> None:
    """A bound, running 4-GPU Pod being deleted still holds its GPUs (its containers are stopping)."""
    pol = policy(POLICY)
    running = pod("train", "n", gpus=4, node="t4-a", phase="Running")
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), running], pol)
    waiting = Waiting(pol)
    assert not now_admits(index, 1)

    watch([deleting(running)], index, waiting)

    assert not now_admits(index, 1)
