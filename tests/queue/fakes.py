"""Stand-ins for what the queue's runner talks to: an inventory, a leader election that always leads,
an event recorder that keeps what it was told, and an API that answers PATCHes."""

from __future__ import annotations

import copy
import threading
from contextlib import AbstractContextManager
from typing import Any

import jsonpatch

from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.inventory import LockedIndex
from webhook.sources.eventqueue import Event
from webhook.sources.writes import Released, ReleaseResult


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
    identity, term = "leader-1", 1  # its releases' fencing token: leader-1/1

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
