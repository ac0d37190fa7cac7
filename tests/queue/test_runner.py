"""The leader's cost: a pass's releases are in flight together (a slow API round trip does not make the
queue release one Pod per round trip), a saturated pass decides each shape once, and only changes that can
make room start a pass (each holds the inventory's lock, which admissions on the leader wait for)."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import jsonpatch
import pytest

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.fakes import Events, Inventory, Leading, SlowApi
from tests.queue.helpers import enqueue, queued_pod, wait_for
from webhook.domain.model import PoolKey
from webhook.pools.reservations import Reservation
from webhook.queue import release
from webhook.queue import runner as runner_module
from webhook.queue.runner import Runner
from webhook.queue.waiting import PODS, Waiting
from webhook.sources.writes import Refused, Released, ReleaseResult

QUEUE = "namespaces:\n  q: {placement: queue}\n"
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
T4_SELECTOR = (("gpu.accelerator/class", "medium"), ("nvidia.com/gpu.product", "Tesla-T4"))


def test_a_pass_writes_its_releases_together_not_one_round_trip_after_another() -> None:
    """Four Pods with room for all: their four PATCHes are in flight at once (an API that answers none
    until four wait would make one-at-a-time writes fail), and all four are released."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4)], pol)
    waiting = Waiting(pol)
    objs = [queued_pod(f"job-{k}", "q", pol, index, created=f"2026-12-01T10:00:0{k}Z") for k in range(4)]
    enqueue(objs, index, waiting)
    api = SlowApi({("q", o["metadata"]["name"]): o for o in objs}, together=4)
    events = Events()
    runner = Runner(Inventory(index), waiting, Leading(), api, events=events)  # type: ignore[arg-type]

    result = runner.run_pass()

    assert result.released == 4
    assert sorted(e.pod for e in events.recorded if e.reason == "Released") == [f"job-{k}" for k in range(4)]
    assert not any(index.usage.is_queued(("q", f"job-{k}")) for k in range(4))


def test_a_saturated_pass_decides_each_shape_once_and_every_pod_still_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty Pods of one shape and no room: each is told it waits for capacity, and the pass asked the
    index for a decision once, not fifty times."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 1)], pol)
    waiting = Waiting(pol)
    taken = queued_pod("first", "q", pol, index, created="2026-12-01T09:00:00Z")
    enqueue([taken], index, waiting)
    first = release.plan(waiting.ordered(), index, pol)
    assert [r.queued.key for r in first.releases] == [("q", "first")]  # the only GPU is taken
    objs = [queued_pod(f"job-{k:02d}", "q", pol, index, created=f"2026-12-01T10:00:{k:02d}Z") for k in range(50)]
    enqueue(objs, index, waiting)
    calls = []
    decide = release.choose

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return decide(*args, **kwargs)

    monkeypatch.setattr(release, "choose", counting)
    decided = release.plan(waiting.ordered(), index, pol)
    assert decided.releases == []
    assert len(decided.waits) == 50 and {w.code for w in decided.waits} == {"capacity"}
    assert len(calls) == 1


def test_only_changes_that_can_make_room_wake_the_leader() -> None:
    """A Pod that holds no GPU changing (most of a cluster's Pod events) starts no pass; a GPU Pod
    finishing, a node and a quota do."""
    waiting = Waiting(policy(QUEUE))
    waiting.wake.clear()
    waiting.apply(PODS, "MODIFIED", pod("web", "shop", node="cpu-1", phase="Running"))
    waiting.apply(PODS, "DELETED", pod("web", "shop", node="cpu-1", phase="Running"))
    assert not waiting.wake.is_set()
    waiting.apply(PODS, "MODIFIED", pod("train", "ml", gpus=1, node="t4-a", phase="Succeeded"))
    assert waiting.wake.is_set()
    for kind in ("nodes", "resourcequotas"):
        waiting.wake.clear()
        waiting.apply(kind, "MODIFIED", {"metadata": {"name": "x"}})
        assert waiting.wake.is_set()


class HeldApi:
    """PATCHes answered at once, except those of the Pods in `held`, answered once `go` is set."""

    def __init__(self, pods: dict[tuple[str, str], dict[str, Any]], held: set[str]) -> None:
        self.pods, self._held = pods, held
        self.go = threading.Event()
        self.sent: list[str] = []

    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        self.sent.append(name)
        if name in self._held:
            self.go.wait(10)
        return Released(jsonpatch.apply_patch(copy.deepcopy(self.pods[(namespace, name)]), patch))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))


def test_room_that_appears_while_a_release_is_in_flight_is_not_kept_waiting_for_its_answer() -> None:
    """The first release's PATCH hangs; a Pod queued meanwhile, with room, is released by the next pass
    without waiting for that answer."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 2)], pol)
    waiting = Waiting(pol)
    first, second = (queued_pod(n, "q", pol, index, created=f"2026-12-01T10:00:0{k}Z") for k, n in enumerate("ab"))
    api = HeldApi({("q", "a"): first, ("q", "b"): second}, held={"a"})
    inventory = Inventory(index)
    runner = Runner(inventory, waiting, Leading(), api, events=Events())  # type: ignore[arg-type]
    runner.start()
    try:
        with inventory.read():  # as the watch delivers: under the inventory's lock
            enqueue([first], index, waiting)
        assert wait_for(lambda: api.sent == ["a"])
        with inventory.read():
            enqueue([second], index, waiting)
        assert wait_for(lambda: api.sent == ["a", "b"]), "the second release waited for the first's answer"
    finally:
        api.go.set()
        runner.stop()
    assert not index.usage.is_queued(("q", "a")) and not index.usage.is_queued(("q", "b"))


def test_over_an_unchanged_index_the_loop_makes_no_pass_and_sees_a_change_nothing_announced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The only GPU is reserved for an admission, the Pod waits. While nothing changes the loop looks every
    tick but makes no pass (each would walk the whole queue: 10,000 Pods on a large cluster). The
    reservation then expires, which no watch event announces and nothing wakes the loop for: the next
    tick's pass releases the Pod."""
    monkeypatch.setattr(runner_module, "TICK_SECONDS", 0.02)
    passes = []
    decide_batch = runner_module.decide_batch

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(time.monotonic())
        return decide_batch(*args, **kwargs)

    monkeypatch.setattr(runner_module, "decide_batch", counted)
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 1)], pol)
    index.reserve(Reservation(namespace="other", pool=T4, selector=T4_SELECTOR, gpus=1), now=0.0)
    waiting = Waiting(pol)
    obj = queued_pod("job", "q", pol, index)
    inventory = Inventory(index)
    runner = Runner(inventory, waiting, Leading(), HeldApi({("q", "job"): obj}, held=set()), events=Events())  # type: ignore[arg-type]
    with inventory.read():
        enqueue([obj], index, waiting)
    runner.start()
    try:
        assert wait_for(lambda: len(passes) >= 1)
        time.sleep(0.5)  # some 25 ticks
        assert len(passes) <= 2 and index.usage.is_queued(("q", "job"))
        with inventory.read():
            assert index.expire(now=1e9) == 1
        assert wait_for(lambda: not index.usage.is_queued(("q", "job"))), "the tick's pass did not see the expiry"
    finally:
        runner.stop()


class SilentApi:
    """An API that stopped answering: every PATCH times out (its answer lost), every read fails."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        return Refused(0, "ReadTimeoutError: no answer")

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append(name)
        raise OSError(f"reading Pod {namespace}/{name}: no answer")


def test_on_an_api_that_does_not_answer_a_pass_asks_after_one_lost_write_not_each_in_turn() -> None:
    """Three releases whose answers were lost are looked up before they are undone; while the API does not
    answer, a pass gives up at the first lookup that fails (each can take the client's whole timeout, and
    one after another they held the loop past the leader process's hung bound). They stay counted as
    released, and are looked up again by the next pass."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4)], pol)
    waiting = Waiting(pol)
    objs = [queued_pod(f"job-{k}", "q", pol, index, created=f"2026-12-01T10:00:0{k}Z") for k in range(3)]
    enqueue(objs, index, waiting)
    api = SilentApi()
    runner = Runner(Inventory(index), waiting, Leading(), api, events=Events())  # type: ignore[arg-type]
    assert runner.run_pass().released == 0  # three writes, three answers lost
    # Which one first is the order the lost answers came back in (the writes run on the writer threads).
    runner.run_pass()
    assert len(api.asked) == 1
    assert not any(index.usage.is_queued(("q", f"job-{k}")) for k in range(3))  # still counted as released
    runner.run_pass()
    assert len(api.asked) == len(set(api.asked)) == 2  # the next pass asks after another one
