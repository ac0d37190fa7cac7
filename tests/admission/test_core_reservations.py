"""The Admitter across a burst of admissions: reservations fill the free GPUs, then fall back, wait or
are denied; dry runs and denials hold nothing; reservations expire, are settled by the watch, count
against quotas, and a re-invoked, pre-patched or forged review is counted once and released in time.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import pytest

from tests.admission.admitting import ESCAPE_POLICY, FakeClock, admitter, daemonset_pod, escape_fleet, running
from tests.admission.demo import (
    A100,
    POOL_KEY,
    T4,
    apply,
    demo_policy,
    shared_demo_index,
)
from tests.builders import GPU_TAINT, gpu_node, index_of, pod, quota
from tests.builders import policy as make_policy
from webhook.admission.core import Admitter, evaluate
from webhook.admission.verdict import Verdict
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import pod_from_obj
from webhook.sources.snapshot import SnapshotInventory


class BusyInventory:
    """An inventory whose pools cannot be read now (a watch applying a large re-list holds them)."""

    ready = True

    def read(self) -> AbstractContextManager[PoolIndex]:
        raise AssertionError("the pools were read")

    def age_seconds(self) -> float:
        return 0.0

    def current_since(self) -> float | None:
        return None

    def close(self) -> None:
        pass


def test_a_pod_that_is_not_gpupools_business_is_answered_without_the_inventory() -> None:
    """A CPU Pod, a malformed one or a mirror Pod is answered without waiting for the pools: only placing
    (or checking) a GPU Pod takes the inventory's lock, which the watches need too."""
    adm = Admitter(demo_policy(), BusyInventory())
    assert adm.admit(pod("web", annotations={}), namespace="ml").outcome == "unchanged"
    assert adm.admit(pod("bad", annotations={"gpupool.io/gpu-count": "lots"}), namespace="ml").code == 400
    mirror = pod("static", gpus=1, node="t4-a", annotations={"kubernetes.io/config.mirror": "x"})
    assert adm.admit(mirror, namespace="ml").outcome == "unchanged"
    with pytest.raises(AssertionError, match="pools were read"):
        adm.admit(pod("gpu", gpus=1), namespace="ml")


# --- Admitter: reservations across a burst of admissions --------------------------------------------------


def burst_fleet(extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Two T4 nodes with 3 and 2 free GPUs (5 in all) and an A100 node with 8 free."""
    return [
        gpu_node("t4-a", "Tesla-T4", 4),
        gpu_node("t4-b", "Tesla-T4", 4),
        gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high", taints=[GPU_TAINT]),
        running("busy-a", "t4-a", 1),
        running("busy-b", "t4-b", 2),
        *(extra or []),
    ]


def burst_pod(i: int, count: int = 1, **annotations: str) -> dict[str, Any]:
    """The i-th Pod of a burst, as a Job controller sends them: generateName only."""
    extra = {f"gpupool.io/{key}": value for key, value in annotations.items()}
    obj = pod(annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(count), **extra})
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = f"burst-{i}-"
    return obj


def pools_of(verdicts: list[Verdict]) -> list[str]:
    return [str(v.placement.pool) if v.placement else "denied" for v in verdicts]


def test_burst_fills_the_free_gpus_then_falls_back() -> None:
    """7 single-GPU Pods with fallback against 5 free T4 GPUs: exactly 5 go to T4, with no warning,
    then the rest fall back to the A100 pool, each with a warning."""
    adm, _, _ = admitter(burst_fleet())
    pods = [burst_pod(i, fallback="true") for i in range(7)]
    results = [adm.admit(obj, namespace="ml") for obj in pods]
    assert pools_of(results) == [T4] * 5 + [A100] * 2
    # One Pod shape, two pools: each Pod's patch is its own pool's (a patch remembered per shape alone
    # would pin the A100 Pods to T4 and leave them without the A100's GPU toleration).
    for obj, result in zip(pods, results, strict=True):
        assert result.placement is not None
        patched = apply(obj, result.patch)
        assert patched["metadata"]["annotations"][POOL_KEY] == str(result.placement.pool)
        assert set(result.placement.selector) <= set(patched["spec"]["nodeSelector"].items())
        tolerated = [t.get("key") for t in patched["spec"].get("tolerations", [])]
        assert ("nvidia.com/gpu" in tolerated) is (str(result.placement.pool) == A100)
    assert all(r.warnings == () for r in results[:5])
    assert all(r.warnings for r in results[5:])
    assert all(r.placement is not None and r.placement.fallback for r in results[5:])


def test_burst_without_fallback_warns_that_the_pod_will_wait() -> None:
    """Without fallback, onNoCapacity warn: after the 5 free GPUs, Pods are still pinned to T4 but each
    carries a warning that it will wait."""
    adm, _, _ = admitter(burst_fleet())
    results = [adm.admit(burst_pod(i), namespace="ml") for i in range(7)]
    assert pools_of(results) == [T4] * 7
    assert [r.placement.has_capacity for r in results if r.placement] == [True] * 5 + [False] * 2
    assert all(not r.warnings for r in results[:5])
    assert all(any("wait" in w for w in r.warnings) for r in results[5:])


def test_burst_with_on_no_capacity_deny_refuses_the_sixth() -> None:
    """onNoCapacity deny: the 6th single-GPU Pod is denied, saying there is no capacity."""
    adm, _, _ = admitter(burst_fleet(), "defaults: {onNoCapacity: deny}\n")
    results = [adm.admit(burst_pod(i), namespace="ml") for i in range(6)]
    assert pools_of(results) == [T4] * 5 + ["denied"]
    assert "capacity" in results[5].message


def test_burst_of_two_gpu_pods_does_not_add_up_free_gpus_across_nodes() -> None:
    """5 free T4 GPUs on two nodes (3 + 2): only two 2-GPU Pods fit, since each needs one node; the
    third waits (warn)."""
    adm, _, _ = admitter(burst_fleet())
    results = [adm.admit(burst_pod(i, count=2), namespace="ml") for i in range(3)]
    assert pools_of(results) == [T4] * 3
    assert [r.placement.has_capacity for r in results if r.placement] == [True, True, False]


def test_dry_run_reserves_nothing() -> None:
    """Server-side dry-run admissions answer as usual but hold no capacity: 7 dry runs all fit the
    5 free GPUs, and a real admission afterwards still sees all 5."""
    adm, _, index = admitter(burst_fleet())
    dry = [adm.admit(burst_pod(i), namespace="ml", dry_run=True) for i in range(7)]
    assert pools_of(dry) == [T4] * 7
    assert all(r.placement is not None and r.placement.has_capacity for r in dry)
    assert index.usage.reservations == 0
    real = [adm.admit(burst_pod(i), namespace="ml") for i in range(6)]
    assert [r.placement.has_capacity for r in real if r.placement] == [True] * 5 + [False]


def test_reinvocation_of_the_same_pod_does_not_reserve_twice() -> None:
    """kube-apiserver calls again with the patched Pod: no patch, the same pool, and still one
    reservation; 4 more Pods then fit, not 3."""
    adm, _, index = admitter(burst_fleet())
    first = adm.admit(burst_pod(0), namespace="ml")
    patched = apply(burst_pod(0), first.patch)
    again = adm.admit(patched, namespace="ml")
    assert again.allowed and again.patch == ()
    assert again.placement is not None and str(again.placement.pool) == T4
    assert index.usage.reservations == 1
    rest = [adm.admit(burst_pod(i), namespace="ml") for i in range(1, 6)]
    assert [r.placement.has_capacity for r in rest if r.placement] == [True] * 4 + [False]


def test_reservations_expire_when_the_pods_never_show_up() -> None:
    """Admitted Pods that never appear (their creation failed later) stop holding capacity after the
    policy's reservationSeconds."""
    adm, clock, index = admitter(burst_fleet(), "defaults: {reservationSeconds: 30}\n")
    for i in range(5):
        adm.admit(burst_pod(i), namespace="ml")
    full = adm.admit(burst_pod(5), namespace="ml")
    assert full.placement is not None and not full.placement.has_capacity
    clock.now += 31
    later = adm.admit(burst_pod(6), namespace="ml")
    assert later.placement is not None and later.placement.has_capacity
    assert index.usage.reservations == 1


def test_admitted_pods_showing_up_take_over_their_reservations() -> None:
    """When the watch shows the admitted Pods (Pending, pinned by the patch), their reservations are
    settled and the capacity is counted once: the pool is still exactly full."""
    adm, _, index = admitter(burst_fleet())
    patched = []
    for i in range(5):
        obj = burst_pod(i)
        result = adm.admit(obj, namespace="ml")
        seen = apply(obj, result.patch)
        seen["metadata"]["name"] = f"burst-{i}-x7k2q"
        seen["metadata"]["namespace"] = "ml"
        patched.append(seen)
    assert index.usage.reservations == 5
    for seen in patched:
        info = pod_from_obj(seen, index.policy.gpu_resources)
        assert info is not None
        index.upsert_pod(info)
    assert index.usage.reservations == 0
    results = [adm.admit(burst_pod(i), namespace="ml") for i in range(5, 7)]
    assert [r.placement.has_capacity for r in results if r.placement] == [False, False]


def test_quota_counts_admissions_not_yet_in_status_used() -> None:
    """A ResourceQuota of 3 GPUs with none used: a burst admits exactly 3 and denies the 4th, naming
    the quota, before the quota controller has updated status.used."""
    objects = burst_fleet([quota("gpus", "ml", {"requests.nvidia.com/gpu": "3"}, {"requests.nvidia.com/gpu": "0"})])
    adm, _, _ = admitter(objects)
    results = [adm.admit(burst_pod(i), namespace="ml") for i in range(4)]
    assert pools_of(results) == [T4] * 3 + ["denied"]
    assert "gpus" in results[3].message and "3" in results[3].message


def test_dry_run_does_not_count_against_the_quota() -> None:
    """Dry runs leave the namespace's quota as it was: 3 real admissions still fit a quota of 3."""
    objects = burst_fleet([quota("gpus", "ml", {"requests.nvidia.com/gpu": "3"}, {"requests.nvidia.com/gpu": "0"})])
    adm, _, _ = admitter(objects)
    for i in range(4):
        adm.admit(burst_pod(i), namespace="ml", dry_run=True)
    results = [adm.admit(burst_pod(i), namespace="ml") for i in range(3)]
    assert all(r.allowed for r in results)


def test_denied_and_unchanged_pods_reserve_nothing() -> None:
    """Denials and Pods that are not gpupool's business leave the pool as it was."""
    adm, _, index = admitter(burst_fleet())
    adm.admit(burst_pod(0, count=65), namespace="ml")
    adm.admit(pod(annotations={}), namespace="ml")
    assert index.usage.reservations == 0


def test_daemonset_pod_on_its_node_gets_no_patch_but_is_checked() -> None:
    """A DaemonSet's Pod (the controller pins it with a node affinity on metadata.name) is never pinned
    to a pool, which could only strand it; it is checked against its node's pool instead."""
    obj = daemonset_pod("gpu-t4-01", gpus=1)
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert (result.allowed, result.patch) == (True, ())
    assert result.placement is not None and str(result.placement.pool) == T4


# --- issue 13: reservations for every placed Pod, re-invocations recognised ------------------------------


class CurrentInventory(SnapshotInventory):
    """A snapshot whose Pod view counts as current since `since` (as a live watch that never broke)."""

    def __init__(self, index: PoolIndex, since: float | None) -> None:
        super().__init__(index, "test")
        self.since = since

    def current_since(self) -> float | None:
        return self.since


def l4_fleet() -> list[dict[str, Any]]:
    """One L4 node with one free GPU (the other three are taken)."""
    return [gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034), running("busy", "l4-a", 3)]


def reinvoked(first: dict[str, Any], result: Verdict) -> dict[str, Any]:
    """The Pod as kube-apiserver sends it again: gpupool's patch applied, and a later webhook's sidecar."""
    patched = apply(first, result.patch)
    patched["spec"]["containers"].append({"name": "mesh-proxy", "image": "proxy:1"})
    return patched


class TestReinvocation:
    def test_the_pod_on_the_last_free_gpu_is_not_counted_against_itself(self) -> None:
        """Finding 5: placed on the last free L4, the re-invoked Pod (its own patch applied) is allowed
        with no patch and no false "will wait" warning, even under onNoCapacity deny; and its GPU is held
        once, not twice."""
        adm, _, index = admitter(l4_fleet(), "defaults: {onNoCapacity: deny}")
        first = pod("infer", "ml", annotations={"gpupool.io/gpu-class": "medium"})
        result = adm.admit(first, namespace="ml")
        assert result.placement is not None and result.patch
        again = adm.admit(reinvoked(first, result), namespace="ml")
        assert (again.allowed, again.patch, again.warnings) == (True, (), ())
        assert index.usage.reservations == 1
        other = adm.admit(pod("other", "ml", annotations={"gpupool.io/gpu-class": "medium"}), namespace="ml")
        assert not other.allowed and "no capacity" in other.message

    def test_a_pod_made_from_a_generate_name_is_recognised_by_it(self) -> None:
        """Before kube-apiserver names it, a Job's Pod is known by its generateName."""
        adm, _, index = admitter(l4_fleet(), "defaults: {onNoCapacity: deny}")
        first = burst_pod(0)
        result = adm.admit(first, namespace="ml")
        again = adm.admit(reinvoked(first, result), namespace="ml")
        assert (again.allowed, again.patch, again.warnings, index.usage.reservations) == (True, (), (), 1)

    def test_a_copy_of_a_placed_pod_under_another_name_is_a_new_pod(self) -> None:
        """A Pod copied from a placed one (same placement, another name) is checked and reserved like any
        other: here the last GPU is already taken, so it is refused."""
        adm, _, index = admitter(l4_fleet(), "defaults: {onNoCapacity: deny}")
        first = pod("infer", "ml", annotations={"gpupool.io/gpu-class": "medium"})
        copy_ = reinvoked(first, adm.admit(first, namespace="ml"))
        copy_["metadata"]["name"] = "infer-copy"
        assert not adm.admit(copy_, namespace="ml").allowed
        assert index.usage.reservations == 1

    def test_a_second_reinvocation_is_a_new_pod(self) -> None:
        """A reservation is matched by one re-invocation at most; a third call is counted like a new Pod."""
        adm, _, index = admitter([gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034)])
        first = pod("infer", "ml", annotations={"gpupool.io/gpu-class": "medium"})
        patched = reinvoked(first, adm.admit(first, namespace="ml"))
        adm.admit(patched, namespace="ml")
        assert index.usage.reservations == 1
        adm.admit(patched, namespace="ml")
        assert index.usage.reservations == 2


class TestPrePatched:
    def test_pre_patched_pods_count_against_the_class_quota(self) -> None:
        """Finding 3: Pods that arrive carrying the pool's annotation, selector and limit are reserved
        like any Pod, so three of them against classQuota medium: 2 admit two; a normal Pod after them
        gets no medium GPU either."""
        adm, _, _ = admitter(escape_fleet(), ESCAPE_POLICY)
        template = pod("p", "students", annotations={"gpupool.io/gpu-class": "medium"})
        patch = adm.admit(template, namespace="students", dry_run=True).patch
        results = []
        for i in range(3):
            prepatched = apply(template, patch)
            prepatched["metadata"]["name"] = f"pre-{i}"
            results.append(adm.admit(prepatched, namespace="students"))
        assert [r.allowed for r in results] == [True, True, False]
        assert all(r.patch == () for r in results[:2])
        assert "class quota medium in namespace students exceeded: used 2 + requested 1 > hard 2" in results[2].message
        normal = adm.admit(
            pod("late", "students", annotations={"gpupool.io/gpu-class": "medium"}), namespace="students"
        )
        assert not normal.allowed

    def test_pods_naming_their_node_count_against_the_class_quota_at_once(self) -> None:
        """Three Pods naming T4 nodes, created back to back (none in the watch yet), against classQuota
        medium: 2: the third is refused."""
        adm, _, _ = admitter(escape_fleet(), ESCAPE_POLICY)
        results = [adm.admit(pod(f"b-{i}", "students", gpus=1, node="t4-a"), namespace="students") for i in range(3)]
        assert [r.allowed for r in results] == [True, True, False]
        assert results[2].reason == "class-quota"


class TestForgedReviews:
    def review_of(self, clock: FakeClock, since: float | None) -> tuple[Admitter, Any]:
        pol = make_policy(None)
        index = index_of(
            [gpu_node("t4-a", "Tesla-T4", 4), quota("gpus", "team-a", {"requests.nvidia.com/gpu": "4"})], pol
        )
        adm = Admitter(pol, CurrentInventory(index, since), clock=clock)
        return adm, lambda name, gpus: adm.admit(pod(name, "team-a", gpus=gpus), namespace="team-a")

    def test_a_reservation_whose_pod_never_shows_is_released_soon_when_the_watch_is_current(self) -> None:
        """Finding 7: a forged review for team-a (4 GPUs) holds its quota only until the Pod would have
        shown up in a current watch (reservationSettleSeconds, 5 s), not the full 60 s: the real Pod is
        then admitted."""
        clock = FakeClock()
        _, admit = self.review_of(clock, since=clock.now - 100)
        assert admit("forged", 4).allowed
        assert "used 4 + requested 1 > hard 4" in admit("real", 1).message
        clock.now += 16
        assert admit("real", 1).allowed

    def test_without_a_current_watch_the_reservation_waits_out_its_time(self) -> None:
        """With no current Pod view (a snapshot, or a watch that broke since), the reservation stays for
        reservationSeconds: releasing it early could let a burst overbook the pool."""
        clock = FakeClock()
        _, admit = self.review_of(clock, since=None)
        assert admit("forged", 4).allowed
        clock.now += 16
        assert not admit("real", 1).allowed
        clock.now += 45
        assert admit("real", 1).allowed

    def test_reservations_made_before_the_watch_came_back_wait_their_full_time(self) -> None:
        """A reservation made while the watch was down may have missed its Pod: it is not released early."""
        clock = FakeClock()
        adm, admit = self.review_of(clock, since=None)
        assert admit("during-outage", 4).allowed
        assert isinstance(adm.inventory, CurrentInventory)
        adm.inventory.since = clock.now + 1  # the watch came back after the reservation was made
        clock.now += 16
        assert not admit("real", 1).allowed
