"""What the leader's passes tell the pools' GPUPool objects (webhook/queue/status.py): each queued Pod
counted once, for the first pool it waits for; at most once a second; nothing once it no longer leads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.queue.fakes import Inventory
from tests.queue.helpers import L4, T4, enqueue, fleet, queued_pod, setup
from webhook.domain.model import PoolKey
from webhook.pools.statuses import object_names
from webhook.queue import release
from webhook.queue.release import Wait
from webhook.queue.status import STATUS_SECONDS, StatusFeed


class Sink:
    def __init__(self) -> None:
        self.published: list[dict[str, dict[str, Any]]] = []
        self.forgotten = 0

    def publish(self, wanted: Mapping[str, dict[str, Any]]) -> None:
        self.published.append(dict(wanted))

    def forget(self) -> None:
        self.forgotten += 1


def queued_for(status: Mapping[str, dict[str, Any]], key: PoolKey) -> int:
    return int(status[object_names([key])[key]]["queued"])


def planned(names: list[str]) -> tuple[Inventory, list[Wait]]:
    """A full fleet (T4 and L4 busy) and Pods of namespace q queued for whatever medium GPU: they wait."""
    index, waiting = setup(fleet())
    objs = [queued_pod(n, "q", index.policy, index, created=f"2026-12-01T10:00:0{i}Z") for i, n in enumerate(names)]
    enqueue(objs, index, waiting)
    return Inventory(index), release.plan(waiting.ordered(), index, index.policy).waits


def test_each_queued_pod_counts_once_for_the_first_pool_it_waits_for() -> None:
    """Two Pods that may use a T4 or an L4 wait: both count for the first of their pools (the T4, which
    ranks first for them), none for the other; a pool nobody waits for has 0."""
    inventory, waits = planned(["a", "b"])
    assert [w.pools[0] for w in waits] == [T4, T4]
    sink = Sink()
    StatusFeed(sink, clock=lambda: 0.0).look(True, inventory.read)
    assert sink.published == []  # no pass yet: nothing to tell
    feed = StatusFeed(sink, clock=lambda: 0.0)
    feed.passed(waits)
    feed.look(True, inventory.read)
    (status,) = sink.published
    assert (queued_for(status, T4), queued_for(status, L4)) == (2, 0)


def test_at_most_once_a_second_and_only_after_a_pass() -> None:
    """A look within STATUS_SECONDS of the last publish, or without a pass since, publishes nothing."""
    inventory, waits = planned(["a"])
    now = [0.0]
    sink = Sink()
    feed = StatusFeed(sink, clock=lambda: now[0])
    feed.passed(waits)
    feed.look(True, inventory.read)
    feed.passed(waits)
    now[0] = STATUS_SECONDS / 2
    feed.look(True, inventory.read)
    assert len(sink.published) == 1
    now[0] = STATUS_SECONDS
    feed.look(True, inventory.read)
    feed.look(True, inventory.read)
    assert len(sink.published) == 2


def test_a_leader_that_stops_leading_forgets_once() -> None:
    """Leadership lost: the sink is told to forget (write nothing more), once, and nothing is published."""
    inventory, waits = planned(["a"])
    sink = Sink()
    feed = StatusFeed(sink, clock=lambda: 0.0)
    feed.passed(waits)
    feed.look(True, inventory.read)
    feed.passed(waits)
    feed.look(False, inventory.read)
    feed.look(False, inventory.read)
    assert (len(sink.published), sink.forgotten) == (1, 1)
