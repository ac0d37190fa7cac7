"""A workload's Pods admitted in turn (webhook.admission.burst): how many fit now, where, what the first
that does not fit would get, and the index left as it was."""

from __future__ import annotations

from typing import Any

from tests.builders import decision_view, gpu_node, index_of, pod
from tests.builders import policy as make_policy
from webhook.admission.burst import admit_in_turn
from webhook.domain.model import PoolKey

T4 = PoolKey("nvidia", "medium", "Tesla-T4")
A10 = PoolKey("nvidia", "medium", "NVIDIA-A10")
L4 = PoolKey("nvidia", "medium", "NVIDIA-L4")


def job_pod(gpus: int, job: str = "train") -> dict[str, Any]:
    """A Pod as the Job controller sends it: generateName only, the Job its controller owner."""
    obj = pod(namespace="ml", annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus)})
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = f"{job}-"
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job,
                                           "controller": True}]  # fmt: skip
    return obj


def t4s_with_three_free() -> list[dict[str, Any]]:
    """Two T4 nodes: one with 1 GPU free, one with 2."""
    return [
        gpu_node("t4-a", "Tesla-T4", 4),
        gpu_node("t4-b", "Tesla-T4", 4),
        pod("busy-a", "other", gpus=3, node="t4-a", phase="Running"),
        pod("busy-b", "other", gpus=2, node="t4-b", phase="Running"),
    ]


def test_only_the_pods_a_node_has_room_for_fit_and_the_rest_would_wait() -> None:
    """4 Pods of 2 GPUs on 3 free T4 GPUs, at most 2 on one node: the first fits, the second would be
    placed to wait (onNoCapacity warn, the default); the index is as it was before."""
    pol = make_policy()
    index = index_of(t4s_with_three_free(), pol)
    before = decision_view(index, ["ml"])
    burst = admit_in_turn(job_pod(2), "ml", 4, pol, index)
    assert (burst.pods, burst.fit, burst.pools) == (4, 1, ((T4, 1),))
    assert burst.rest is not None and burst.rest.allowed
    assert burst.rest.placement is not None and burst.rest.placement.pool == T4
    assert not burst.rest.placement.has_capacity
    assert decision_view(index, ["ml"]) == before


def test_under_on_no_capacity_deny_the_first_that_does_not_fit_is_denied() -> None:
    pol = make_policy("defaults: {onNoCapacity: deny}")
    burst = admit_in_turn(job_pod(2), "ml", 4, pol, index_of(t4s_with_three_free(), pol))
    assert burst.fit == 1
    assert burst.rest is not None and not burst.rest.allowed
    assert burst.rest.reason == "no-capacity"


def test_the_namespace_quota_counts_the_pods_before() -> None:
    """Room for 8, a classQuota of 3 medium GPUs: three fit, the fourth is over the quota."""
    pol = make_policy("namespaces: {ml: {classQuota: {medium: 3}}}")
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4), gpu_node("t4-b", "Tesla-T4", 4)], pol)
    burst = admit_in_turn(job_pod(1), "ml", 4, pol, index)
    assert burst.fit == 3
    assert burst.rest is not None and not burst.rest.allowed
    assert burst.rest.reason == "class-quota"
    assert "class quota medium in namespace ml exceeded" in burst.rest.message


def test_siblings_stay_on_the_pool_of_the_first() -> None:
    """Two medium pools equally free: the Job's Pods are one workload group, so all four go where the first
    went rather than alternating between the pools as each one's free GPUs go down."""
    pol = make_policy()
    nodes = [gpu_node(f"a10-{i}", "NVIDIA-A10", 4, memory_mib=23028) for i in range(2)]
    nodes += [gpu_node(f"l4-{i}", "NVIDIA-L4", 4, memory_mib=23034) for i in range(2)]
    burst = admit_in_turn(job_pod(2), "ml", 4, pol, index_of(nodes, pol))
    assert burst.fit == 4 and burst.rest is None
    assert len(burst.pools) == 1 and burst.pools[0][1] == 4
    assert burst.pools[0][0] in (A10, L4)
