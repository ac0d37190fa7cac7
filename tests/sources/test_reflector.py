"""The reflector: list+watch of one resource through the real client, surviving the API's failures."""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib3
from kubernetes import client, config

from tests.builders import eventually, gpu_node
from webhook.sources.reflector import COLLECTOR_PAUSED, Obj, Reflector, ReflectorConfig
from webhook.testing.kubesim import KubeSim

slow = pytest.mark.slow  # starts the API simulator


class RecordingSink:
    """Keeps the objects the reflector says exist, by name, like a cache would."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.listing: set[str] = set()
        self.lists = 0
        self.lock = threading.Lock()

    def replace(self, kind: str, objects: list[Obj], first: bool, final: bool) -> None:
        with self.lock:
            if first:
                self.listing = set()
                self.lists += 1
            for obj in objects:
                self.objects[obj["metadata"]["name"]] = obj
                self.listing.add(obj["metadata"]["name"])
            if final:
                for gone in set(self.objects) - self.listing:
                    del self.objects[gone]

    def apply(self, kind: str, event: str, obj: Obj) -> None:
        with self.lock:
            name = obj["metadata"]["name"]
            if event == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj

    def names(self) -> set[str]:
        with self.lock:
            return set(self.objects)


CONFIG = ReflectorConfig(
    page_size=3,
    connect_timeout=1,
    list_timeout=1,
    watch_seconds=5,
    watch_read_timeout=1,
    backoff_initial=0.05,
    backoff_max=0.2,
)


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with KubeSim(bookmark_interval=0.2) as s:
        s.load(gpu_node(f"n{i}") for i in range(10))
        yield s


@pytest.fixture
def api(sim: KubeSim, tmp_path: Path) -> Any:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(sim.write_kubeconfig(tmp_path / "kc"))))


@pytest.fixture
def started(sim: KubeSim, api: Any) -> Iterator[tuple[Reflector, RecordingSink]]:
    sink = RecordingSink()
    reflector = Reflector("nodes", api.list_node, sink, CONFIG)
    reflector.start()
    assert reflector.synced.wait(10)
    sim.wait_for_watches(1)
    yield reflector, sink
    reflector.stop()


def names(n: int) -> set[str]:
    return {f"n{i}" for i in range(n)}


@slow
def test_paginated_list_then_watch(started: tuple[Reflector, RecordingSink], sim: KubeSim) -> None:
    """Ten nodes in pages of three, then every change through the watch."""
    reflector, sink = started
    assert sink.names() == names(10) and sim.list_requests("nodes") == 4
    sim.add(gpu_node("n10"))
    sim.delete("Node", None, "n0")
    eventually(lambda: sink.names() == names(11) - {"n0"})
    assert reflector.down_since is None


@slow
def test_bookmarks_advance_the_resource_version(started: tuple[Reflector, RecordingSink], sim: KubeSim) -> None:
    """A quiet watch still moves forward, so a resume after it does not replay or 410."""
    reflector, _ = started
    sim.add(gpu_node("other"))  # any write moves the global resourceVersion
    eventually(lambda: reflector.resource_version == sim.resource_version)


@slow
def test_dropped_watch_resumes_from_last_version_without_relist(
    started: tuple[Reflector, RecordingSink], sim: KubeSim
) -> None:
    """A cut connection is resumed from the last resourceVersion: changes meanwhile arrive, no re-list."""
    _, sink = started
    sim.drop_watches()
    sim.add(gpu_node("n10"))
    eventually(lambda: "n10" in sink.names())
    assert sink.lists == 1


@slow
def test_expired_version_relists_and_drops_deleted_objects(
    started: tuple[Reflector, RecordingSink], sim: KubeSim
) -> None:
    """410 Gone on resume: a fresh list, and objects deleted meanwhile are gone from the sink too."""
    reflector, sink = started
    sim.set_down(True)
    eventually(lambda: reflector.down_since is not None)
    sim.delete("Node", None, "n3")
    sim.compact()
    sim.set_down(False)
    eventually(lambda: sink.lists == 2 and sink.names() == names(10) - {"n3"})


@slow
def test_server_errors_back_off_and_recover(sim: KubeSim, api: Any) -> None:
    """500s on list are retried with backoff until the list succeeds."""
    sim.fail_next(3, 500, verb="list")
    sink = RecordingSink()
    reflector = Reflector("nodes", api.list_node, sink, CONFIG)
    reflector.start()
    try:
        assert reflector.synced.wait(10)
        assert reflector.errors >= 3 and sink.names() == names(10)
    finally:
        reflector.stop()


@slow
def test_stalled_api_times_out_instead_of_hanging(started: tuple[Reflector, RecordingSink], sim: KubeSim) -> None:
    """A partitioned API (no bytes at all) is noticed by the client-side read timeout, then recovered from."""
    reflector, sink = started
    sim.stall(3)
    eventually(lambda: reflector.down_since is not None, timeout=10)
    sim.add(gpu_node("late"))
    eventually(lambda: "late" in sink.names() and reflector.down_since is None, timeout=15)


# --- reconnect backoff, on a fake clock and a scripted API -------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeWatch:
    """A watch response that delivers bookmarks for `healthy_for` seconds of the fake clock, then breaks
    the way a cut connection does in urllib3."""

    def __init__(self, clock: FakeClock, healthy_for: float) -> None:
        self._clock = clock
        self._healthy_for = healthy_for

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for rv in ("2", "3"):
            self._clock.now += self._healthy_for / 2
            yield orjson.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}}) + b"\n"
        raise urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(0 bytes read)")

    def release_conn(self) -> None:
        pass


class FakeList:
    data = orjson.dumps({"metadata": {"resourceVersion": "1"}, "items": []})


class ScriptedApi:
    """`list_node` as the reflector calls it: lists answer, and each watch stays up `healthy_for` seconds
    then drops; or, with `down`, every call is refused as by an API server that is gone."""

    def __init__(self, clock: FakeClock, healthy_for: float = 0.0, down: bool = False) -> None:
        self._clock = clock
        self._healthy_for = healthy_for
        self._down = down

    def __call__(self, **kwargs: Any) -> Any:
        if self._down:
            raise urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes", ConnectionRefusedError(111, "refused"))
        return FakeWatch(self._clock, self._healthy_for) if kwargs.get("watch") else FakeList()


def reconnect_waits(api: ScriptedApi, clock: FakeClock, count: int) -> list[float]:
    """Run a reflector with the default configuration until it has waited `count` times; the waits."""
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        clock.now += seconds
        if len(waits) == count:
            reflector.stop()
        return False

    reflector = Reflector("nodes", api, RecordingSink(), ReflectorConfig(), clock=clock, wait=wait)
    reflector.run()
    return waits


DEFAULTS = ReflectorConfig()
JITTER, LOW_JITTER = 1.2, 0.8  # a wait is the backoff times 0.8 to 1.2


def test_ordinary_watch_drops_on_a_healthy_api_reconnect_at_once() -> None:
    """Seven watch drops, each after a minute of healthy watching, are each retried after the initial
    backoff: a healthy API's drops do not add up to long gaps in the live inventory."""
    clock = FakeClock()
    waits = reconnect_waits(ScriptedApi(clock, healthy_for=60), clock, count=7)
    assert max(waits) <= DEFAULTS.backoff_initial * JITTER


def test_an_api_that_is_down_is_retried_ever_more_slowly_up_to_the_cap() -> None:
    """An API that refuses every call is retried with exponential backoff that reaches the cap, never more."""
    clock = FakeClock()
    waits = reconnect_waits(ScriptedApi(clock, down=True), clock, count=12)
    assert waits[0] <= DEFAULTS.backoff_initial * JITTER
    assert waits[-1] >= DEFAULTS.backoff_max * LOW_JITTER and max(waits) <= DEFAULTS.backoff_max * JITTER


def test_watches_that_drop_as_soon_as_they_connect_still_back_off() -> None:
    """A watch that connects but breaks at once is no sign of health: those reconnects back off to the cap."""
    clock = FakeClock()
    waits = reconnect_waits(ScriptedApi(clock, healthy_for=0), clock, count=12)
    assert waits[-1] >= DEFAULTS.backoff_max * LOW_JITTER and max(waits) <= DEFAULTS.backoff_max * JITTER


# --- the garbage collector and list pages ---------------------------------------------------------------


class CollectorProbe(RecordingSink):
    """Records whether Python's garbage collector could run while each page was delivered."""

    def __init__(self) -> None:
        super().__init__()
        self.collector_on: list[bool] = []

    def replace(self, kind: str, objects: list[Obj], first: bool, final: bool) -> None:
        self.collector_on.append(gc.isenabled())
        super().replace(kind, objects, first, final)


@slow
def test_the_collector_waits_while_a_list_page_is_delivered_and_runs_again_after(sim: KubeSim, api: Any) -> None:
    """A page's objects are decoded, delivered and dropped with the collector paused (they hold no
    cycles to find); between pages and once the list is done it runs as before."""
    sink = CollectorProbe()
    reflector = Reflector("nodes", api.list_node, sink, CONFIG)
    reflector.start()
    try:
        assert reflector.synced.wait(10)
        assert sink.collector_on == [False] * 4 and sink.names() == names(10)
        assert gc.isenabled()
    finally:
        reflector.stop()


def test_overlapping_pauses_end_with_the_last_one() -> None:
    """Reflectors of several resources list at once: the collector runs again only when the last page
    in flight is done, and stays off if something else had turned it off."""
    assert gc.isenabled()
    first_in, release = threading.Event(), threading.Event()

    def page() -> None:
        with COLLECTOR_PAUSED:
            first_in.set()
            release.wait(5)

    other = threading.Thread(target=page)
    other.start()
    assert first_in.wait(5)
    with COLLECTOR_PAUSED:
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other page is still in flight
    release.set()
    other.join(5)
    assert gc.isenabled()
    gc.disable()
    try:
        with COLLECTOR_PAUSED:
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


# --- reading ahead: the next page while the sink takes this one -------------------------------------------


class SlowSink(RecordingSink):
    """Holds the first page it is given until the simulator has seen a second list request, and records
    how many it had seen by then; `during_first_page` runs then too."""

    def __init__(self, sim: KubeSim, during_first_page: Any = None) -> None:
        super().__init__()
        self.sim, self.during_first_page = sim, during_first_page
        self.requests_by_first_page_end: list[int] = []

    def replace(self, kind: str, objects: list[Obj], first: bool, final: bool) -> None:
        if first and not self.requests_by_first_page_end:
            eventually(lambda: self.sim.list_requests("nodes") >= 2, what="the next page asked for")
            if self.during_first_page is not None:
                self.during_first_page()
            self.requests_by_first_page_end.append(self.sim.list_requests("nodes"))
        super().replace(kind, objects, first, final)


@slow
def test_the_next_page_is_asked_for_while_the_sink_takes_this_one(sim: KubeSim, api: Any) -> None:
    """A sink slow over a page does not hold up the API's work on the next: its request is made while the
    sink still has the page, and the list still arrives whole, in pages, once."""
    sink = SlowSink(sim)
    reflector = Reflector("nodes", api.list_node, sink, CONFIG)
    reflector.start()
    try:
        assert reflector.synced.wait(10)
        assert sink.requests_by_first_page_end == [2]
        assert (sink.names(), sink.lists, sim.list_requests("nodes")) == (names(10), 1, 4)
    finally:
        reflector.stop()


@slow
def test_a_continue_token_that_expires_while_pages_are_read_ahead_starts_the_list_over(sim: KubeSim, api: Any) -> None:
    """The history is compacted while the first page is delivered and the second already read: the third
    page's request is 410, and the list starts over and ends whole, with the node written meanwhile."""

    def compact() -> None:
        sim.add(gpu_node("n10"))
        sim.compact()

    sink = SlowSink(sim, during_first_page=compact)
    reflector = Reflector("nodes", api.list_node, sink, CONFIG)
    reflector.start()
    try:
        assert reflector.synced.wait(10)
        assert (sink.names(), sink.lists, reflector.relists) == (names(11), 2, 2)
    finally:
        reflector.stop()


@slow
def test_stop_shuts_a_watch_that_waits_for_its_next_event_and_is_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With kube-apiserver's minute between bookmarks, a watch sits blocked on its connection: stop() shuts
    it, so the thread has ended when stop returns (it used to be waited out, then abandoned), and nothing is
    counted or logged as a failure."""
    with KubeSim(bookmark_interval=60) as quiet:
        quiet.load(gpu_node(f"n{i}") for i in range(3))
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(quiet.write_kubeconfig(tmp_path / "kc"))))
        # kube-apiserver's and the client's timeouts, which outlast the test: only stop() ends the watch.
        patient = dataclasses.replace(CONFIG, watch_seconds=300, watch_read_timeout=90)
        reflector = Reflector("nodes", api.list_node, RecordingSink(), patient)
        reflector.start()
        assert reflector.synced.wait(10)
        quiet.wait_for_watches(1)
        reflector.stop(timeout=5)
        assert (reflector.running, reflector.errors) == (False, 0)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
