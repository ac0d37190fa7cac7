"""A thread's round under way, seen from outside: the leader process's heartbeat watches the threads
beside its loop by it (webhook.serving.queueing). No Kubernetes client here: the queue's election uses it,
and the queue imports none (import-linter's contracts)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Rounds:
    """When the round a thread is in began (the monotonic clock, as webhook.serving.leaderproc's heartbeat
    reads it), or None between rounds: a thread stuck in one (a call that never returns, a deadlock, a bug
    that ended the thread mid-round) is seen from outside by how old its round is."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.since: float | None = None

    def begin(self) -> None:
        self.since = self._clock()

    def end(self) -> None:
        self.since = None
