"""How the commands print: here, durations as kubectl's AGE column writes them (apimachinery's
HumanDuration), so `gpupool queue`'s WAITING reads like `kubectl get pods`' AGE."""

from __future__ import annotations

import pytest

from webhook.commands.output import age

MINUTE, HOUR, DAY, YEAR = 60, 3600, 86400, 365 * 86400
MS = 0.001


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        # apimachinery's own table (pkg/util/duration, TestHumanDuration and its boundaries)
        (1, "1s"), (70, "70s"), (190, "3m10s"), (70 * MINUTE, "70m"), (47 * HOUR, "47h"), (49 * HOUR, "2d1h"),
        ((8 * 24 + 2) * HOUR, "8d"), (367 * DAY, "367d"), (2 * YEAR + 25 * HOUR, "2y1d"),
        (8 * YEAR + 2 * HOUR, "8y"), (-2, "<invalid>"), (-2 + 1e-9, "0s"), (0, "0s"), (1 - MS, "0s"),
        (2 * MINUTE - MS, "119s"), (2 * MINUTE, "2m"), (2 * MINUTE + 1, "2m1s"), (10 * MINUTE - MS, "9m59s"),
        (10 * MINUTE, "10m"), (10 * MINUTE + 1, "10m"), (3 * HOUR - MS, "179m"), (3 * HOUR, "3h"),
        (3 * HOUR + MINUTE, "3h1m"), (8 * HOUR - MS, "7h59m"), (8 * HOUR, "8h"), (8 * HOUR + 59 * MINUTE, "8h"),
        (2 * DAY - MS, "47h"), (2 * DAY, "2d"), (2 * DAY + HOUR, "2d1h"), (8 * DAY - MS, "7d23h"), (8 * DAY, "8d"),
        (8 * DAY + 23 * HOUR, "8d"), (2 * YEAR - MS, "729d"), (2 * YEAR, "2y"),
        (2 * YEAR + 23 * HOUR + 59 * MINUTE, "2y"), (2 * YEAR + DAY, "2y1d"), (3 * YEAR, "3y"),
        (8 * YEAR - MS, "7y364d"), (8 * YEAR, "8y"), (8 * YEAR + 364 * DAY, "8y"), (9 * YEAR, "9y"),
    ],
)  # fmt: skip
def test_a_duration_reads_as_kubectls_age(seconds: float, shown: str) -> None:
    assert age(seconds) == shown


def test_no_time_to_count_from_is_unknown() -> None:
    """kubectl's `<unknown>`, for an object without a creationTimestamp."""
    assert age(None) == "<unknown>"
