"""Tests for webhook.admission.charging and webhook.pools.charges: Pods that name their node in a namespace
whose Pods are queued are decided against the charges in the API, exactly across replicas.

Two replicas, each with its own inventory, share one store that behaves as the Kubernetes API does with a
resourceVersion precondition (a write at an old version is refused).
"""

from __future__ import annotations

import threading
from typing import Any

from tests.admission.clocked import Clock, CurrentInventory
from tests.builders import fleet, gpu_node, index_of, pod, policy
from webhook.admission.core import Admitter
from webhook.admission.validation import Charges, Trusted, Validator
from webhook.domain.policy import Policy
from webhook.pools.charges import Charge, ChargeError, counting, from_json, unseen

POLICY = policy("namespaces: {q: {placement: queue, classQuota: {medium: 2}}}")
Obj = dict[str, Any]


class ApiCharges:
    """The charges as the API keeps them: a version that every write bumps, and writes at an old one refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stored: list[Any] = []
        self._version = 0
        self.conflicts = 0

    def read(self) -> tuple[list[Charge], str]:
        with self._lock:
            return from_json(self._stored), str(self._version) if self._version else ""

    def write(self, charges: list[Charge], version: str) -> bool:
        with self._lock:
            if version != (str(self._version) if self._version else ""):
                self.conflicts += 1
                return False
            self._stored = [c.as_json() for c in charges]
            self._version += 1
            return True


class Wall:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Replica:
    """One replica: its Admitter and Validator on an inventory of its own, charging in `store`."""

    def __init__(self, store: ApiCharges, wall: Wall, pol: Policy = POLICY) -> None:
        self.inventory = CurrentInventory(index_of(fleet(), pol), "test")
        self.admitter = Admitter(pol, self.inventory, clock=Clock(), charges=True)
        trusted = Trusted.of("gpupool-system", "gpupool-webhook")
        self.validator = Validator(self.admitter, trusted, charges=Charges(store, wall))

    def mutate(self, obj: Obj) -> Obj:
        result = self.admitter.admit(obj, namespace="q")
        assert result.allowed, result.message
        return obj


def bound(name: str, node: str = "t4-a") -> Obj:
    return pod(name, "q", gpus=1, node=node)


def create(mutating: Replica, validating: Replica, obj: Obj) -> tuple[bool, str]:
    """A CREATE as kube-apiserver makes it: the mutating call on one replica, the validating on another;
    (allowed, the refusal's reason code)."""
    stored = mutating.mutate(obj)
    checked = validating.validator.validate_create(stored, namespace="q").verdict
    return checked.allowed, checked.reason


def test_pods_that_name_their_node_through_two_replicas_get_exactly_the_class_quota() -> None:
    """Four 1-GPU Pods naming their node, in a namespace that queues, under classQuota {medium: 2}, through
    two replicas (mutating and validating calls on either): exactly two are admitted, the others refused
    naming the quota. No replica reserves them in memory: the charges are the reservations."""
    store, wall = ApiCharges(), Wall()
    a, b = Replica(store, wall), Replica(store, wall)
    routes = [(a, a), (b, b), (a, b), (b, a)]
    answers = [create(m, v, bound(f"p{i}")) for i, (m, v) in enumerate(routes)]
    assert [allowed for allowed, _ in answers] == [True, True, False, False]
    assert [reason for _, reason in answers[2:]] == ["class-quota", "class-quota"]
    assert [c.name for c in store.read()[0]] == ["p0", "p1"]
    for replica in (a, b):
        with replica.inventory.read() as index:
            assert index.usage.reservations == 0


def test_a_write_that_lost_the_race_is_decided_again() -> None:
    """Another replica's charge landing between this call's read and write (a 409) is read and counted:
    the Pod is decided again against it."""
    store, wall = ApiCharges(), Wall()
    a, b = Replica(store, wall), Replica(store, wall)
    create(a, a, bound("p0"))
    real_read = store.read
    raced: list[tuple[bool, str]] = []
    started = []

    def read_then_race() -> tuple[list[Charge], str]:
        charges = real_read()
        if not started:  # b's charge lands after a's first read
            started.append(True)
            raced.append(create(b, b, bound("p1")))
        return charges

    store.read = read_then_race  # type: ignore[method-assign]
    assert create(a, a, bound("p2"))[0] is False
    assert raced == [(True, "")]
    assert store.conflicts == 1


def test_a_charge_whose_pod_never_showed_up_frees_its_room_once_expired() -> None:
    """Two charged Pods whose creation failed after the validating call never show up; once their charges
    expire (reservationSeconds), the quota's room is free again."""
    store, wall = ApiCharges(), Wall()
    a, b = Replica(store, wall), Replica(store, wall)
    assert create(a, a, bound("p0"))[0] and create(b, b, bound("p1"))[0]
    assert create(a, b, bound("p2"))[0] is False
    wall.now += POLICY.defaults.reservation_seconds + 1
    assert create(b, a, bound("p3"))[0] is True
    assert [c.name for c in store.read()[0]] == ["p3"]  # the expired ones were dropped by the write


def test_a_dry_run_is_decided_against_the_charges_and_writes_none() -> None:
    """A dry run (kubectl apply --dry-run=server) of a Pod naming its node is answered as its creation
    would be, against the charges other replicas wrote, and writes no charge (the validating webhook's
    sideEffects: NoneOnDryRun)."""
    store, wall = ApiCharges(), Wall()
    a, b = Replica(store, wall), Replica(store, wall)
    ahead = a.validator.validate_create(a.mutate(bound("dry0")), namespace="q", dry_run=True)
    assert ahead.verdict.allowed and ahead.reservation == ""
    assert store.read() == ([], "")
    assert create(a, a, bound("p0"))[0] and create(a, a, bound("p1"))[0]
    charged = store.read()
    checked = b.validator.validate_create(b.mutate(bound("dry1")), namespace="q", dry_run=True)
    assert (checked.verdict.allowed, checked.verdict.reason) == (False, "class-quota")
    assert store.read() == charged


def test_under_on_stale_deny_a_stale_inventory_refuses_and_charges_nothing() -> None:
    """A Pod naming its node in a namespace that queues follows onStale as a placed Pod does: while the
    inventory is stale, its validating call is refused (503, reason stale) and no charge is written."""
    store, wall = ApiCharges(), Wall()
    a = Replica(store, wall, policy("defaults: {onStale: deny}\nnamespaces: {q: {placement: queue}}"))
    stored = a.mutate(bound("p0"))
    a.inventory.age = 600.0
    checked = a.validator.validate_create(stored, namespace="q").verdict
    assert (checked.allowed, checked.code, checked.reason) == (False, 503, "stale")
    assert store.read() == ([], "")


T4_POOL = "nvidia/medium/Tesla-T4"
T4_PINS = (("gpu.accelerator/class", "medium"), ("nvidia.com/gpu.product", "Tesla-T4"))


def released(name: str, gpus: int, expires: float) -> Charge:
    """A release as the queue's leader records it (webhook.queue.records): no node, its pool and pins."""
    return Charge("q", name, "", (("nvidia.com/gpu", gpus),), expires, T4_POOL, T4_PINS)


def test_the_leaders_releases_count_until_they_expire() -> None:
    """The leader recorded the release of q's 2-GPU Pod, which this replica's watch has not shown yet: a Pod
    naming its node against classQuota {medium: 2} is refused naming the quota (before, the release was not
    in the charges: admitted, 3 GPUs); once the release has expired (its watch delay covered), admitted."""
    store, wall = ApiCharges(), Wall()
    a = Replica(store, wall)
    assert store.write([released("r0", 2, wall.now + 10)], "")
    assert create(a, a, bound("p0")) == (False, "class-quota")
    wall.now += 11
    assert create(a, a, bound("p1")) == (True, "")
    assert [c.name for c in store.read()[0]] == ["p1"]  # the expired release was dropped by the write


class TestUnseen:
    """The counting rule: a charge counts on top of the index until the watch shows its Pod or it expires."""

    def test_a_charge_counts_until_the_watch_shows_its_pod_or_it_expires(self) -> None:
        index = index_of([*fleet(), pod("shown", "q", gpus=1, node="t4-a", phase="Running")], POLICY)
        shown = Charge("q", "shown", "t4-a", (("nvidia.com/gpu", 1),), 200.0)
        waiting = Charge("q", "waiting", "t4-a", (("nvidia.com/gpu", 1),), 200.0)
        expired = Charge("q", "expired", "t4-a", (("nvidia.com/gpu", 1),), 100.0)
        itself = Charge("q", "itself", "t4-a", (("nvidia.com/gpu", 1),), 200.0)
        counted = unseen([shown, waiting, expired, itself], index, 150.0, itself=("q", "itself"))
        assert counted == [waiting]

    def test_a_release_counts_until_the_watch_shows_its_pod_and_never_for_the_leader(self) -> None:
        index = index_of([*fleet(), pod("shown", "q", gpus=1, node="t4-a", phase="Running")], POLICY)
        shown, waiting = released("shown", 1, 200.0), released("waiting", 1, 200.0)
        assert unseen([shown, waiting], index, 150.0) == [waiting]
        assert unseen([shown, waiting], index, 150.0, releases=False) == []
        with counting(index, [waiting], 0.0):
            assert index.usage.class_used("q", "medium") == 2
        assert index.usage.class_used("q", "medium") == 1

    def test_counted_charges_hold_their_node_and_class_only_inside_the_with(self) -> None:
        index = index_of(fleet(), POLICY)
        charge = Charge("q", "waiting", "t4-a", (("nvidia.com/gpu", 3),), 200.0)
        with counting(index, [charge], 0.0):
            assert index.usage.class_used("q", "medium") == 3
        assert index.usage.class_used("q", "medium") == 0

    def test_a_damaged_entry_is_left_out(self) -> None:
        good = Charge("q", "p", "t4-a", (("nvidia.com/gpu", 1),), 5.0)
        release = released("r", 1, 5.0)
        bad_pool = ["q", "r", "", [["nvidia.com/gpu", 1]], 5.0, "not-a-pool", []]
        entries = [good.as_json(), ["q"], "x", ["q", "p", "n", [["r", -1]], 1], release.as_json(), bad_pool]
        assert from_json(entries) == [good, release]
        assert from_json({"not": "a list"}) == []


NOW_POLICY = policy("namespaces: {q: {placement: queue}, n: {placement: now}}")


def now_pod(gpus: int) -> Obj:
    annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "now", "namespace": "n", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "cuda"}]},
    }


def now_admitter(store: ApiCharges, wall: Wall) -> Admitter:
    inventory = CurrentInventory(index_of(fleet(), NOW_POLICY), "test")
    return Admitter(NOW_POLICY, inventory, clock=Clock(), charges=True, store=store, wall=wall)


class FailingCharges(ApiCharges):
    def read(self) -> tuple[list[Charge], str]:
        raise ChargeError("reading Lease gpupool-system/gpupool-charges: 503 Service Unavailable")


def test_a_now_pod_is_placed_counting_the_releases_its_watch_has_not_shown() -> None:
    """The leader recorded the releases of two 4-GPU Pods to the T4 pool (a half-released gang's waiting
    members, say), which this replica's watch has not shown: a 4-GPU `now` Pod goes to the L4 pool, where
    there is room (before: to the T4 pool, into the released Pods' room); once the records expired, to T4."""
    store, wall = ApiCharges(), Wall()
    assert store.write([released("g-2", 4, wall.now + 60), released("g-3", 4, wall.now + 60)], "")
    admitter = now_admitter(store, wall)
    result = admitter.admit(now_pod(4), namespace="n", dry_run=True)
    assert result.placement is not None and str(result.placement.pool) == "nvidia/medium/NVIDIA-L4", result.message
    wall.now += 61
    result = admitter.admit(now_pod(4), namespace="n", dry_run=True)
    assert result.placement is not None and str(result.placement.pool) == T4_POOL


def test_a_now_pod_is_placed_without_the_charges_when_they_cannot_be_read() -> None:
    """The Lease cannot be read: the `now` Pod is placed on the index alone, never refused for it."""
    admitter = now_admitter(FailingCharges(), Wall())
    assert admitter.admit(now_pod(1), namespace="n").allowed


def test_with_one_pool_a_now_pod_is_placed_into_recorded_room_to_wait_unless_the_policy_denies() -> None:
    """The one pool's 8 T4s: the leader recorded two 4-GPU releases (a half-released gang's waiting members)
    this replica's watch has not shown. Counting them the pool has no room, and there is no other pool:
    under `onNoCapacity: warn` the `now` Pod is placed there all the same, told it will wait (the scheduler,
    which sees 8 free GPUs, may bind it into the recorded room: docs/queue.md#gangs says why gpupool cannot
    stop it); under `deny` it is refused, naming the pool's lack of room."""
    nodes = [gpu_node("t4-a", "Tesla-T4", 4, memory_mib=15360), gpu_node("t4-b", "Tesla-T4", 4, memory_mib=15360)]
    for setting, allowed in (("warn", True), ("deny", False)):
        pol = policy(
            f"defaults: {{onNoCapacity: {setting}}}\nnamespaces: {{q: {{placement: queue}}, n: {{placement: now}}}}"
        )
        store, wall = ApiCharges(), Wall()
        assert store.write([released("g-2", 4, wall.now + 60), released("g-3", 4, wall.now + 60)], "")
        inventory = CurrentInventory(index_of(nodes, pol), "test")
        admitter = Admitter(pol, inventory, clock=Clock(), charges=True, store=store, wall=wall)
        result = admitter.admit(now_pod(4), namespace="n", dry_run=True)
        assert result.allowed is allowed, result.message
        if allowed:
            assert result.placement is not None and str(result.placement.pool) == T4_POOL
            assert any("the Pod will wait" in w for w in result.warnings), result.warnings
        else:
            assert "Tesla-T4" in result.message, result.message
