"""The leader's pass counts the charges of Pods that name their node (webhook.pools.charges) as their
admission counts them: a release never takes the quota or the room of a charged Pod its watch has not
shown yet, and a pass that cannot read the charges releases nothing. It records its releases with the
charges, at the version it read, before it sends them (webhook.queue.records): a charge written meanwhile
makes it release nothing, and the next pass decides with it."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from tests.builders import gpu_node, index_of, pod, policy
from tests.queue.fakes import Events, Inventory, Leading, SlowApi
from tests.queue.helpers import enqueue, queued_pod
from webhook.pools.charges import (
    RECORD_BYTES,
    RELEASE_SECONDS,
    Charge,
    ChargeError,
    from_json,
    pending,
    record_bytes,
)
from webhook.queue import records
from webhook.queue.runner import Runner
from webhook.queue.waiting import Waiting
from webhook.sources.charge_store import CHARGES

POLICY = policy("namespaces:\n  q: {placement: queue, classQuota: {medium: 1}}\n  other: {placement: queue}\n")
NOW = 1_000_000.0  # the wall clock the charges expire by


class Store:
    """The charges as the API holds them, written only at the version they were read at (as a Lease's
    update with its resourceVersion); `failing`: every read fails as an unreachable API's would;
    `meanwhile`: called once at the next write, before it commits (another replica's write)."""

    def __init__(self, charges: list[Charge]) -> None:
        self.charges = charges
        self.version = 7
        self.failing = False
        self.reads = 0
        self.meanwhile: Callable[[], None] | None = None

    def read(self) -> tuple[list[Charge], str]:
        self.reads += 1
        if self.failing:
            raise ChargeError("reading Lease gpupool-system/gpupool-charges: 503 Service Unavailable")
        return list(self.charges), str(self.version)

    def write(self, charges: list[Charge], version: str) -> bool:
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        if version != str(self.version):
            return False
        self.charges, self.version = list(charges), self.version + 1
        return True

    def charge(self, charge: Charge) -> None:
        """Another replica's admission charges a Pod that names its node."""
        self.charges, self.version = [*self.charges, charge], self.version + 1


def one_gpu(name: str, namespace: str, seconds: float = 60.0) -> Charge:
    return Charge(namespace, name, "t4-a", (("nvidia.com/gpu", 1),), NOW + seconds)


def runner_for(gpus: int, store: Store, names: list[tuple[str, str]]) -> tuple[Runner, Events]:
    index = index_of([gpu_node("t4-a", "Tesla-T4", gpus)], POLICY)
    waiting = Waiting(POLICY)
    objs = [
        queued_pod(name, ns, POLICY, index, created=f"2026-12-01T10:00:0{k}Z") for k, (ns, name) in enumerate(names)
    ]
    enqueue(objs, index, waiting)
    api = SlowApi({(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}, together=1)
    events = Events()
    runner = Runner(Inventory(index), waiting, Leading(), api, events=events, charges=store, wall=lambda: NOW)  # type: ignore[arg-type]
    return runner, events


def released(events: Events) -> list[str]:
    return sorted(e.pod for e in events.recorded if e.reason == "Released")


def test_a_charge_takes_its_namespaces_class_quota_from_the_release() -> None:
    """q's one medium GPU is charged to a Pod naming its node: q's queued Pod waits, while another
    namespace's Pod is released to the room that is left."""
    runner, events = runner_for(4, Store([one_gpu("bound", "q")]), [("q", "job"), ("other", "job")])
    runner.run_pass()
    assert released(events) == ["job"]
    assert [e.namespace for e in events.recorded if e.reason == "Released"] == ["other"]


def test_a_charge_takes_its_room_on_its_node_until_it_expires() -> None:
    """One T4, charged to another namespace's Pod: nothing is released into it; once the charge has
    expired, the queued Pod is."""
    store = Store([one_gpu("bound", "other", seconds=30.0)])
    runner, events = runner_for(1, store, [("q", "job")])
    runner.run_pass()
    assert released(events) == []
    store.charge(one_gpu("bound", "other", seconds=-1.0))
    store.charges = store.charges[1:]
    runner.run_pass()
    assert released(events) == ["job"]


def test_a_pass_that_cannot_read_the_charges_releases_nothing() -> None:
    """The API does not answer the charges' read: the pass releases nothing (it cannot tell what they
    hold); the next pass that reads them releases."""
    store = Store([])
    store.failing = True
    runner, events = runner_for(1, store, [("q", "job")])
    runner.run_pass()
    assert released(events) == []
    store.failing = False
    runner.run_pass()
    assert released(events) == ["job"]


def test_a_pass_with_nothing_queued_does_not_read_the_charges() -> None:
    """The read is an API round trip: a pass with no Pod to release makes none."""
    store = Store([one_gpu("bound", "q")])
    runner, _ = runner_for(1, store, [])
    runner.run_pass()
    assert store.reads == 0


def test_a_release_by_hand_its_watch_has_not_shown_takes_its_namespaces_quota_from_the_leader() -> None:
    """`kubectl gpupool release` recorded q/hand against q's one medium GPU, and the leader's watch has not
    shown it yet: q's queued Pod waits for the quota, another namespace's goes (before: the leader never
    counted releases, and released q's Pod too, two GPUs against classQuota 1)."""
    hand = Charge("q", "hand", "", (("nvidia.com/gpu", 1),), NOW + 60, "nvidia/medium/Tesla-T4", by="alice")
    runner, events = runner_for(4, Store([hand]), [("q", "job"), ("other", "job")])
    runner.run_pass()
    assert [e.namespace for e in events.recorded if e.reason == "Released"] == ["other"]


def test_a_pass_records_its_releases_with_the_charges_before_it_sends_them() -> None:
    """The release of q's Pod is in the charges (its namespace, pool, pool labels and GPUs) once the pass
    has sent it, beside the charge that still counts: an admission through another replica counts it."""
    store = Store([one_gpu("bound", "other")])
    runner, events = runner_for(4, store, [("q", "job")])
    runner.run_pass()
    assert released(events) == ["job"]
    (charge, release) = store.charges
    assert charge == one_gpu("bound", "other")
    assert release.release and release.key == ("q", "job") and release.node == ""
    assert release.pool == "nvidia/medium/Tesla-T4" and release.devices == (("nvidia.com/gpu", 1),)
    assert ("gpu.accelerator/class", "medium") in release.selector
    assert NOW < release.expires <= NOW + 60


def test_a_charge_written_while_a_pass_decides_stops_its_releases() -> None:
    """Another replica charges q's one medium GPU after the pass read the charges and before it recorded
    its release: the record is refused (409), nothing is sent, and the next pass, which reads the charge,
    leaves q's Pod waiting for the quota (before: both went, two GPUs against classQuota 1)."""
    store = Store([])
    store.meanwhile = lambda: store.charge(one_gpu("bound", "q"))
    runner, events = runner_for(4, store, [("q", "job")])
    runner.run_pass()
    runner.run_pass()
    assert released(events) == []
    assert [c.key for c in store.charges] == [("q", "bound")]


def test_a_record_drops_a_shown_release_once_it_is_old_and_one_whose_pod_is_gone() -> None:
    """What the leader's next record keeps of the releases: one its watch shows released, for
    RELEASE_SECONDS after it was recorded (other replicas' watches may be later); not after, and never
    one whose Pod is gone (its room is nobody's)."""
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), pod("shown", "q", gpus=1, node="t4-a", phase="Running")], POLICY)
    ttl = POLICY.defaults.reservation_seconds

    def release(name: str, age: float) -> Charge:
        return Charge("q", name, "", (("nvidia.com/gpu", 1),), NOW - age + ttl, "nvidia/medium/Tesla-T4")

    fresh, old, gone = release("shown", 1.0), release("shown", RELEASE_SECONDS + 1), release("gone", 1.0)
    assert records.kept([fresh, gone], index, NOW, ttl) == [fresh]
    assert records.kept([old], index, NOW, ttl) == []


class SizedStore(Store):
    """A Store that refuses, as kube-apiserver does, a Lease whose annotations take over 256 KiB."""

    def write(self, charges: list[Charge], version: str) -> bool:
        if len(CHARGES) + record_bytes(charges) > 256 * 1024:
            self.refused += 1
            raise ChargeError(
                "Lease.coordination.k8s.io is invalid: metadata.annotations: Too long: must have at most 262144 bytes"
            )
        return super().write(charges, version)

    refused = 0


def test_releases_of_long_names_are_recorded_within_what_the_api_accepts() -> None:
    """1,500 queued Pods with 200-character names and room for all, passes a few seconds apart: each pass
    releases no more than the Lease's annotation can record, so every record is accepted, and releases go
    on as the shown ones are dropped (before: counted 1,000 at most whatever their length, the second
    pass's record took 370 KB, was refused by the API, and no Pod was released until the records expired)."""
    store = SizedStore([])
    names = [("other", f"{'x' * 190}-{k:05d}") for k in range(1500)]
    runner, events = runner_for(1500, store, names)
    clock = [NOW]
    runner._wall = lambda: clock[0]  # the wall clock the records age by
    counts = []
    for _ in range(8):
        runner.run_pass()
        counts.append(len(released(events)))
        clock[0] += RELEASE_SECONDS / 2
    assert store.refused == 0
    assert counts[-1] > counts[0] > 0, counts
    assert record_bytes(store.charges) <= RECORD_BYTES


def test_a_gang_too_large_to_record_one_by_one_is_recorded_whole_and_counted_by_every_replica() -> None:
    """A gang of 800 Pods with 253-character names, room for all: one entry per member would take over what
    the Lease may hold (RECORD_BYTES). The gang is released with its record, one entry for the gang, and
    the Pod queued behind it next; a replica whose watch has not shown the gang counts its 800 GPUs against
    the namespace's quota, and stops counting them once its watch shows them (before: the gang went
    unrecorded, and a `now` Pod or a Pod naming its node could be placed in its room)."""
    store = SizedStore([])
    nodes = [gpu_node("t4-a", "Tesla-T4", 801)]
    index = index_of(nodes, POLICY)
    waiting = Waiting(POLICY)
    ann = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "big", "gpupool.io/group-size": "800"}
    gang = [
        queued_pod(f"{'x' * 248}-{i:04d}", "other", POLICY, index, annotations=ann, created="2026-12-01T09:00:00Z")
        for i in range(800)
    ]
    behind = queued_pod("after", "other", POLICY, index, created="2026-12-01T10:00:00Z")
    enqueue([*gang, behind], index, waiting)
    api = SlowApi({(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in [*gang, behind]}, together=1)
    events = Events()
    runner = Runner(Inventory(index), waiting, Leading(), api, events=events, charges=store, wall=lambda: NOW)  # type: ignore[arg-type]
    one = Charge("other", gang[0]["metadata"]["name"], "", (("nvidia.com/gpu", 1),), NOW, "nvidia/medium/Tesla-T4")
    assert record_bytes([one] * 800) > RECORD_BYTES
    for _ in range(14):
        runner.run_pass()
    assert store.refused == 0
    assert len(released(events)) == 801
    assert from_json(orjson.loads(orjson.dumps([c.as_json() for c in store.charges]))) == store.charges
    late = index_of(nodes, POLICY)  # another replica, whose watch has shown none of it yet
    with pending(late, store.charges, NOW, 0.0):
        assert late.usage.class_used("other", "medium") == 801
    with pending(index, store.charges, NOW, 0.0):  # the leader's watch shows them all: nothing twice
        assert index.usage.class_used("other", "medium") == 801
