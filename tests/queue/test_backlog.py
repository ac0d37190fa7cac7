"""The queue's backlog per namespace, which the metrics report: how many Pods wait, and how long the one
waiting longest has (the alert on Pods waiting too long reads it; the wait histogram only sees a Pod once
it is released)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.builders import gpu_node, index_of, policy
from tests.queue.helpers import busy, enqueue, queued_pod
from webhook.domain.model import PodKey
from webhook.queue.backlog import Backlog
from webhook.queue.waiting import Waiting

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


def test_the_backlog_kept_as_pods_arrive_and_leave_is_the_one_a_walk_of_the_queue_gives() -> None:
    """Pods of three namespaces arrive, leave, change and come back in a fixed pseudo-random order: after each
    step the backlog is what counting the waiting Pods one by one gives."""
    pol = policy(QUEUE + "  team-c: {placement: queue}\n")
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), busy("t4-a", 4)], pol)
    mono = [1000.0]
    waiting = Waiting(pol, clock=lambda: mono[0])
    objs: dict[PodKey, dict[str, Any]] = {}
    for step in range(120):
        k = (step * 37) % 23
        namespace, name = ("team-a", "team-b", "team-c")[k % 3], f"p{k}"
        if (namespace, name) in objs and step % 3:
            waiting.apply("pods", "DELETED", objs.pop((namespace, name)))
        else:
            created = f"2026-12-01T1{k % 4}:{step % 60:02d}:00Z" if k % 5 else "not a time"
            obj = queued_pod(name, namespace, pol, index, created=created)
            objs[(namespace, name)] = obj
            enqueue([obj], index, waiting)
        mono[0] += 7.0
        assert waiting.backlog(NOW) == walked_backlog(waiting, NOW), step


def walked_backlog(waiting: Waiting, now: datetime) -> dict[str, Backlog]:
    """The backlog by a walk of every waiting Pod (what `Waiting.backlog` answered before it was kept)."""
    found: dict[str, Backlog] = {}
    for q in waiting.ordered():
        age = q.age(now)
        waited = max(age if age is not None else waiting.now() - q.since, 0.0)
        pods, oldest = found.get(q.key[0], (0, 0.0))
        found[q.key[0]] = Backlog(pods + 1, max(oldest, waited))
    return found
