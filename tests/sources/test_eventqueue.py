"""Events per namespace in turn, rate-limited and coalesced: a flood of `Queued` Events in one namespace
neither delays another namespace's `Released` nor loads the API without bound."""

from __future__ import annotations

from pathlib import Path

from tests.builders import eventually
from webhook.sources.eventqueue import NAMESPACE_BURST, NAMESPACE_PENDING, NAMESPACE_QPS, Event, EventQueue
from webhook.sources.live import api_client
from webhook.sources.writes import EventRecorder
from webhook.testing import KubeSim


def queued(k: int, namespace: str = "flood") -> Event:
    return Event(namespace, f"job-{k}", f"uid-{k}", "Queued", "gpupool queue: no room")


def released(namespace: str = "v", pod: str = "victim") -> Event:
    return Event(namespace, pod, f"uid-{pod}", "Released", "gpupool released the Pod to pool nvidia/medium/Tesla-T4")


def drain(events: EventQueue, seconds: float, step: float = 0.01) -> list[tuple[float, Event]]:
    """What a sender taking Events as fast as they are let go posts over `seconds`, and when."""
    now, posted = 0.0, []
    while now < seconds:
        event, _ = events.take(now)
        if event is None:
            now += step
        else:
            posted.append((now, event))
    return posted


def test_a_flood_in_one_namespace_does_not_delay_another_namespaces_release_event() -> None:
    """Ten thousand Pods told they wait in one namespace, then a Pod of another released: its `Released`
    Event goes out at once, not after the flood."""
    events = EventQueue(0.0)
    for k in range(10_000):
        events.put(queued(k))
    events.put(released())

    posted = drain(events, 1.0)

    first = next(i for i, (_, e) in enumerate(posted) if e.pod == "victim")
    assert first <= 1 and posted[first][0] == 0.0


def test_a_namespaces_event_volume_is_bounded_and_the_rest_coalesced() -> None:
    """Over a minute the flooding namespace posts its burst and then NAMESPACE_QPS a second; what it could
    not post is coalesced into a count carried by the last Event, not kept one by one."""
    events = EventQueue(0.0)
    for k in range(10_000):
        events.put(queued(k))
    assert len(events) <= NAMESPACE_PENDING

    posted = drain(events, 60.0)

    assert len(posted) <= NAMESPACE_BURST + 60 * NAMESPACE_QPS + 1
    rest = drain_after(events, posted)
    assert "more Pods of this namespace queued meanwhile" in rest[-1].message
    assert events.coalesced == 10_000 - NAMESPACE_PENDING


def drain_after(events: EventQueue, posted: list[tuple[float, Event]]) -> list[Event]:
    now = posted[-1][0] if posted else 0.0
    rest = []
    while len(events):
        now += 1.0
        event, _ = events.take(now)
        if event is not None:
            rest.append(event)
    return rest


def test_the_same_pod_and_reason_waiting_is_posted_once_with_the_newest_message() -> None:
    events = EventQueue(0.0)
    events.put(queued(1)._replace(message="first"))
    events.put(queued(1)._replace(message="second"))

    assert [e.message for _, e in drain(events, 1.0)] == ["second"]


def test_outcomes_go_before_queued_events_of_their_namespace() -> None:
    events = EventQueue(0.0)
    for k in range(NAMESPACE_BURST * 2):
        events.put(queued(k, "q"))
    events.put(released("q", "done"))

    posted = [e.pod for _, e in drain(events, 1.0)]

    assert posted.index("done") <= 1


def test_the_recorder_posts_another_namespaces_release_before_the_flood(tmp_path: Path) -> None:
    """Through the real client against the API simulator: two thousand `Queued` Events of one namespace,
    then a `Released` of another; when it is stored, at most the flood's burst went before it."""
    with KubeSim() as sim:
        recorder = EventRecorder(api_client(str(sim.write_kubeconfig(tmp_path / "kubeconfig"))), "replica-a")
        for k in range(2_000):
            recorder.record(queued(k))
        recorder.record(released())
        recorder.start()
        try:
            eventually(lambda: bool(sim.objects("Event", "v")), 30.0, "the victim's Released Event")
            before = len(sim.objects("Event", "flood"))
        finally:
            recorder.stop()
        assert before <= NAMESPACE_BURST + 1
        assert [e["reason"] for e in sim.objects("Event", "v")] == ["Released"]
