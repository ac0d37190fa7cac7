"""The bounded memo: each key computed once (twice once it has been full), no key never remembered, and
never more than its limit of entries or of bytes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from webhook.pools.memo import ENTRY_BYTES, NO_MEMO, Memo, held_bytes


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
    assert memo.get(3, Counting()) == 0, "the entry that started it over survives the clearing"


def test_once_full_a_stream_of_distinct_keys_is_not_kept() -> None:
    """A memo that has filled up sees keys it will not see again (every Pod a new shape): it keeps none of
    them, so garbage collections have nothing more to walk and nothing is dropped en masse again, while
    a key computed a second time is kept from then on."""
    memo = Memo(limit=100)
    for i in range(101):  # full, then started over
        memo.get(i, lambda: [0])
    held = len(memo)
    for i in range(1000, 1500):
        memo.get(i, lambda: [0])
    assert len(memo) == held
    compute = Counting()
    assert [memo.get("again", compute) for _ in range(3)] == [1, 2, 2]
    assert len(memo) == held + 1


def test_clear_starts_over_as_a_new_memo() -> None:
    memo, compute = Memo(limit=2), Counting()
    for i in range(3):
        memo.get(i, lambda: 0)
    memo.clear()
    assert [memo.get("k", compute) for _ in range(2)] == [1, 1]


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


# --- bounded in bytes ------------------------------------------------------------------------------------


def test_it_never_holds_more_bytes_than_its_budget() -> None:
    """Entries weighed by `size` fill the budget, and the one that would pass it starts it over."""
    memo = Memo(max_bytes=1024 * 1024)
    for i in range(1000):
        memo.get(i, lambda: "x", size=lambda _: 3000)
        assert memo.held_bytes <= 1024 * 1024
    assert 0 < len(memo) < 1000
    assert memo.held_bytes == len(memo) * (3000 + ENTRY_BYTES)


def test_an_entry_heavier_than_its_share_is_computed_every_time() -> None:
    """One Pod may not take a share of the budget few Pods need: a value weighing more than 1/256 of it is
    not kept, and the light entries stay."""
    memo, heavy = Memo(max_bytes=256 * 1024), Counting()
    memo.get("light", lambda: 1, size=lambda _: 10)
    assert [memo.get("heavy", heavy, size=lambda _: 1024) for _ in range(3)] == [1, 2, 3]
    assert len(memo) == 1 and memo.get("light", Counting()) == 1


def test_without_a_size_an_entry_is_weighed_by_what_it_holds() -> None:
    memo = Memo(max_bytes=1024 * 1024)
    memo.get(("k", "y" * 100), lambda: ["v" * 200])
    assert memo.held_bytes >= ENTRY_BYTES + 100 + 200
    memo.get("big", lambda: "z" * 5000)
    assert "big" not in memo._values


@dataclass(frozen=True)
class Frozen:
    name: str
    items: tuple[str, ...]


@dataclass
class Shared:
    """Like the pool index's groups: mutable state a value points into, not held by it."""

    payload: str


def test_held_bytes_counts_what_a_value_reaches_once_and_stops_at_shared_state() -> None:
    text = "t" * 1000
    value = Frozen("n", (text, text, "u" * 500))
    assert held_bytes(value) >= 1500
    assert held_bytes((value, value)) < held_bytes(value) + 100  # counted once
    assert held_bytes(Shared("s" * 10**6)) < 1000
    assert held_bytes(["a" * 10**6, "b" * 10**6], limit=10**5) > 10**5  # stopped early, over the limit
