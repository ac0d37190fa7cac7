"""A long pass lets go of the inventory's lock between Pods, and stays exact whatever the watch changes
meanwhile: a Pod deleted is not released (nor counted again), room that appears is not taken out of
turn, a gang missing a member waits. And the runner does let go, and the queue shares one shape object
per distinct shape (a pass tells shapes apart by identity)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.fakes import Events, Leading, SlowApi
from tests.queue.helpers import GPU_TOLERATION, enqueue, queued_pod
from webhook.domain.model import PodKey
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.queue.release import PAUSE_EVERY, decide_batch, plan, read_batch, settle
from webhook.queue.runner import Runner
from webhook.queue.waiting import PODS, Waiting

QUEUE = "namespaces:\n  q: {placement: queue}\n"


def busy(node: str, gpus: int, name: str) -> dict[str, Any]:
    return pod(name, "other", gpus=gpus, node=node, phase="Running", tolerations=[GPU_TOLERATION])


def queue_of(n: int, index: PoolIndex, waiting: Waiting, *, distinct: bool = False, **kw: Any) -> list[dict[str, Any]]:
    """`n` Pods of q, one a second; with `distinct`, each of its own shape (a minimum GPU memory every T4
    meets), so that a pass decides each in turn rather than leaving the line of one shape at its first."""
    objs = [
        queued_pod(
            f"p{k:02d}",
            "q",
            index.policy,
            index,
            created=f"2026-12-01T10:{k // 60:02d}:{k % 60:02d}Z",
            **({"annotations": {"gpupool.io/min-memory": f"{k + 1}Mi"}} if distinct else {}),
            **kw,
        )
        for k in range(n)
    ]
    enqueue(objs, index, waiting)
    return objs


def at_pause(number: int, then: Callable[[], None]) -> Callable[[], None]:
    """A `pause` that does `then` (what the watch applies while the lock is let go) at its `number`th call."""
    calls = [0]

    def pause() -> None:
        calls[0] += 1
        if calls[0] == number:
            then()

    return pause


def deleted(index: PoolIndex, waiting: Waiting, obj: dict[str, Any]) -> Callable[[], None]:
    """The watch's DELETED event of a Pod: out of the index and the queue."""

    def apply() -> None:
        meta = obj["metadata"]
        index.remove_pod((meta["namespace"], meta["name"]))
        waiting.apply(PODS, "DELETED", obj)

    return apply


def test_a_pod_deleted_while_the_pass_let_go_is_neither_released_nor_counted_again() -> None:
    """Room for all; the Pod right after the second pause is deleted during it: the others are released,
    it is not, and the index holds no trace of it (a release would have counted it again, for good)."""
    pol = policy(QUEUE)
    index = index_of([gpu_node(f"t4-{k}", "Tesla-T4", 4) for k in range(8)], pol)
    waiting = Waiting(pol)
    objs = queue_of(PAUSE_EVERY + 4, index, waiting)
    victim = objs[PAUSE_EVERY]
    key: PodKey = ("q", victim["metadata"]["name"])

    decided = decide_batch(
        read_batch(waiting.ordered(), pol), index, pol, pause=at_pause(2, deleted(index, waiting, victim))
    )

    released = {r.queued.key for r in decided.releases}
    assert key not in released and len(released) == PAUSE_EVERY + 3
    assert index.usage.pod_info(key) is None


def test_room_that_appears_while_the_pass_let_go_is_not_taken_out_of_turn() -> None:
    """Every T4 busy, Pods of distinct shapes wait; during the second pause a GPU frees. The Pods after the
    pause do not take it ahead of the ones before, which wait for it: this pass releases nothing, the next
    gives it to the first in order."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), busy("t4-a", 4, "busy")], pol)
    waiting = Waiting(pol)
    queue_of(PAUSE_EVERY + 4, index, waiting, distinct=True)

    def frees() -> None:
        done = busy("t4-a", 4, "busy")
        done["status"]["phase"] = "Succeeded"
        index.upsert_pod(pod_from_obj(done, pol.gpu_resources, pol.partition_prefixes), ("other", "busy"))

    decided = decide_batch(read_batch(waiting.ordered(), pol), index, pol, pause=at_pause(2, frees))
    assert decided.releases == []
    again = plan(waiting.ordered(), index, pol)
    assert [r.queued.key[1] for r in again.releases][:1] == ["p00"]


def test_a_gang_whose_member_is_deleted_while_the_pass_let_go_waits_whole() -> None:
    """A gang of three whose turn comes after a pause (enough Pods wait ahead of it, for A100s that are all
    busy); one member is deleted in that pause: the two left wait (2 of 3 exist), none is released, and
    the deleted one is not counted again."""
    pol = policy(QUEUE)
    nodes = [gpu_node("t4-a", "Tesla-T4", 4), gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034)]
    a100 = gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 4, memory_mib=40960, gpu_class="high")
    index = index_of([*nodes, a100, busy("a100-a", 4, "busy")], pol)
    waiting = Waiting(pol)
    high = {"gpupool.io/gpu-class": "high"}
    ahead = [  # each of its own shape: a step each
        queued_pod(
            f"h{k:02d}",
            "q",
            pol,
            index,
            annotations={**high, "gpupool.io/min-memory": f"{k + 1}Mi"},
            created=f"2026-12-01T09:00:{k:02d}Z",
        )
        for k in range(PAUSE_EVERY)
    ]
    gang = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "sweep", "gpupool.io/group-size": "3"}
    members = [
        queued_pod(f"g{k}", "q", pol, index, annotations=gang, created=f"2026-12-01T10:00:0{k}Z") for k in range(3)
    ]
    enqueue([*ahead, *members], index, waiting)

    decided = decide_batch(
        read_batch(waiting.ordered(), pol), index, pol, pause=at_pause(2, deleted(index, waiting, members[1]))
    )

    assert decided.releases == []
    gang_waits = {w.queued.key[1]: w.code for w in decided.waits if w.queued.key[1].startswith("g")}
    assert gang_waits == {"g0": "gang", "g2": "gang"}
    assert index.usage.pod_info(("q", "g1")) is None


class CountingInventory:
    """An inventory whose lock records each time a thread takes it."""

    def __init__(self, index: PoolIndex) -> None:
        self.policy = index.policy
        self.ready = True
        self.takes: list[int] = []
        self._index, self._lock = index, threading.Lock()
        outer = self

        class Held(AbstractContextManager[PoolIndex]):
            def __enter__(self) -> PoolIndex:
                outer._lock.acquire()
                outer.takes.append(threading.get_ident())
                return outer._index

            def __exit__(self, *exc: object) -> None:
                outer._lock.release()

        self._held = Held()

    def read(self) -> AbstractContextManager[PoolIndex]:
        return self._held

    def pod_version(self) -> str:
        return "1"


def a_pass(clock: Callable[[], float]) -> tuple[int, list[PodKey]]:
    """One runner pass over 100 waiting Pods of distinct shapes and one free GPU: how often it took the
    inventory's lock, and what it released."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), busy("t4-a", 3, "busy")], pol)
    waiting = Waiting(pol)
    objs = queue_of(100, index, waiting, distinct=True)
    inventory = CountingInventory(index)
    api = SlowApi({("q", o["metadata"]["name"]): o for o in objs}, together=1)
    runner = Runner(inventory, waiting, Leading(), api, events=Events(), clock=clock)  # type: ignore[arg-type]
    runner.run_pass()
    return len(inventory.takes), [o for o in (("q", f"p{k:02d}") for k in range(100)) if not index.usage.is_queued(o)]


def test_a_long_pass_lets_go_of_the_inventory_lock_and_releases_the_same() -> None:
    """On a clock on which every reading is a millisecond later, a pass over a long queue takes the lock
    again and again (it lets go every 2 ms); on a clock that stands still it never lets go. Both release
    the same Pod: the first in order."""
    ticks = iter(range(10**6))
    takes, released = a_pass(lambda: next(ticks) / 1000)
    still_takes, still_released = a_pass(lambda: 0.0)
    assert takes > still_takes
    assert released == still_released == [("q", "p00")]


def test_the_queue_shares_one_shape_object_per_distinct_shape() -> None:
    """Pods of one shape share it (a pass decides it once by identity); the table of shapes does not
    outgrow the Pods waiting."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), busy("t4-a", 4, "busy")], pol)
    waiting = Waiting(pol)
    queue_of(30, index, waiting)
    shapes = {id(q.view.shape) for q in waiting.ordered()}
    assert len(shapes) == 1
    for round_ in range(50):  # Pods of ever new shapes come and go
        obj = queued_pod(f"x{round_}", "q", pol, index, annotations={"gpupool.io/min-memory": f"{round_ + 1}Mi"})
        enqueue([obj], index, waiting)
        waiting.apply(PODS, "DELETED", obj)
    assert len(waiting._shapes) <= 2 * len(waiting) + 64
    assert len({id(q.view.shape) for q in waiting.ordered()}) == 1


def test_a_release_refused_after_the_pod_changed_in_a_pause_leaves_the_index_as_the_watch_showed_it() -> None:
    """The Pod after the second pause is changed during it (a toleration added, as a gated Pod may be). Its
    release was decided on the queue's older view and the API refuses it (409); taking the release back
    leaves the index with the Pod as the watch last showed it, not as the queue first saw it."""
    pol = policy(QUEUE)
    index = index_of([gpu_node(f"t4-{k}", "Tesla-T4", 4) for k in range(8)], pol)
    waiting = Waiting(pol)
    objs = queue_of(PAUSE_EVERY + 4, index, waiting)
    changed = copy.deepcopy(objs[PAUSE_EVERY])
    changed["metadata"]["resourceVersion"] = "999"
    changed["spec"].setdefault("tolerations", []).append({"key": "example.com/spot", "operator": "Exists"})
    newer = pod_from_obj(changed, pol.gpu_resources, pol.partition_prefixes)
    key: PodKey = ("q", changed["metadata"]["name"])

    def watch_shows_it() -> None:
        index.upsert_pod(newer, key)
        waiting.apply(PODS, "MODIFIED", changed)

    decided = decide_batch(read_batch(waiting.ordered(), pol), index, pol, pause=at_pause(2, watch_shows_it))
    (refused,) = [r for r in decided.releases if r.queued.key == key]
    settle(index, refused, None)

    assert index.usage.pod_info(key) == newer and index.usage.is_queued(key)


def test_room_that_keeps_moving_on_one_pool_does_not_keep_the_pods_of_another_from_going() -> None:
    """20 Pods of distinct shapes wait for the full T4 node, and from the second pause of the pass on a GPU
    there frees or is taken again at each; a Pod for the free L4 node comes after them all. The pass keeps the T4 room
    that appeared for the Pods before (none of the later ones takes it) and still reaches the L4 Pod, which
    goes: a pool whose room keeps moving never stalls the queue behind it."""
    pol = policy(QUEUE)
    nodes = [gpu_node("t4-a", "Tesla-T4", 4), gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034)]
    index = index_of([*nodes, busy("t4-a", 4, "busy")], pol)
    waiting = Waiting(pol)
    t4 = [
        queued_pod(
            f"t{k:02d}",
            "q",
            pol,
            index,
            annotations={"gpupool.io/gpu-product": "Tesla-T4", "gpupool.io/min-memory": f"{k + 1}Mi"},
            created=f"2026-12-01T09:00:{k:02d}Z",
        )
        for k in range(PAUSE_EVERY + 4)
    ]
    l4 = queued_pod("late", "q", pol, index, annotations={"gpupool.io/gpu-product": "NVIDIA-L4"})
    enqueue([*t4, l4], index, waiting)
    flips = [0]

    def flip() -> None:  # from the second pause on, a GPU of t4-a frees, or is taken again, while the lock is let go
        flips[0] += 1
        if flips[0] < 2:
            return
        running = busy("t4-a", 3 if flips[0] % 2 == 0 else 4, "busy")
        index.upsert_pod(pod_from_obj(running, pol.gpu_resources, pol.partition_prefixes), ("other", "busy"))

    decided = decide_batch(read_batch(waiting.ordered(), pol), index, pol, pause=flip)
    assert flips[0] >= 2
    assert [r.queued.key[1] for r in decided.releases] == ["late"]
