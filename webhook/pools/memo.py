"""A bounded memo for values derived on the admission path (request shapes, decision plans)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")
MEMO_LIMIT = 4096  # entries; a cluster has far fewer distinct Pod or request shapes at any one time


class Memo:
    """A bounded memo: at most `limit` entries, all dropped at once when full (cheap, and shapes in use
    come back at the next call). Safe across threads: each dict operation is atomic, and a race only
    computes one value twice."""

    def __init__(self, limit: int = MEMO_LIMIT) -> None:
        self._limit = limit
        self._values: dict[Hashable, Any] = {}

    @property
    def remembers(self) -> bool:
        """False for NO_MEMO, which computes every value every time."""
        return self._limit > 0

    def get(self, key: Hashable | None, compute: Callable[[], T]) -> T:
        """The value for `key`, computed once; with no key (or in NO_MEMO), computed every time."""
        if key is None or not self._limit:
            return compute()
        try:
            value: T = self._values[key]
        except KeyError:
            value = compute()
            if len(self._values) >= self._limit:
                self._values.clear()
            self._values[key] = value
        return value

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


NO_MEMO = Memo(limit=0)  # for callers that remember nothing
