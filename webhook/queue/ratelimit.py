"""The leader's client-side rate limit on its writes (releases and Events), as client-go's."""

from __future__ import annotations

import time
from collections.abc import Callable


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
