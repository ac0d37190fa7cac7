"""Fixed Pod shapes on the demo inventory (missing, null and present parents; the user's tolerations,
selectors, requests and limits; re-invocation; bound and mirror Pods): the patch applies with jsonpatch
and with kubectl alike, validates, keeps the user's entries and is idempotent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.admission.demo import (
    check_placed,
    demo_policy,
    kubectl_patch,
    load_sample,
    shared_demo_index,
)
from webhook.admission.core import evaluate

# --- fixed Pod shapes on the demo inventory: jsonpatch, kubectl, schema, idempotence ----------------------


def _shape(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


MAIN = {"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04"}

FIXED_SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    "no-annotations-map": (
        _shape("a", containers=[{**MAIN, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        "team-a",
    ),
    "annotations-null-and-nulls-everywhere": (
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "job-", "annotations": None},
            "spec": {
                "nodeSelector": None,
                "tolerations": None,
                "containers": [{**MAIN, "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": None}}],
            },
        },
        "team-a",
    ),
    "user-tolerations-and-selector-kept": (
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "b", "annotations": {"gpupool.io/gpu-class": "high", "team": "x"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "example.com/spot", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{**MAIN, "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}],
            },
        },
        "ml-train",
    ),
    "tolerates-l4-taint-and-min-memory": (
        _shape(
            "c",
            {"gpupool.io/gpu-class": "medium", "gpupool.io/min-memory": "20Gi"},
            tolerations=[{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}],
            containers=[{**MAIN, "resources": {}}],
        ),
        "ml-train",
    ),
    "requests-only-existing-gpu": (
        _shape(
            "d",
            {"gpupool.io/gpu-product": "a100"},
            containers=[{**MAIN, "resources": {"requests": {"nvidia.com/gpu": "2"}}}],
        ),
        "ml-train",
    ),
    "init-and-sidecar-containers": (
        _shape(
            "e",
            {"gpupool.io/container": "worker", "gpupool.io/gpu-count": "2"},
            initContainers=[{"name": "fetch", "image": "busybox"}],
            containers=[{"name": "proxy", "image": "envoy"}, {**MAIN, "name": "worker"}],
        ),
        "ml-train",
    ),
    "user-tolerates-everything": (
        _shape("f", {"gpupool.io/vendor": "amd"}, tolerations=[{"operator": "Exists"}], containers=[MAIN]),
        "ml-train",
    ),
}


@pytest.mark.parametrize("case", sorted(FIXED_SHAPES))
def test_fixed_shapes_patch_identically_with_jsonpatch_and_kubectl(case: str, tmp_path: Path) -> None:
    """Pods with missing, null and present parents: the patch applies with jsonpatch and with
    kube-apiserver's library alike, the result is a valid 1.29 Pod, and the patch is idempotent."""
    obj, namespace = FIXED_SHAPES[case]
    result, patched = check_placed(obj, namespace, demo_policy(), shared_demo_index())
    assert kubectl_patch(obj, list(result.patch), tmp_path) == patched


def test_patch_appends_tolerations_and_keeps_user_entries() -> None:
    """The user's toleration list is appended to, never replaced; other annotations stay."""
    obj, namespace = FIXED_SHAPES["user-tolerations-and-selector-kept"]
    result, patched = check_placed(obj, namespace, demo_policy(), shared_demo_index())
    assert patched["spec"]["tolerations"][0] == obj["spec"]["tolerations"][0]
    assert len(patched["spec"]["tolerations"]) == 2
    assert patched["spec"]["nodeSelector"]["kubernetes.io/os"] == "linux"
    assert patched["metadata"]["annotations"]["team"] == "x"
    assert all(op["op"] == "add" for op in result.patch)


def test_pod_tolerating_everything_gets_no_extra_toleration() -> None:
    """An `operator: Exists` toleration without key already tolerates the GPU taint: nothing is added."""
    obj, namespace = FIXED_SHAPES["user-tolerates-everything"]
    _, patched = check_placed(obj, namespace, demo_policy(), shared_demo_index())
    assert patched["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_tolerating_the_l4_taint_makes_the_l4_pool_a_candidate() -> None:
    """A Pod that tolerates dedicated=inference may go to the L4 (23034 MiB >= 20Gi), the least
    capable medium pool that is big enough."""
    obj, namespace = FIXED_SHAPES["tolerates-l4-taint-and-min-memory"]
    result, _ = check_placed(obj, namespace, demo_policy(), shared_demo_index())
    assert result.placement is not None and str(result.placement.pool) == "nvidia/medium/NVIDIA-L4"


def test_requests_only_gpu_gets_an_equal_limit() -> None:
    """A container that requests 2 GPUs without a limit gets limits equal to its requests."""
    obj, namespace = FIXED_SHAPES["requests-only-existing-gpu"]
    _, patched = check_placed(obj, namespace, demo_policy(), shared_demo_index())
    resources = patched["spec"]["containers"][0]["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == str(resources["requests"]["nvidia.com/gpu"]) == "2"


def test_conflicting_existing_requests_are_denied() -> None:
    """Existing requests that differ from the limit gpupool would set are a conflict: denied."""
    obj = _shape(
        "g",
        containers=[{**MAIN, "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "1"}}}],
    )
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert not result.allowed and result.patch == ()
    assert "nvidia.com/gpu" in result.message


def test_count_annotation_contradicting_the_limit_is_denied() -> None:
    """gpu-count 2 with an existing nvidia.com/gpu limit of 1: a contradiction, refused."""
    obj = _shape(
        "h", {"gpupool.io/gpu-count": "2"}, containers=[{**MAIN, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    )
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert not result.allowed and "gpupool.io/gpu-count" in result.message


def test_reinvocation_after_a_later_webhook_added_a_sidecar_yields_no_patch() -> None:
    """kube-apiserver may call gpupool again after another webhook appended a container and a
    toleration: the placement is kept and the patch is empty."""
    obj = load_sample("class-medium.yaml")
    result, patched = check_placed(obj, "ml-train", demo_policy(), shared_demo_index())
    patched["spec"]["containers"].append({"name": "istio-proxy", "image": "istio/proxyv2:1.21.0"})
    patched["spec"].setdefault("tolerations", []).append({"key": "mesh", "operator": "Exists"})
    again = evaluate(patched, "ml-train", demo_policy(), shared_demo_index())
    assert again.allowed and again.patch == ()
    assert again.placement is not None and result.placement is not None
    assert again.placement.pool == result.placement.pool


def test_mirror_and_bound_pods_are_left_alone() -> None:
    """A Pod already bound to a node (or a kubelet mirror Pod) is allowed without a patch."""
    bound = load_sample("class-medium.yaml")
    bound["spec"]["nodeName"] = "gpu-t4-01"
    mirror = load_sample("class-medium.yaml")
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "abc"
    for obj in (bound, mirror):
        result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
        assert (result.allowed, result.patch) == (True, ())
