"""A pass of the queue is proportional to what changed (webhook/queue/standing.py): with nothing changed for
the queue it walks no waiting Pod, with Pods arrived behind the last pass it walks those only, and the
Waits, the Events, the pools' and namespaces' statuses and the backlog come out as a pass over the whole
queue gives them, after arrivals, departures and changes. Work is counted (`walked`, a look-up that fails
if called), never timed."""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.fakes import Events, Inventory, Leading
from tests.queue.helpers import GPU_TOLERATION, MIXED, QUEUE, busy, enqueue, fleet, queued_pod
from tests.queue.parkcases import a_pass, from_scratch
from webhook.domain.model import PodKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj
from webhook.queue import status as status_module
from webhook.queue.outcomes import PassResult
from webhook.queue.release import Plan, Wait
from webhook.queue.runner import Runner
from webhook.queue.standing import Standing
from webhook.queue.status import StatusFeed
from webhook.queue.telling import GANG_EVENTS
from webhook.queue.waiting import Waiting
from webhook.sources.writes import Released, ReleaseResult

SEEDS = [*range(6), 127, 903]
Answer = dict[PodKey, tuple[str, str, tuple[Any, ...]]]


def by_pod(waits: list[Wait]) -> Answer:
    return {w.queued.key: (w.code, w.reason, w.pools) for w in waits}


class Api:
    """Releases every Pod it is asked to, and keeps it as released (what the watch shows next)."""

    def __init__(self, pods: dict[PodKey, dict[str, Any]]) -> None:
        self.pods = pods

    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        self.pods[(namespace, name)] = jsonpatch.apply_patch(copy.deepcopy(self.pods[(namespace, name)]), patch)
        return Released(self.pods[(namespace, name)])

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))


class Sink:
    def __init__(self) -> None:
        self.queues: list[dict[str, dict[str, Any]]] = []

    def publish(self, wanted: Mapping[str, dict[str, Any]]) -> None:
        return None

    def publish_queues(self, wanted: Mapping[str, dict[str, Any]]) -> None:
        self.queues.append(dict(wanted))

    def forget(self) -> None:
        return None


class Queue:
    """A full fleet (T4 and L4 busy, the A100 free), Pods queued for a medium GPU, and a leader's runner."""

    def __init__(self, text: str = QUEUE, objects: list[dict[str, Any]] | None = None) -> None:
        self.pol: Policy = policy(text)
        self.index: PoolIndex = index_of(objects if objects is not None else fleet(), self.pol)
        self.mono = [1000.0]
        self.waiting = Waiting(self.pol, clock=lambda: self.mono[0])
        self.objs: dict[PodKey, dict[str, Any]] = {}
        self.events = Events()
        self.inventory = Inventory(self.index)
        self.runner = Runner(self.inventory, self.waiting, Leading(), Api(self.objs), events=self.events)  # type: ignore[arg-type]

    def queue(self, name: str, minute: int, **kw: Any) -> dict[str, Any]:
        created = f"2026-12-01T10:{minute:02d}:00Z"
        obj = queued_pod(name, kw.pop("namespace", "q"), self.pol, self.index, created=created, **kw)
        self.objs[(obj["metadata"]["namespace"], name)] = obj
        enqueue([obj], self.index, self.waiting)
        return obj

    def show(self, obj: dict[str, Any], event: str = "MODIFIED") -> None:
        """The watch shows a Pod: in the index first, then the queue (as the inventory's Observer does)."""
        info = pod_from_obj(obj, self.pol.gpu_resources, self.pol.partition_prefixes)
        if event == "DELETED":
            self.index.remove_pod((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        else:
            self.index.upsert_pod(info)
        self.waiting.apply("pods", event, obj)

    def whole(self) -> Answer:
        """What a pass over the whole queue, from scratch (no parking, no standing), answers now."""
        return by_pod(from_scratch(self.waiting, self.index, self.pol, self.waiting.now()).waits)

    def told(self) -> list[tuple[str, str]]:
        told = [(e.pod, e.reason) for e in self.events.recorded]
        self.events.recorded.clear()
        return told


def unrelated_change(queue: Queue, name: str = "elsewhere") -> None:
    """A GPU Pod starts on the A100 node, a pool no waiting Pod may use: the index changes, no Pod's answer."""
    queue.show(pod(name, "other", gpus=1, node="a100-a", phase="Running", tolerations=[GPU_TOLERATION]), "ADDED")


def test_a_pass_with_nothing_changed_for_the_queue_walks_no_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """30 Pods of 3 shapes wait; the first pass takes one step per shape (the rest of each shape's Pods wait
    with its first: webhook/queue/lines.py), and lists and tells all 30. A GPU Pod starts where none of them
    may go: the next pass walks none (the queue is not even listed), tells nothing again, and its Waits are
    the whole queue's."""
    queue = Queue()
    for k in range(30):
        queue.queue(f"p{k:02d}", k, gpus=1 + k % 3)
    first = queue.runner.run_pass()
    assert (first.walked, len(first.waiting)) == (3, 30)
    assert len(queue.told()) == 30
    unrelated_change(queue)

    def listed() -> None:
        raise AssertionError("a steady pass listed the whole queue")

    monkeypatch.setattr(queue.waiting, "ordered", listed)
    monkeypatch.setattr(queue.waiting, "lines", listed)
    again = queue.runner.run_pass()
    assert (again.walked, again.visits, again.decisions) == (0, 0, 0)
    assert queue.told() == []
    monkeypatch.undo()
    assert by_pod(again.waiting) == by_pod(first.waiting) == queue.whole()


def test_pods_that_arrive_behind_the_queue_are_the_only_ones_walked_and_leave_the_earlier_ones_what_they_hold() -> None:
    """A 4-GPU Pod of q has waited long for the T4 node (2 free): it holds that node. A 1-GPU Pod of q2 for
    a T4 arrives behind it: that pass walks it alone, and it does not take the room the older one holds (the
    held node is kept from it: no room), as a pass over the whole queue decides."""
    queue = Queue(objects=fleet(t4_busy=2))
    queue.queue("big", 0, gpus=4, annotations={"gpupool.io/gpu-product": "Tesla-T4"})
    assert [w.code for w in queue.runner.run_pass().waiting] == ["capacity"]
    queue.mono[0] += queue.pol.defaults.queue_hold_after_seconds
    (held,) = queue.runner.run_pass().waiting
    assert held.reason.endswith("is held for it")
    queue.runner.run_pass()  # the hold kept a node from new Pods, a change of the index: decided whole once more
    queue.told()
    queue.queue("small", 1, gpus=1, namespace="q2", annotations={"gpupool.io/gpu-product": "Tesla-T4"})
    went_on = queue.runner.run_pass()
    assert (went_on.walked, went_on.released) == (1, 0)
    assert by_pod(went_on.waiting)[("q2", "small")][0] == "capacity"
    assert by_pod(went_on.waiting) == queue.whole()
    assert queue.told() == [("small", "Queued")]


def test_a_pod_queued_beside_a_job_s_waiting_pods_is_walked_alone() -> None:
    """Three Pods of a Job wait in q (a workload group's answer reads what its namespace holds). A Pod
    queued in q behind them holds nothing while it waits, so what q holds is as it was: the pass walks
    the new Pod alone, and the Job's Pods wait as a pass over the whole queue has them."""
    queue = Queue()
    for k in range(3):
        queue.queue(f"job-{k}", k, gpus=2, annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/group": "job"})
    assert queue.runner.run_pass().walked == 3
    queue.queue("alone", 10, gpus=1)
    went_on = queue.runner.run_pass()
    assert went_on.walked == 1
    assert by_pod(went_on.waiting) == queue.whole()


def test_a_waiting_pod_whose_status_alone_changes_is_not_walked_again() -> None:
    """kube-scheduler marks each gated Pod SchedulingGated (a new resourceVersion, nothing gpupool reads):
    the pass walks no Pod; a change of what it asks for (its priority) makes it decide the whole queue."""
    queue = Queue()
    objs = [queue.queue(f"p{k}", k, gpus=1) for k in range(3)]
    queue.runner.run_pass()
    objs[1]["metadata"]["resourceVersion"] = "101"
    objs[1]["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    queue.show(objs[1])
    assert queue.runner.run_pass().walked == 0
    objs[1]["spec"]["priority"] = 5
    queue.show(objs[1])
    changed = queue.runner.run_pass()
    assert changed.walked == 1  # the whole queue: one shape, whose first Pod waits
    assert by_pod(changed.waiting) == queue.whole()


def test_a_node_that_joins_makes_the_pass_decide_the_whole_queue() -> None:
    """A new node changes the pools' structure, which forgets every parked answer (no single counter moved):
    the next pass decides the whole queue, and releases to the new node's room."""
    queue = Queue()
    for k in range(4):
        queue.queue(f"p{k}", k, gpus=1, annotations={"gpupool.io/gpu-product": "NVIDIA-L4"})
    assert queue.runner.run_pass().walked == 1  # one shape: its first Pod waits, the others with it
    node = gpu_node("l4-b", "NVIDIA-L4", 4, memory_mib=23034)
    queue.index.upsert_node(node_from_obj(node, queue.pol.gpu_resources, queue.pol.partition_prefixes))
    joined = queue.runner.run_pass()
    assert (joined.walked, joined.released, joined.waiting) == (4, 4, [])


def test_a_member_that_arrives_for_a_gang_judged_before_is_decided_with_its_gang() -> None:
    """A gang of 2 is released whole; one member ends and its replacement is queued behind every Pod: the
    gang was judged by the pass before, so the pass decides the whole queue, and the replacement goes to
    its gang's pool (or waits there) rather than being passed over as judged already."""
    queue = Queue(objects=fleet(t4_busy=2))
    gang = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "sweep", "gpupool.io/group-size": "2"}
    members = [queue.queue(f"g-{i}", 0, gpus=1, annotations=gang) for i in range(2)]
    assert queue.runner.run_pass().released == 2
    for obj in members:
        queue.show(queue.objs[(obj["metadata"]["namespace"], obj["metadata"]["name"])])  # released, shown
    queue.show(queue.objs.pop(("q", "g-1")), "DELETED")
    queue.queue("g-2", 1, gpus=1, annotations=gang)
    replaced = queue.runner.run_pass()
    assert (replaced.released, replaced.waiting) == (1, [])
    assert ("g-2", "Released") in queue.told()


def test_a_pod_of_a_workload_group_that_has_waited_long_is_decided_again() -> None:
    """Two 4-GPU Pods of one Job (one shape, one group) wait for the T4 node (2 free), the second queued
    later. Once the first has waited queueHoldAfterSeconds, the next pass (after a change none of them reads)
    decides the whole queue, and the first holds the T4s, as a pass over the whole queue decides."""
    queue = Queue(objects=fleet(t4_busy=2))
    job = {"gpupool.io/gpu-product": "Tesla-T4", "gpupool.io/group": "job"}
    queue.queue("job-0", 0, gpus=4, annotations=job)
    queue.runner.run_pass()
    hold = queue.pol.defaults.queue_hold_after_seconds
    queue.mono[0] += hold / 2
    queue.queue("job-1", 1, gpus=4, annotations=job)
    queue.runner.run_pass()
    queue.mono[0] += hold / 2
    unrelated_change(queue)
    held = queue.runner.run_pass()
    assert held.walked == 2
    assert by_pod(held.waiting)[("q", "job-0")][1].endswith("is held for it")
    assert by_pod(held.waiting) == queue.whole()


def test_waits_and_events_stay_a_whole_pass_s_after_arrivals_departures_and_changes() -> None:
    """Pod by Pod, after each change, the runner's Waits are those of a pass over the whole queue from
    scratch, and each Pod is told it waits once (again only when it is created anew), released once."""
    queue = Queue()
    objs = [queue.queue(f"p{k}", k, gpus=1 + k % 2) for k in range(6)]
    assert queue.runner.run_pass().walked == 2  # a step per shape: its first Pod waits, and the rest with it
    assert sorted(queue.told()) == [(f"p{k}", "Queued") for k in range(6)]

    steps: list[tuple[str, int]] = []

    def check(result: PassResult, what: str) -> None:
        assert by_pod(result.waiting) == queue.whole(), what
        steps.append((what, result.walked))

    queue.queue("late", 30, gpus=2)  # behind every Pod
    check(queue.runner.run_pass(), "arrived behind")
    assert queue.told() == [("late", "Queued")]
    queue.show(objs[2], "DELETED")  # a waiting Pod leaves from the middle
    check(queue.runner.run_pass(), "left")
    unrelated_change(queue)
    check(queue.runner.run_pass(), "nothing for the queue")
    objs[4]["spec"]["priority"] = 10  # it goes ahead of every other
    objs[4]["metadata"]["resourceVersion"] = "101"
    queue.show(objs[4])
    check(queue.runner.run_pass(), "changed")
    assert queue.waiting.ordered()[0].key == ("q", "p4")
    queue.queue("early", 0, gpus=1, namespace="q2")  # older than most: among the Pods walked before
    check(queue.runner.run_pass(), "arrived among them")
    assert queue.told() == [("early", "Queued")]  # and none of the Pods walked again
    again = dict(objs[2], metadata={**objs[2]["metadata"], "uid": "uid-q-p2-again"})
    again["metadata"]["creationTimestamp"] = "2026-12-01T10:40:00Z"
    queue.objs[("q", "p2")] = again
    queue.show(again, "ADDED")  # created anew, with a new uid, behind every Pod
    check(queue.runner.run_pass(), "created anew")
    assert queue.told() == [("p2", "Queued")]
    queue.show(busy("t4-a", 4), "DELETED")  # the T4 node frees: the first Pods go
    released = queue.runner.run_pass()
    assert released.released > 0
    names = sorted(e[0] for e in queue.told() if e[1] == "Released")
    assert len(names) == released.released
    assert names == ["early", "p0", "p2", "p4"]  # p1 (2 GPUs) waits for room; p2 (1 GPU) backfills
    for key in [("q", "p0"), ("q", "p2"), ("q", "p4"), ("q2", "early")]:
        queue.show(queue.objs[key])  # the watch shows the release
    check(queue.runner.run_pass(), "released")
    walked = dict(steps)
    assert [walked[w] for w in ("arrived behind", "nothing for the queue", "created anew")] == [1, 0, 1]
    # a pass over the whole queue: a step per shape (1 and 2 GPUs of q, then 1 GPU of q2 too)
    assert walked["left"] == walked["changed"] == 2 and walked["arrived among them"] == 3
    assert queue.told() == []


def test_the_statuses_are_worked_out_again_only_when_the_waits_or_the_queue_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The namespaces' summaries come from the Waits and the positions in the queue: published again as
    they were while neither moved (nothing worked out), and with the new positions once a Pod ahead left."""
    queue = Queue()
    objs = [queue.queue(f"p{k}", k) for k in range(3)]
    standing = Standing()
    standing.took(Plan([], a_pass(queue.waiting, queue.index, queue.pol, None).waits), None, whole=False)
    sink = Sink()
    clock = [0.0]
    feed = StatusFeed(sink, clock=lambda: clock[0])
    worked: list[int] = []
    summaries = status_module.namespace_summaries
    monkeypatch.setattr(status_module, "namespace_summaries", lambda *a: worked.append(1) or summaries(*a))
    feed.passed(standing, queue.waiting)
    feed.look(True, queue.inventory.read)
    clock[0] += 1
    feed.passed(standing, queue.waiting)
    feed.look(True, queue.inventory.read)
    assert (len(sink.queues), len(worked)) == (2, 1)
    queue.show(objs[0], "DELETED")
    standing.took(Plan([], a_pass(queue.waiting, queue.index, queue.pol, None).waits), None, whole=False)
    clock[0] += 1
    feed.passed(standing, queue.waiting)
    feed.look(True, queue.inventory.read)
    pods = yaml.safe_load(sink.queues[-1]["q"]["pods.yaml"])
    assert [(p["pod"], p["position"]) for p in pods] == [("p1", 1), ("p2", 2)]
    assert len(worked) == 2


# 127: a group Pod whose bound passed; 903: an answer taken, then woken by a release later in that pass
@pytest.mark.parametrize("seed", SEEDS)
def test_any_sequence_of_changes_leaves_the_waits_and_events_of_a_whole_pass(seed: int) -> None:
    """Pods of two namespaces (one with a class quota; some of a gang of 2, some of a workload group that is
    not a gang) arrive behind the queue or among it, leave, change
    priority, are released and shown released; room comes and goes on the T4 and L4 nodes, a Pod starts
    on the A100, time passes queueHoldAfterSeconds. Every pass of the runner releases as many Pods and
    leaves the same Waits as a pass over the whole queue from scratch on the same index; every waiting Pod
    was told it waits, and none twice."""
    rng = random.Random(seed)
    text = QUEUE.replace("q2: {placement: queue}", "q2: {placement: queue, classQuota: {medium: 3}}")
    queue = Queue(text)
    products = MIXED
    told: dict[tuple[str, str, str], int] = {}
    minute = 0
    for step in range(60):
        waiting = [q.key for q in queue.waiting.ordered()]
        roll = rng.random()
        if roll < 0.4 or not waiting:
            minute = min(minute + 1, 59) if rng.random() < 0.7 else rng.randrange(minute + 1)
            annotations = rng.choice(products)
            kw = {"annotations": annotations} if annotations else {}
            gang = bool(annotations and "gpupool.io/group-size" in annotations)  # of q, one GPU each: never refused
            gpus, namespace = (1, "q") if gang else (rng.randint(1, 3), rng.choice(["q", "q2"]))
            queue.queue(f"p{step}", minute, gpus=gpus, namespace=namespace, **kw)
        elif roll < 0.55:  # a waiting Pod, or one released, leaves
            queue.show(queue.objs.pop(rng.choice(waiting if rng.random() < 0.7 else sorted(queue.objs))), "DELETED")
        elif roll < 0.65:  # its priority changes (or, by chance, only its resourceVersion)
            obj = queue.objs[rng.choice(waiting)]
            obj["spec"]["priority"] = rng.choice([obj["spec"].get("priority", 0), rng.randint(0, 5)])
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            queue.show(obj)
        elif roll < 0.8:
            node = rng.choice(["t4-a", "l4-a"])
            gpus = rng.randint(0, 4)
            queue.show(busy(node, max(gpus, 1)), "DELETED" if not gpus else "MODIFIED")
        elif roll < 0.9:
            unrelated_change(queue, f"elsewhere-{step}")
        else:
            queue.mono[0] += queue.pol.defaults.queue_hold_after_seconds / 2
        expected = from_scratch(queue.waiting, queue.index, queue.pol, queue.waiting.now())
        result = queue.runner.run_pass()  # on what the pass from scratch decided on
        assert by_pod(result.waiting) == by_pod(expected.waits), step
        assert result.released == len(expected.releases), step
        for event in queue.events.recorded:
            told[(event.pod, event.uid, event.reason)] = told.get((event.pod, event.uid, event.reason), 0) + 1
        queue.events.recorded.clear()
        assert max(told.values(), default=0) == 1, step
        for wait in result.waiting:
            reason = GANG_EVENTS.get(wait.code, ("Queued", ""))[0]
            assert (wait.queued.key[1], wait.queued.uid, reason) in told, step
        for key, obj in list(queue.objs.items()):
            if not obj["spec"].get("schedulingGates") and queue.waiting.get(key) is not None and rng.random() < 0.5:
                queue.show(obj)  # the watch shows the release (or not yet)
