"""Leader election on a Lease, timed by the monotonic clock: one leader, handover on stop, takeover only
after the Lease has gone unrenewed for its duration, and a leader that cannot renew stops before anyone
else may lead."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from webhook.queue.leader import Elector, LeaseTimes
from webhook.queue.ratelimit import TokenBucket
from webhook.sources.live import api_client
from webhook.sources.writes import LeaseError, LeaseRecord, LeaseStore
from webhook.testing import KubeSim


class FakeLeases:
    """A Lease with kube-apiserver's optimistic concurrency, in memory."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.down = False

    def get(self) -> LeaseRecord | None:
        if self.down:
            raise LeaseError("API down")
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord | None:
        if self.down:
            raise LeaseError("API down")
        if self.record is not None:
            return None
        return self._store(record)

    def replace(self, record: LeaseRecord) -> LeaseRecord | None:
        if self.down:
            raise LeaseError("API down")
        if self.record is None or record.resource_version != self.record.resource_version:
            return None
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = record._replace(resource_version=str(self.version))
        return self.record


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def candidates(leases: FakeLeases, clock: Clock, n: int = 2) -> list[Elector]:
    wall = lambda: datetime(2026, 12, 1, tzinfo=UTC)  # noqa: E731
    return [Elector(leases, f"gpupool-{i}", clock=clock, wall=wall) for i in range(n)]


def test_exactly_one_leads_and_the_other_follows() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = candidates(leases, clock)
    assert a.try_once() and not b.try_once()
    assert (a.leading(), b.leading()) == (True, False)
    for _ in range(20):  # renewing every retry period keeps it
        clock.now += 2.0
        assert a.try_once() and not b.try_once()
    assert leases.record is not None and leases.record.holder == "gpupool-0"


def test_a_silent_leader_is_replaced_only_after_the_lease_duration() -> None:
    """The leader stops renewing (killed): the follower may take over 15 s after it last saw the Lease
    change, not before; the old leader's own word (`leading`) had ended 10 s after its last renewal."""
    leases, clock = FakeLeases(), Clock()
    a, b = candidates(leases, clock)
    a.try_once()
    b.try_once()  # observes the record at t0
    clock.now += 10.0
    assert not a.leading()  # past its renew deadline
    assert not b.try_once()
    clock.now += 4.9
    assert not b.try_once()
    clock.now += 0.2
    assert b.try_once() and b.leading()
    assert leases.record is not None and leases.record.holder == "gpupool-1" and leases.record.transitions == 1


def test_a_leader_that_cannot_reach_the_api_stops_before_another_may_lead() -> None:
    leases, clock = FakeLeases(), Clock()
    (a,) = candidates(leases, clock, 1)
    a.try_once()
    leases.down = True
    clock.now += 9.9
    assert a.leading()
    with pytest.raises(LeaseError):
        a.try_once()
    clock.now += 0.2
    assert not a.leading()


def test_stopping_hands_the_lease_back_at_once() -> None:
    """On SIGTERM (a rolling update) the leader writes the Lease free: the next candidate takes it on its
    next try, without waiting out the duration."""
    leases, clock = FakeLeases(), Clock()
    a, b = candidates(leases, clock)
    a.try_once()
    b.try_once()
    a.stop()
    a.run()  # returns at once: stopped; hands the Lease back
    assert leases.record is not None and leases.record.holder == ""
    clock.now += 0.5
    assert b.try_once() and b.leading()


def test_two_candidates_elect_one_leader_on_the_simulated_api(tmp_path: Path) -> None:
    """Through the real client against the simulator's coordination.k8s.io/v1 Leases: one leader, the
    Lease as the API stores it, and the other takes over once the first hands it back."""
    with KubeSim() as sim:
        client = api_client(str(sim.write_kubeconfig(tmp_path / "kubeconfig")))
        stores = [LeaseStore(client, "gpupool-system", "gpupool") for _ in range(2)]
        a, b = (Elector(s, f"replica-{i}", LeaseTimes(duration=15, renew_deadline=10, retry=0.2))
                for i, s in enumerate(stores))  # fmt: skip
        assert a.try_once() and not b.try_once()
        lease = sim.get("leases", "gpupool-system", "gpupool")
        assert lease is not None and lease["spec"]["holderIdentity"] == "replica-0"
        assert lease["spec"]["leaseDurationSeconds"] == 15
        a.stop()
        a.run()
        assert b.try_once() and b.leading()
        assert sim.handler_errors == []


def test_the_writes_are_limited_to_qps_after_a_burst() -> None:
    """client-go's shape of limit: `burst` writes at once, then `qps` a second."""
    clock = Clock()
    bucket = TokenBucket(qps=10, burst=3, clock=clock)
    assert [bucket.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.delay() == pytest.approx(0.1)
    clock.now += 1.0
    assert bucket.delay() == 0.0


def test_a_candidate_still_listing_never_takes_the_lease_from_one_that_could_release() -> None:
    """The leader is killed; its Pod's restarted worker is still listing the cluster (half a minute at
    scale) when the Lease expires. It must not take the Lease: holding it, it would release nothing and keep
    the synced follower out. Once synced, it is an ordinary candidate."""
    leases, clock = FakeLeases(), Clock()
    wall = lambda: datetime(2026, 12, 1, tzinfo=UTC)  # noqa: E731
    synced = False
    killed, follower = candidates(leases, clock)
    restarted = Elector(leases, "gpupool-restarted", clock=clock, wall=wall, ready=lambda: synced)
    killed.try_once()
    follower.try_once()
    restarted.try_once()
    clock.now += 15.1  # the Lease unrenewed for its duration: anyone ready may take it
    assert not restarted.try_once() and not restarted.leading()
    assert follower.try_once()
    assert leases.record is not None and leases.record.holder == "gpupool-1"
    follower.stop()
    follower.run()  # hands the Lease back
    assert not restarted.try_once()  # free, but still not synced
    synced = True
    assert restarted.try_once() and restarted.leading()


def test_a_candidate_still_listing_does_not_create_the_lease() -> None:
    leases, clock = FakeLeases(), Clock()
    (a,) = candidates(leases, clock, 1)
    a.ready = lambda: False
    assert not a.try_once() and leases.record is None


def test_a_restarted_process_of_the_same_identity_takes_over_at_once_with_a_new_term() -> None:
    """The leader process of a Pod (identity POD_NAME) dies while leading and is restarted: the new process
    takes the Lease without waiting out its duration, and as a new term, so a release the dead process still
    had in flight carries a term that is over (the validating webhook refuses it)."""
    leases, clock = FakeLeases(), Clock()
    wall = lambda: datetime(2026, 12, 1, tzinfo=UTC)  # noqa: E731
    dead = Elector(leases, "gpupool-0", clock=clock, wall=wall)
    assert dead.try_once()
    old_term = dead.term
    clock.now += 1.0  # well within the Lease's 15 s
    restarted = Elector(leases, "gpupool-0", clock=clock, wall=wall)
    assert restarted.try_once() and restarted.leading()
    assert restarted.term == old_term + 1
    assert leases.record is not None and restarted.acquired_version == leases.record.resource_version
    clock.now += 2.0  # and from then on it renews its own term
    assert restarted.try_once() and restarted.term == old_term + 1
