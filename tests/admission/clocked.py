"""A clock tests set by hand, and a snapshot inventory whose watch counts as current: for the tests of
the validating call and of the charges of Pods that bypass placement."""

from __future__ import annotations

from webhook.sources.snapshot import SnapshotInventory


class CurrentInventory(SnapshotInventory):
    """A snapshot whose Pod watch has been current since time 0, so reservations settle (as live ones do);
    `age` is how many seconds ago it last heard from the API (a test sets it to make it stale)."""

    age = 0.0

    def current_since(self) -> float | None:
        return 0.0

    def age_seconds(self) -> float:
        return self.age


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
