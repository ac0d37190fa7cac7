"""Projections of raw API objects: only what the decision needs, and nothing for GPU-less Pods."""

from __future__ import annotations

from tests.builders import gpu_node, mig_mixed_node, pod, quota
from webhook.admission.pod import read_pod
from webhook.domain.model import Taint
from webhook.pools.kubeobj import node_from_obj, pod_from_obj, pod_gpu_requests, quota_from_obj

GPU = frozenset({"nvidia.com/gpu", "amd.com/gpu"})


def test_node_projection_keeps_gpu_facts() -> None:
    """Labels, taints, GPU allocatable, readiness and cordon state survive; other resources do not."""
    node = node_from_obj(
        gpu_node("n", taints=[{"key": "k", "effect": "NoSchedule"}], ready=False, unschedulable=True), GPU
    )
    assert node.allocatable == {"nvidia.com/gpu": 4}
    assert node.taints == (Taint("k", "", "NoSchedule"),)
    assert (node.ready, node.unschedulable) == (False, True)
    assert node.labels["nvidia.com/gpu.product"] == "Tesla-T4"


def test_node_without_conditions_is_not_ready() -> None:
    """A node that reports no Ready condition is not trusted with Pods."""
    obj = gpu_node("n")
    del obj["status"]["conditions"]
    assert node_from_obj(obj, GPU).ready is False


def test_pod_without_gpus_or_placement_is_not_kept() -> None:
    """The bulk of a cluster's Pods never reach the inventory."""
    assert pod_from_obj(pod(), GPU) is None


def test_pod_with_placement_but_no_gpus_is_kept() -> None:
    """A Pod gpupool pinned is accounted even before its limits are visible."""
    info = pod_from_obj(pod(annotations={"gpupool.io/pool": "nvidia/medium/Tesla-T4"}), GPU)
    assert info is not None and info.pool == "nvidia/medium/Tesla-T4"


def test_a_pods_group_is_the_one_admission_reads() -> None:
    """The inventory puts a watched Pod in the group its admission put it in: annotation, workload
    label, controller owner, by the one rule both share."""
    owners = [{"kind": "ConfigMap", "name": "c"}, {"kind": "Job", "name": "train", "controller": True}]
    cases = [
        ({"gpupool.io/group": "sweep"}, {}, owners),
        ({}, {"ray.io/cluster": "rc"}, owners),
        ({}, {"app": "x"}, owners),
        ({}, {}, [{"kind": "Job", "name": "train"}]),
    ]
    groups = []
    for own, labels, refs in cases:
        obj = pod(gpus=1, annotations=own)
        obj["metadata"].update(labels=labels, ownerReferences=refs)
        info = pod_from_obj(obj, GPU)
        assert info is not None
        assert info.group == read_pod(obj).group
        groups.append(info.group)
    assert groups == ["sweep", "RayCluster/rc", "Job/train", ""]


def test_requests_default_to_limits_and_phase_defaults_to_pending() -> None:
    """Extended resources: a limit alone is the request; a Pod without status is Pending."""
    info = pod_from_obj(pod(gpus=2, node="t4-a"), GPU)
    assert info is not None
    assert (info.gpu_requests, info.node, info.phase, info.terminal) == (
        {"nvidia.com/gpu": 2},
        "t4-a",
        "Pending",
        False,
    )
    done = pod_from_obj(pod(gpus=2, node="t4-a", phase="Succeeded"), GPU)
    assert done is not None and done.terminal


def test_effective_request_follows_the_scheduler() -> None:
    """Containers add up; an init container counts at its peak; sidecars add to both."""
    spec = {
        "initContainers": [
            {"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "3"}}},
            {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        ],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
        ],
    }
    assert pod_gpu_requests(spec, GPU) == {"nvidia.com/gpu": 3}  # max(1+1+1 sidecar, 3 init)
    spec["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert pod_gpu_requests(spec, GPU) == {"nvidia.com/gpu": 3}  # 1+1 containers + 1 sidecar


def test_quota_keeps_gpu_entries_and_scope() -> None:
    """GPU quota entries in both forms are kept (the bare one to flag it); CPU entries are not."""
    obj = quota(
        "q",
        "team",
        {"requests.nvidia.com/gpu": "4", "nvidia.com/gpu": "4", "cpu": "10"},
        {"requests.nvidia.com/gpu": "3"},
    )
    obj["spec"]["scopes"] = ["NotTerminating"]
    info = quota_from_obj(obj, GPU)
    assert info is not None
    assert (info.hard, info.used, info.scoped) == (
        {"requests.nvidia.com/gpu": 4, "nvidia.com/gpu": 4},
        {"requests.nvidia.com/gpu": 3},
        True,
    )
    assert quota_from_obj(quota("cpu", "team", {"cpu": "10"}), GPU) is None


def test_mixed_strategy_mig_resources_are_kept_with_the_gpus() -> None:
    """A node's nvidia.com/mig-<profile> resources are devices too; cpu, memory and the rest are not."""
    node = node_from_obj(mig_mixed_node("n"), GPU, ("nvidia.com/mig-",))
    assert node.allocatable == {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.20gb": 4, "nvidia.com/mig-1g.5gb": 14}


def test_quotas_on_mig_instances_are_kept() -> None:
    """`requests.nvidia.com/mig-3g.20gb` limits devices, so it is checked like the GPUs' quota."""
    obj = quota(
        "mig", "team", {"requests.nvidia.com/mig-3g.20gb": "2", "pods": "10"}, {"requests.nvidia.com/mig-3g.20gb": "1"}
    )
    info = quota_from_obj(obj, GPU, ("nvidia.com/mig-",))
    assert info is not None
    assert (info.hard, info.used) == ({"requests.nvidia.com/mig-3g.20gb": 2}, {"requests.nvidia.com/mig-3g.20gb": 1})
