"""What the leader's passes tell the pools' GPUPool objects (webhook/queue/status.py): each queued Pod
counted once, for the first pool it waits for; at most once a second; nothing once it no longer leads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from tests.queue.fakes import Inventory
from tests.queue.helpers import L4, T4, enqueue, fleet, queued_pod, setup
from webhook.domain.model import PoolKey
from webhook.pools.statuses import object_names
from webhook.queue import release
from webhook.queue.lines import Lines, lines_of
from webhook.queue.release import Wait
from webhook.queue.status import MAX_LISTED, STATUS_SECONDS, StatusFeed, namespace_summaries
from webhook.queue.waiting import Queued


class Sink:
    def __init__(self) -> None:
        self.published: list[dict[str, dict[str, Any]]] = []
        self.queues: list[dict[str, dict[str, Any]]] = []
        self.forgotten = 0

    def publish(self, wanted: Mapping[str, dict[str, Any]]) -> None:
        self.published.append(dict(wanted))

    def publish_queues(self, wanted: Mapping[str, dict[str, Any]]) -> None:
        self.queues.append(dict(wanted))

    def forget(self) -> None:
        self.forgotten += 1


class Fixed:
    """A pass's Waits and the queue, as they stand (their versions never move)."""

    version = 0

    def __init__(self, waits: list[Wait], ordered: list[Queued]) -> None:
        self.waits, self._ordered = waits, ordered

    def ordered(self) -> list[Queued]:
        return self._ordered

    def lines(self) -> Lines:
        return lines_of(self._ordered)


def fixed(waits: list[Wait], ordered: list[Queued]) -> tuple[Fixed, Fixed]:
    both = Fixed(waits, ordered)
    return both, both


def queued_for(status: Mapping[str, dict[str, Any]], key: PoolKey) -> int:
    return int(status[object_names([key])[key]]["queued"])


def planned(names: list[str], namespace: str = "q") -> tuple[Inventory, list[Wait], list[Queued]]:
    """A full fleet (T4 and L4 busy) and Pods queued for whatever medium GPU, in this order: they wait."""
    index, waiting = setup(fleet())
    objs = [
        queued_pod(n, namespace, index.policy, index, created=f"2026-12-01T10:{i // 60:02d}:{i % 60:02d}Z")
        for i, n in enumerate(names)
    ]
    enqueue(objs, index, waiting)
    ordered = waiting.ordered()
    return Inventory(index), release.plan(ordered, index, index.policy).waits, ordered


def test_each_queued_pod_counts_once_for_the_first_pool_it_waits_for() -> None:
    """Two Pods that may use a T4 or an L4 wait: both count for the first of their pools (the T4, which
    ranks first for them), none for the other; a pool nobody waits for has 0."""
    inventory, waits, ordered = planned(["a", "b"])
    assert [w.pools[0] for w in waits] == [T4, T4]
    sink = Sink()
    StatusFeed(sink, clock=lambda: 0.0).look(True, inventory.read)
    assert sink.published == []  # no pass yet: nothing to tell
    feed = StatusFeed(sink, clock=lambda: 0.0)
    feed.passed(*fixed(waits, ordered))
    feed.look(True, inventory.read)
    (status,) = sink.published
    assert (queued_for(status, T4), queued_for(status, L4)) == (2, 0)


def test_at_most_once_a_second_and_only_after_a_pass() -> None:
    """A look within STATUS_SECONDS of the last publish, or without a pass since, publishes nothing."""
    inventory, waits, ordered = planned(["a"])
    now = [0.0]
    sink = Sink()
    feed = StatusFeed(sink, clock=lambda: now[0])
    feed.passed(*fixed(waits, ordered))
    feed.look(True, inventory.read)
    feed.passed(*fixed(waits, ordered))
    now[0] = STATUS_SECONDS / 2
    feed.look(True, inventory.read)
    assert len(sink.published) == 1
    now[0] = STATUS_SECONDS
    feed.look(True, inventory.read)
    feed.look(True, inventory.read)
    assert len(sink.published) == 2


def test_a_leader_that_stops_leading_forgets_once() -> None:
    """Leadership lost: the sink is told to forget (write nothing more), once, and nothing is published."""
    inventory, waits, ordered = planned(["a"])
    sink = Sink()
    feed = StatusFeed(sink, clock=lambda: 0.0)
    feed.passed(*fixed(waits, ordered))
    feed.look(True, inventory.read)
    feed.passed(*fixed(waits, ordered))
    feed.look(False, inventory.read)
    feed.look(False, inventory.read)
    assert (len(sink.published), sink.forgotten) == (1, 1)


class TestNamespaceSummaries:
    def test_a_namespace_reads_its_waiting_pods_positions_and_what_they_wait_for(self) -> None:
        """Two Pods of q wait: its ConfigMap's data lists both in queue order with their positions, what
        each waits for (code and words) and the pool it waits for first; no other namespace has one."""
        inventory, waits, ordered = planned(["a", "b"])
        sink = Sink()
        feed = StatusFeed(sink, clock=lambda: 0.0)
        feed.passed(*fixed(waits, ordered))
        feed.look(True, inventory.read)
        (summaries,) = sink.queues
        assert set(summaries) == {"q"}
        assert summaries["q"]["summary"] == "2 Pods of this namespace wait in gpupool's queue (2 in all)."
        pods = yaml.safe_load(summaries["q"]["pods.yaml"])
        assert [(p["pod"], p["position"], p["waitsFor"], p["pool"]) for p in pods] == [
            ("a", 1, "capacity", "nvidia/medium/Tesla-T4"),
            ("b", 2, "capacity", "nvidia/medium/Tesla-T4"),
        ]
        assert pods[0]["reason"].startswith("no node of ")

    def test_a_long_queue_is_cut_and_says_how_many_are_left_out(self) -> None:
        """60 Pods wait: the first MAX_LISTED are listed, and the summary says 10 more are not."""
        _, waits, ordered = planned([f"p{k:02d}" for k in range(60)])
        positions = {q.key: i for i, q in enumerate(ordered, 1)}
        data = namespace_summaries(waits, positions, len(ordered))["q"]
        pods = yaml.safe_load(data["pods.yaml"])
        assert [p["position"] for p in pods] == list(range(1, MAX_LISTED + 1))
        assert data["summary"] == (
            f"60 Pods of this namespace wait in gpupool's queue (60 in all). The first {MAX_LISTED} are listed; "
            "10 more are not."
        )

    def test_the_listed_pods_are_the_first_in_queue_order_whatever_order_the_pass_left(self) -> None:
        """The waits in reverse: still positions 1 to MAX_LISTED listed, in order."""
        _, waits, ordered = planned([f"p{k:02d}" for k in range(60)])
        positions = {q.key: i for i, q in enumerate(ordered, 1)}
        data = namespace_summaries(list(reversed(waits)), positions, len(ordered))["q"]
        pods = yaml.safe_load(data["pods.yaml"])
        assert [p["position"] for p in pods] == list(range(1, MAX_LISTED + 1))
        assert [p["pod"] for p in pods] == [f"p{k:02d}" for k in range(MAX_LISTED)]
