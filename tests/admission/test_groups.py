"""Workload groups at admission: siblings stay on one pool, a split is said, strict keeps the group
together or follows onNoCapacity, and a group's first Pod can ask for room for all of it.

The fleet has two medium pools that the ranking alone cannot tell apart (same class, same memory per
GPU), so without groups a burst alternates between them as each one's free GPUs go down: exactly the
scatter groups are there to prevent.
"""

from __future__ import annotations

from typing import Any

from tests.builders import gpu_node, index_of, pod
from tests.builders import policy as make_policy
from webhook.admission.choice import ADMIT, choose
from webhook.admission.core import Admitter, evaluate
from webhook.admission.groups import pods_at_once
from webhook.admission.pod import read_pod
from webhook.admission.request import parse_request
from webhook.admission.verdict import GroupNote, Verdict
from webhook.domain.model import PoolKey
from webhook.pools.index import PoolIndex
from webhook.pools.reservations import Reservation
from webhook.sources.snapshot import SnapshotInventory

A10 = PoolKey("nvidia", "medium", "NVIDIA-A10")
L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
MEMORY = 23034


def twins(
    a10_sizes: tuple[int, ...] = (4, 4), l4_sizes: tuple[int, ...] = (4, 4), a10_compute: str = "8.9"
) -> list[dict[str, Any]]:
    """Two medium pools of 24 GB cards, labelled with the same compute capability: A10 first by name when
    they are equally free (and first whatever is free when `a10_compute` is lower, its real 8.6: the
    older architecture ranks first)."""
    major, minor = a10_compute.split(".")
    a10 = {"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor}
    l4 = {"nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9"}
    return [
        *(gpu_node(f"a10-{i}", "NVIDIA-A10", n, memory_mib=23028, labels=a10) for i, n in enumerate(a10_sizes)),
        *(gpu_node(f"l4-{i}", "NVIDIA-L4", n, memory_mib=MEMORY, labels=l4) for i, n in enumerate(l4_sizes)),
    ]


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def admitter(objects: list[dict[str, Any]], policy_text: str | None = None) -> tuple[Admitter, PoolIndex]:
    pol = make_policy(policy_text)
    index = index_of(objects, pol)
    return Admitter(pol, SnapshotInventory(index, "test"), clock=Clock()), index


def job_pod(job: str = "train", gpus: int = 1, namespace: str = "ml", **annotations: str) -> dict[str, Any]:
    """A Pod as a Job controller sends it: generateName only, the Job as its controller owner."""
    own = {f"gpupool.io/{key.replace('_', '-')}": value for key, value in annotations.items()}
    obj = pod(
        namespace=namespace, annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus), **own}
    )
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = f"{job}-"
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job,
                                           "controller": True}]  # fmt: skip
    return obj


def running(name: str, node: str, pool: PoolKey, job: str = "train", gpus: int = 1) -> dict[str, Any]:
    """A Pod of the Job that gpupool placed earlier, running on `node`."""
    obj = pod(name, gpus=gpus, node=node, phase="Running", annotations={"gpupool.io/pool": str(pool)})
    obj["metadata"]["ownerReferences"] = [{"kind": "Job", "name": job, "uid": job, "controller": True}]
    return obj


def pools_of(verdicts: list[Verdict]) -> list[str]:
    return [v.placement.pool.product if v.placement else "denied" for v in verdicts]


# --- siblings stay together ----------------------------------------------------------------------------


def test_a_jobs_burst_stays_on_one_pool_while_it_has_room() -> None:
    """8 Pods of one Job fill the A10 pool before the watch shows any of them (each admission's
    reservation carries the group); the 9th goes to the L4 pool with the warning that the group is
    split. Pods of no group, in the same burst, spread over both pools as the ranking says."""
    adm, _ = admitter(twins())
    grouped = [adm.admit(job_pod(), namespace="ml") for _ in range(9)]
    assert pools_of(grouped) == ["NVIDIA-A10"] * 8 + ["NVIDIA-L4"]
    assert all(v.warnings == () for v in grouped[:8])
    assert grouped[8].warnings == ("gpupool: group Job/train split across pools NVIDIA-A10 and NVIDIA-L4",)
    alone, _ = admitter(twins())
    loose = [alone.admit(pod(f"p{i}", annotations={"gpupool.io/gpu-class": "medium"}), namespace="ml")
             for i in range(8)]  # fmt: skip
    assert set(pools_of(loose)) == {"NVIDIA-A10", "NVIDIA-L4"}


def test_a_new_pod_joins_its_running_siblings_over_a_freer_pool() -> None:
    """The Job's Pods already run on the L4 pool (placed there by gpupool): a new Pod of the Job goes to
    the L4 pool although the A10 pool has more free GPUs; another Job's Pod does not."""
    objects = [*twins(), running("train-a", "l4-0", L4), running("train-b", "l4-0", L4)]
    result = evaluate(job_pod(), "ml", make_policy(), index_of(objects))
    assert result.placement is not None and result.placement.pool == L4
    assert result.group == GroupNote("Job/train", L4, 2)
    other = evaluate(job_pod("eval"), "ml", make_policy(), index_of(objects))
    assert other.placement is not None and other.placement.pool == A10
    assert other.group == GroupNote("Job/eval", None, 0)
    elsewhere = evaluate(job_pod(namespace="team-b"), "team-b", make_policy(), index_of(objects))
    assert elsewhere.placement is not None and elsewhere.placement.pool == A10  # groups are per namespace


def test_a_named_group_joins_the_pods_of_different_controllers() -> None:
    """gpupool.io/group puts two Jobs' Pods in one group: the second Job follows the first."""
    adm, _ = admitter(twins(l4_sizes=(8, 8)))
    first = adm.admit(job_pod("gen", group="sweep"), namespace="ml")
    second = adm.admit(job_pod("score", group="sweep"), namespace="ml")
    assert first.placement is not None and second.placement is not None
    assert second.placement.pool == first.placement.pool == L4
    assert second.group == GroupNote("sweep", L4, 1)


def test_a_pod_that_arrives_placed_keeps_its_pool() -> None:
    """A Pod carrying gpupool.io/pool (a re-invocation, or a copy) is not moved to its group's pool."""
    objects = [*twins(), running("train-a", "l4-0", L4)]
    result = evaluate(job_pod(pool=str(A10)), "ml", make_policy(), index_of(objects))
    assert result.placement is not None and result.placement.pool == A10
    assert result.warnings == ()


# --- when the group's pool is full -------------------------------------------------------------------


FULL_L4 = [*twins(), *(running(f"train-{i}", f"l4-{i // 4}", L4) for i in range(8))]


def test_prefer_splits_the_group_with_a_warning_when_its_pool_is_full() -> None:
    """The default policy, prefer: the usual rules place the Pod, and the warning names both pools."""
    result = evaluate(job_pod(), "ml", make_policy(), index_of(FULL_L4))
    assert result.placement is not None and result.placement.pool == A10
    assert result.warnings == ("gpupool: group Job/train split across pools NVIDIA-L4 and NVIDIA-A10",)


def test_prefer_waits_with_the_group_when_nothing_fits_anywhere() -> None:
    """With no room anywhere, a waiting Pod waits on its group's pool, not on another one."""
    objects = [*FULL_L4, *(running(f"other-{i}", f"a10-{i // 4}", A10, job="other") for i in range(8))]
    result = evaluate(job_pod(), "ml", make_policy(), index_of(objects))
    assert result.placement is not None and (result.placement.pool, result.placement.has_capacity) == (L4, False)
    assert result.warnings == (
        "gpupool: no NVIDIA-L4 node has 1 free GPUs now; the Pod will wait with group Job/train",
    )


def test_strict_keeps_the_group_together_and_follows_on_no_capacity() -> None:
    """group-policy strict: the Pod waits on the group's pool (onNoCapacity warn), or is denied (deny)
    with a message that says where the group is and why."""
    waits = evaluate(job_pod(group_policy="strict"), "ml", make_policy(), index_of(FULL_L4))
    assert waits.placement is not None and (waits.placement.pool, waits.placement.has_capacity) == (L4, False)
    assert "will wait with group Job/train" in waits.warnings[0]
    deny = make_policy("defaults: {onNoCapacity: deny}")
    denied = evaluate(job_pod(group_policy="strict"), "ml", deny, index_of(FULL_L4, deny))
    assert (denied.allowed, denied.code, denied.reason) == (False, 403, "no-capacity")
    assert denied.message == (
        "no capacity: no node of pool nvidia/medium/NVIDIA-L4, where group Job/train is, has 1 free nvidia.com/gpu "
        "(at most 0); gpupool.io/group-policy is strict and policy onNoCapacity is deny"
    )
    assert denied.group == GroupNote("Job/train", L4, 8)


def test_strict_refuses_a_pod_that_cannot_use_its_groups_pool() -> None:
    """A strict Pod whose own request rules out the group's pool is refused saying why, rather than
    placed apart from its group."""
    objects = [*twins(), running("train-a", "l4-0", L4)]
    result = evaluate(job_pod(group_policy="strict", gpu_product="A10"), "ml", make_policy(), index_of(objects))
    assert (result.allowed, result.reason) == (False, "group")
    assert result.message == (
        "group Job/train is on pool nvidia/medium/NVIDIA-L4, which the Pod cannot use: product NVIDIA-L4 does not "
        "match gpupool.io/gpu-product A10; gpupool.io/group-policy strict keeps the group on one pool"
    )


# --- room for the whole group -----------------------------------------------------------------------------


def test_group_size_sends_the_first_pod_where_the_whole_group_fits() -> None:
    """6 Pods of 2 GPUs: the A10 pool (two 4-GPU nodes: 2 + 2 Pods) ranks first but holds 4 of them; the
    L4 pool (an 8-GPU and a 4-GPU node: 4 + 2) holds all 6, so the first Pod goes there, and its
    siblings follow. Without group-size the first Pod takes the A10 pool (the older architecture)."""
    objects = twins(a10_sizes=(4, 4), l4_sizes=(8, 4), a10_compute="8.6")
    assert evaluate(job_pod(gpus=2), "ml", make_policy(), index_of(objects)).placement.pool == A10  # type: ignore[union-attr]
    adm, _ = admitter(objects)
    burst = [adm.admit(job_pod(gpus=2, group_size="6"), namespace="ml") for _ in range(6)]
    assert pools_of(burst) == ["NVIDIA-L4"] * 6
    assert all(v.warnings == () and v.placement and v.placement.has_capacity for v in burst)


def test_no_pool_with_room_for_the_group_says_how_many_fit_where() -> None:
    """No pool holds 10 Pods of 2 GPUs at once: under onNoCapacity warn the first Pod is placed as
    usual, with a warning of how many fit there; under deny it is refused naming what fits where."""
    objects = twins(a10_sizes=(4, 4), l4_sizes=(8, 4), a10_compute="8.6")
    warned = evaluate(job_pod(gpus=2, group_size="10"), "ml", make_policy(), index_of(objects))
    assert warned.placement is not None and warned.placement.pool == A10
    assert warned.warnings == (
        "gpupool: 4 of the 10 Pods of group Job/train fit on NVIDIA-A10 now; the rest will wait",
    )
    deny = make_policy("defaults: {onNoCapacity: deny}")
    denied = evaluate(job_pod(gpus=2, group_size="10"), "ml", deny, index_of(objects, deny))
    assert (denied.allowed, denied.reason) == (False, "no-capacity")
    assert denied.message == (
        "no capacity: group Job/train needs room for 10 Pods of 2 nvidia.com/gpu at once, and no pool has it "
        "(6 on NVIDIA-L4, 4 on NVIDIA-A10); policy onNoCapacity is deny"
    )


def test_room_for_pods_counts_whole_pods_per_node_after_reservations() -> None:
    """Per node floor(free / GPUs per Pod): three 3-GPU nodes hold three 2-GPU Pods, not four; GPUs held
    for admissions the watch has not shown yet are not room."""
    index = index_of([gpu_node(f"l4-{i}", "NVIDIA-L4", 3, memory_mib=MEMORY) for i in range(3)])
    view = read_pod(job_pod(gpus=2), "ml")
    req = parse_request(view.shape, index.policy)
    (candidate,) = choose(req, view, index, index.policy, ADMIT).decision.candidates
    assert pods_at_once(candidate, 2) == 3
    index.reserve(Reservation(namespace="ml", pool=L4, selector=candidate.constraint.selector, gpus=2), now=0.0)
    (candidate,) = choose(req, view, index, index.policy, ADMIT).decision.candidates
    assert pods_at_once(candidate, 2) == 2
