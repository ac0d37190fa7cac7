"""Letting go of the inventory's lock now and then during a long pass of the queue."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from webhook.pools.index import PoolIndex

BREATHE_SECONDS = 0.002  # a pass lets go of the inventory's lock this often


class Breather:
    """decide_batch's `pause`: lets go of the inventory's lock once it has held it for BREATHE_SECONDS,
    so the watch and this replica's admissions get in between the Pods of a long pass."""

    def __init__(self, held: AbstractContextManager[PoolIndex], clock: Callable[[], float]) -> None:
        self._held, self._clock = held, clock
        self._since = clock()

    def __call__(self) -> None:
        if self._clock() - self._since < BREATHE_SECONDS:
            return
        self._held.__exit__(None, None, None)
        time.sleep(0)  # the GIL, for a thread that was waiting for the lock
        self._held.__enter__()
        self._since = self._clock()
