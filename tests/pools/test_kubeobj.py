"""Projections of raw API objects: only what the decision needs, and nothing for GPU-less Pods."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.builders import gpu_node, mig_mixed_node, pod, quota
from webhook.admission.pod import read_pod
from webhook.domain.model import Taint
from webhook.domain.quantity import QuantityError
from webhook.pools.kubeobj import names_gpus, node_from_obj, pod_from_obj, pod_gpu_requests, quota_from_obj
from webhook.testing.synthetic import iter_synthetic_cluster

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


# --- the fast path: most Pods are read no further than their resource names ------------------------------

PREFIXES = ("nvidia.com/mig-",)
RESOURCES = frozenset({"nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910"})
_names = st.sampled_from(
    [
        "cpu",
        "memory",
        "ephemeral-storage",
        "hugepages-2Mi",
        "example.com/fpga",
        "nvidia.com/gpu",
        "amd.com/gpu",
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-",
        "nvidia.com/gpu.shared",
        "NVIDIA.COM/GPU",
        "",
    ]
)
_values = st.sampled_from(["1", "0", "2", "500m", "2Gi", 3, 0, None, "x", -1])
_amounts = st.one_of(st.dictionaries(_names, _values, max_size=4), st.none(), st.just([]), st.just("1"))
_resources = st.one_of(
    st.fixed_dictionaries({}, optional={"requests": _amounts, "limits": _amounts}), st.none(), st.just("cpu")
)
_container = st.one_of(
    st.fixed_dictionaries(
        {"name": st.just("c")}, optional={"resources": _resources, "restartPolicy": st.just("Always")}
    ),
    st.none(),
    st.just("c"),
    st.just([]),
)
_spec = st.fixed_dictionaries(
    {},
    optional={
        "containers": st.one_of(st.lists(_container, max_size=3), st.none(), st.just({})),
        "initContainers": st.one_of(st.lists(_container, max_size=2), st.none()),
        "nodeName": st.sampled_from(["", "t4-a", None]),
    },
)


def _full_projection(obj: dict[str, Any]) -> Any:
    """pod_from_obj reading every Pod whole, as it did before the fast path."""
    return _outcome(lambda: pod_from_obj(obj, RESOURCES, PREFIXES, screen=False))


def _outcome(project: Any) -> Any:
    try:
        return project()
    except QuantityError as exc:  # a GPU amount that is not one: the same error either way
        return ("QuantityError", str(exc))


def _spec_with(part: str, amounts: Any) -> dict[str, Any]:
    return {part: [{"name": "c", "resources": {"limits": amounts}}]}


@settings(max_examples=400, deadline=None)
@given(_spec, st.sampled_from([None, {"gpupool.io/pool": "nvidia/medium/Tesla-T4"}, {"other": "x"}]))
@example(_spec_with("containers", {"cpu": "1", "nvidia.com/mig-1g.5gb": "2"}), None)  # a partition alone
@example(_spec_with("initContainers", {"amd.com/gpu": "1"}), None)  # an init container's GPUs alone
@example(_spec_with("containers", {1: "1", "memory": "1Gi"}), None)  # a key that is no string
@example(_spec_with("containers", {"nvidia.com/gpu": "two"}), None)  # an amount that is no quantity
@example({"containers": [{"resources": {"requests": {"nvidia.com/gpu": "0"}}}]}, None)  # zero GPUs
def test_the_fast_path_projects_a_hostile_pod_as_reading_it_whole(spec: dict[str, Any], annotations: Any) -> None:
    """Containers of every shape (resources, requests or limits missing, null, of another type; GPU names
    in other cases, partition prefixes, amounts that are not quantities): a Pod the fast path passes over
    is one that requests no GPU, and every Pod projects as when it is read whole."""
    obj = {"metadata": {"name": "p", "namespace": "ml", "annotations": annotations}, "spec": spec}
    if not names_gpus(spec, RESOURCES, PREFIXES):
        assert pod_gpu_requests(spec, RESOURCES, PREFIXES) == {}
    assert _outcome(lambda: pod_from_obj(obj, RESOURCES, PREFIXES)) == _full_projection(obj)


@pytest.mark.parametrize("partitioned", [0.0, 0.25], ids=["whole-gpus", "partitioned"])
def test_the_fast_path_projects_a_synthetic_cluster_as_reading_it_whole(partitioned: float) -> None:
    """Every Pod of a synthetic cluster (GPU Pods of every device kind, pinned Pending Pods, the GPU-less
    bulk) projects as when it is read whole, and only the GPU Pods and placed Pods are kept."""
    pods = [o for o in iter_synthetic_cluster(60, 3000, seed=3, partitioned=partitioned) if o["kind"] == "Pod"]
    projected = [pod_from_obj(o, RESOURCES, PREFIXES) for o in pods]
    assert projected == [_full_projection(o) for o in pods]
    assert 0 < sum(p is not None for p in projected) < len(pods) / 2


def test_a_projection_keeps_none_of_the_decoded_pages_strings() -> None:
    """What the inventory keeps of a Pod or node is its own, so that a list page's memory is freed whole
    when the page is dropped (webhook.pools.kubeobj.own)."""
    page = orjson.loads(
        orjson.dumps(
            [
                pod(
                    gpus=1,
                    node="t4-a",
                    annotations={"gpupool.io/pool": "nvidia/medium/Tesla-T4", "gpupool.io/group": "sweep"},
                    node_selector={"a": "b"},
                ),
                pod(gpus=1),
                gpu_node("t4-a", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]),
            ]
        )
    )
    decoded = {id(s) for s in _strings(page)}
    kept = [pod_from_obj(page[0], RESOURCES), pod_from_obj(page[1], RESOURCES), node_from_obj(page[2], RESOURCES)]
    assert all(p is not None for p in kept)
    assert not [s for s in _strings(kept) if id(s) in decoded and len(s) > 1]


def _strings(value: Any) -> list[str]:
    """Every string a value holds, through dicts, lists, tuples and dataclasses."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [s for f in dataclasses.fields(value) for s in _strings(getattr(value, f.name))]
    return []
