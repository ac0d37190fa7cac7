"""A gang judged whole at admission: one that could never be released together is refused at once,
naming what stops it (the quota, or the fleet's room), instead of queuing and waiting forever."""

from __future__ import annotations

from tests.builders import gpu_node, index_of, pod, policy
from webhook.admission.core import evaluate

QUEUE = "namespaces:\n  q: {placement: queue, classQuota: {medium: 4}}\n"


def gang_member(size: int, gpus: int) -> dict[str, object]:
    ann = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "sweep", "gpupool.io/group-size": str(size),
           "gpupool.io/gpu-count": str(gpus)}  # fmt: skip
    return pod("m0", "q", annotations=ann)


def test_a_gang_over_its_class_quota_is_refused_naming_the_quota() -> None:
    """Five 1-GPU members against classQuota medium 4: each is within the quota alone, the gang is not."""
    pol = policy(QUEUE)
    index = index_of([gpu_node(f"t4-{i}", "Tesla-T4", 8) for i in range(2)], pol)
    verdict = evaluate(gang_member(5, 1), "q", pol, index)
    assert not verdict.allowed
    assert "group sweep" in verdict.message and "class quota medium" in verdict.message
    assert "hard 4" in verdict.message and "room" not in verdict.message
    assert evaluate(gang_member(4, 1), "q", pol, index).queued  # four fit the quota: queued


def test_a_gang_the_fleet_could_never_hold_at_once_is_refused_naming_the_room() -> None:
    """Three 4-GPU members, the only node of 8 GPUs: two at most, even with the node empty."""
    pol = policy("namespaces:\n  q: {placement: queue}\n")
    index = index_of([gpu_node("t4-0", "Tesla-T4", 8)], pol)
    verdict = evaluate(gang_member(3, 4), "q", pol, index)
    assert not verdict.allowed
    assert "could ever hold" in verdict.message and "at most 2 on Tesla-T4" in verdict.message
    assert "largest node has 8" in verdict.message
    assert evaluate(gang_member(2, 4), "q", pol, index).queued


def test_a_gang_is_judged_on_total_capacity_not_on_what_is_free_now() -> None:
    """Every GPU busy now: a gang the fleet could hold once empty still queues."""
    busy = pod("busy", "other", gpus=8, node="t4-0", phase="Running",
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])  # fmt: skip
    pol = policy("namespaces:\n  q: {placement: queue}\n")
    index = index_of([gpu_node("t4-0", "Tesla-T4", 8), busy], pol)
    assert evaluate(gang_member(2, 4), "q", pol, index).queued
