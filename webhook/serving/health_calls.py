"""The health port's calls out (readiness, the metrics text), each on a thread of its own.

A `Caller` runs one function when asked, one call at a time, and hands the result back through `done`;
which requests a call answers is the loop's business (webhook.serving.health): every request that
arrived before the call started shares its answer, so a thousand scrapes cost one rendering and an
answer is never older than its request. Two callers, not a shared pool, so a slow scrape can never hold
up a readiness probe. After each call a caller rests `rest` times as long as the call took, so that
clients asking as fast as they can get at most 1 / (1 + rest) of a core's work out of it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Caller(Generic[T]):
    def __init__(self, name: str, call: Callable[[], T], done: Callable[[Caller[T], T], None], rest: float) -> None:
        self.name = name
        self.busy = False  # the loop's own flag: set when it asks, cleared when it takes the result
        self._call = call
        self._done = done
        self._rest = rest
        self._asks: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def ask(self) -> None:
        """Start a call (the loop asks only when the previous call's result is in)."""
        self.busy = True
        self._asks.put(True)

    def stop(self) -> None:
        self._stopping.set()
        self._asks.put(False)

    def _run(self) -> None:
        while self._asks.get():
            started = time.monotonic()
            result = self._call()  # `call` turns its own failures into an answer
            self._done(self, result)
            if self._stopping.wait(self._rest * (time.monotonic() - started)):
                return
