"""The leader's writes: a pass's releases are in flight together, so a slow API round trip does not make
the queue release one Pod per round trip."""

from __future__ import annotations

import copy
import threading
from contextlib import AbstractContextManager
from typing import Any

import jsonpatch

from tests.builders import gpu_node, index_of, policy
from tests.queue.helpers import enqueue, queued_pod
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.inventory import LockedIndex
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting
from webhook.sources.writes import Event, Released, ReleaseResult

QUEUE = "namespaces:\n  q: {placement: queue}\n"


class Inventory:
    def __init__(self, index: PoolIndex) -> None:
        self.policy: Policy = index.policy
        self._locked = LockedIndex(index)
        self.ready = True

    def read(self) -> AbstractContextManager[PoolIndex]:
        return self._locked.read()

    def pod_version(self) -> str:
        return "1"


class Leading:
    acquired_version = "1"

    def leading(self) -> bool:
        return True

    def remaining(self) -> float:
        return 15.0

    def run(self) -> None:
        return None

    def stop(self) -> None:
        return None


class Events:
    def __init__(self) -> None:
        self.recorded: list[Event] = []

    def record(self, event: Event) -> None:
        self.recorded.append(event)


class SlowApi:
    """Every PATCH waits until `together` of them are in flight at once (or fails after `timeout`)."""

    def __init__(self, pods: dict[tuple[str, str], dict[str, Any]], together: int, timeout: float = 5.0) -> None:
        self._pods = pods
        self._barrier = threading.Barrier(together, timeout=timeout)

    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult:
        self._barrier.wait()
        return Released(jsonpatch.apply_patch(copy.deepcopy(self._pods[(namespace, name)]), patch))

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._pods.get((namespace, name))


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
    assert not any(index.is_queued(("q", f"job-{k}")) for k in range(4))
