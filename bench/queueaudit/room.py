"""Release latency's bookkeeping: room as units stamped with the write that freed them, taken oldest
first, and the release that took them (the package's docstring says how room is attributed)."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from bench.queueaudit.records import BEFORE


class Room:
    """Free units in the order they appeared; the oldest are taken first."""

    def __init__(self, initial: int = 0) -> None:
        self._chunks: deque[list[float]] = deque()
        self.total = 0
        self.add(BEFORE, initial)

    def add(self, at: float, amount: int) -> None:
        if amount > 0:
            self._chunks.append([at, float(amount)])
            self.total += amount

    def take(self, amount: int) -> tuple[float, int]:
        """Take `amount` units: (when the last one taken appeared, how many were missing)."""
        last = BEFORE
        while amount > 0 and self._chunks:
            chunk = self._chunks[0]
            n = min(int(chunk[1]), amount)
            chunk[1] -= n
            amount -= n
            self.total -= n
            last = chunk[0]
            if chunk[1] <= 0:
                self._chunks.popleft()
        return last, amount


class Release(NamedTuple):
    key: str
    at: float  # store time of the write that removed the gate
    namespace: str
    product: str
    gpus: int
    created: float
    room_at: float  # when room appeared (see the package's docstring)
    short_capacity: int
    short_quota: int

    @property
    def latency(self) -> float:
        return self.at - self.room_at
