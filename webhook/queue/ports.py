"""What the queue's leader loop (webhook.queue.runner) needs of the world: the live inventory, the API's
writes, Events and metrics, as Protocols the serving layer implements, and client-go's client-side rate
limit for its writes."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.queue.backlog import Backlog
from webhook.sources.eventqueue import Event
from webhook.sources.outcomes import ReleaseResult


class QueueInventory(Protocol):
    """What the runner needs of the live inventory (webhook.sources.live.LiveInventory)."""

    policy: Policy

    def read(self) -> AbstractContextManager[PoolIndex]: ...

    @property
    def ready(self) -> bool: ...

    def pod_version(self) -> str: ...


class Releaser(Protocol):
    def release(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> ReleaseResult: ...

    def read(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Events(Protocol):
    def record(self, event: Event) -> None: ...


class QueueMetrics(Protocol):
    """What the runner reports (webhook.serving.metrics implements it)."""

    def queue_waiting(self, backlog: dict[str, Backlog]) -> None: ...

    def queue_released(self, outcome: str, wait_seconds: float | None) -> None: ...

    def queue_leading(self, leading: bool) -> None: ...

    def mig_reshaped(self, outcome: str) -> None: ...


class NoMetrics:
    def queue_waiting(self, backlog: dict[str, Backlog]) -> None:
        return None

    def queue_released(self, outcome: str, wait_seconds: float | None) -> None:
        return None

    def queue_leading(self, leading: bool) -> None:
        return None

    def mig_reshaped(self, outcome: str) -> None:
        return None


class TokenBucket:
    """A client-side rate limit, as client-go's: `qps` a second sustained, `burst` at once."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def delay(self) -> float:
        """Take a token: the seconds to wait before the write it is for (0 when one is there)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


UNLIMITED = TokenBucket(1e9, 10**9)
