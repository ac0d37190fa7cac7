"""The bounded memo: each key computed once, no key never remembered, and never more than its limit."""

from __future__ import annotations

import pytest

from webhook.pools.memo import NO_MEMO, Memo


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return self.calls


def test_a_key_is_computed_once() -> None:
    memo, compute = Memo(), Counting()
    assert [memo.get("a", compute) for _ in range(3)] == [1, 1, 1]
    assert compute.calls == 1


def test_without_a_key_the_value_is_computed_every_time_and_not_kept() -> None:
    memo, compute = Memo(), Counting()
    assert [memo.get(None, compute) for _ in range(3)] == [1, 2, 3]
    assert len(memo) == 0


def test_it_never_holds_more_than_its_limit() -> None:
    memo = Memo(limit=3)
    for i in range(10):
        memo.get(i, lambda: 0)
        assert len(memo) <= 3
    assert memo.get(9, Counting()) == 0, "the newest entry survives the clearing"


def test_a_failed_computation_is_not_remembered() -> None:
    memo = Memo()
    calls: list[int] = []

    def failing() -> int:
        calls.append(1)
        raise ValueError("no")

    for _ in range(2):
        with pytest.raises(ValueError, match="no"):
            memo.get("k", failing)
    assert len(calls) == 2 and len(memo) == 0


def test_clear_forgets_everything() -> None:
    memo, compute = Memo(), Counting()
    memo.get("a", compute)
    memo.clear()
    assert memo.get("a", compute) == 2


def test_no_memo_computes_every_time_even_with_a_key() -> None:
    compute = Counting()
    assert [NO_MEMO.get("a", compute) for _ in range(2)] == [1, 2]
    assert not NO_MEMO.remembers and len(NO_MEMO) == 0
