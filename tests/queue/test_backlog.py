"""The queue's backlog per namespace, which the metrics report: how many Pods wait, and how long the one
waiting longest has (the alert on Pods waiting too long reads it; the wait histogram only sees a Pod once
it is released)."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.builders import gpu_node, index_of, policy
from tests.queue.helpers import enqueue, queued_pod
from webhook.queue.waiting import Backlog, Waiting

QUEUE = """
namespaces:
  team-a: {placement: queue}
  team-b: {placement: queue}
"""
NOW = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)


def test_pods_and_the_oldest_wait_per_namespace_and_a_released_pod_leaves() -> None:
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4)], pol)
    waiting = Waiting(pol)
    pods = [
        queued_pod("old", "team-a", pol, index, created="2026-12-01T10:00:00Z"),
        queued_pod("new", "team-a", pol, index, created="2026-12-01T13:59:00Z"),
        queued_pod("one", "team-b", pol, index, created="2026-12-01T13:30:00Z"),
    ]
    enqueue(pods, index, waiting)
    assert waiting.backlog(NOW) == {"team-a": Backlog(2, 4 * 3600.0), "team-b": Backlog(1, 1800.0)}
    released = dict(pods[0], spec={**pods[0]["spec"], "schedulingGates": []})
    waiting.apply("pods", "MODIFIED", released)
    waiting.apply("pods", "DELETED", pods[2])
    assert waiting.backlog(NOW) == {"team-a": Backlog(1, 60.0)}


def test_a_clock_behind_the_api_servers_or_an_unreadable_creation_time() -> None:
    """Never a negative wait; without a creation time, the time since this process first saw it wait."""
    pol = policy(QUEUE)
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4)], pol)
    mono = [100.0]
    waiting = Waiting(pol, clock=lambda: mono[0])
    enqueue([queued_pod("future", "team-a", pol, index, created="2026-12-01T14:05:00Z"),
             queued_pod("unknown", "team-b", pol, index, created="")], index, waiting)  # fmt: skip
    mono[0] = 130.0
    assert waiting.backlog(NOW) == {"team-a": Backlog(1, 0.0), "team-b": Backlog(1, 30.0)}
