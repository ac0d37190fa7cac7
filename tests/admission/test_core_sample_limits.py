"""The sample Pods of examples/pods/ against what limits them on the demo inventory: the user's own
nodeSelector, product names matched token by token, namespace rules and quotas, bad annotations,
other vendors, and nodes too small to ever hold the Pod.
"""

from __future__ import annotations

import re
from typing import Any

from tests.admission.demo import (
    A100,
    RTX3060,
    RTX4090,
    T4,
    _demo_objects,
    check_placed,
    demo_policy,
    load_sample,
    placed_sample,
    sample_verdict,
    shared_demo_index,
    target_limits,
)
from tests.builders import gpu_node, index_of, pod
from tests.builders import policy as make_policy
from webhook.admission.core import evaluate
from webhook.admission.verdict import Verdict
from webhook.sources.snapshot import build_index


def test_pinned_nodeselector_is_honoured_and_kept() -> None:
    """A nodeSelector on the product label is a constraint: the Pod stays on T4, the user's entry is
    kept as written, and only the class label is added next to it."""
    obj, result, patched = placed_sample("pinned-nodeselector.yaml")
    assert patched["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "Tesla-T4",
        "gpu.accelerator/class": "medium",
    }
    assert not any(op["op"] in ("replace", "remove") for op in result.patch)
    assert obj["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-T4"}


def test_pinned_nodeselector_contradicting_the_annotations_is_denied() -> None:
    """A product pinned by nodeSelector that contradicts gpupool.io/gpu-product is refused, naming it."""
    obj = load_sample("pinned-nodeselector.yaml")
    obj["metadata"]["annotations"] = {"gpupool.io/gpu-product": "A100"}
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert not result.allowed
    assert "nodeSelector" in result.message or "Tesla-T4" in result.message


def test_plain_cpu_pod_is_allowed_unchanged() -> None:
    """No gpupool.io/ annotation, no GPU resource: allowed, no patch, no pool."""
    _, result = sample_verdict("plain-cpu.yaml")
    assert (result.allowed, result.patch, result.placement) == (True, (), None)


def test_product_a100_matches_only_the_a100() -> None:
    """gpu-product A100 matches NVIDIA-A100-SXM4-40GB (prefix dropped) and no other product."""
    _, result, _ = placed_sample("product-a100.yaml")
    for other in ("NVIDIA-H100-80GB-HBM3", "Tesla-T4"):
        lines = [r for r in result.reasons if other in r]
        assert lines and all("gpu-product" in r for r in lines), result.reasons


def test_product_h20_is_denied_and_never_matches_h200_or_h100() -> None:
    """No H20 in the demo cluster: denied (not an H100/H200 by substring), saying why for the nearest
    pool: the H100, of the H20's family, and no RTX 3060 or A100. The H100 is full, so no other product is
    named as a fix."""
    _, result = sample_verdict("product-h20-not-h200.yaml")
    assert not result.allowed
    assert result.patch == () and result.placement is None
    assert result.message == (
        "no GPU pool matches the Pod: NVIDIA-H100-80GB-HBM3: product NVIDIA-H100-80GB-HBM3 does not match "
        "gpupool.io/gpu-product H20"
    )


def test_h20_does_not_match_an_h200_node() -> None:
    """Token-exact matching on a fleet that has an H200 but no H20: the H20 Pod is denied."""
    nodes = [gpu_node("h200", "NVIDIA-H200", 8, memory_mib=143771, gpu_class="high")]
    result = evaluate(pod(annotations={"gpupool.io/gpu-product": "H20"}), "ml", make_policy(), index_of(nodes))
    assert not result.allowed
    ok = evaluate(pod(annotations={"gpupool.io/gpu-product": "H200"}), "ml", make_policy(), index_of(nodes))
    assert ok.allowed and ok.placement is not None and ok.placement.pool.product == "NVIDIA-H200"


def test_no_pool_matching_is_denied_saying_why_for_the_nearest_pools() -> None:
    """min-memory 81Gi: even the H100 (sold as 80 GB) is too small, so the Pod is denied and the message
    gives the nearest pools' reasons, as in the issue's example. (80Gi reaches the H100: issue 30.)"""
    obj = load_sample("min-memory.yaml")
    obj["metadata"]["annotations"]["gpupool.io/min-memory"] = "81Gi"
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert not result.allowed and result.code == 403
    assert "NVIDIA-A100-SXM4-40GB: 40Gi < min-memory 81Gi" in result.message


def test_min_memory_in_decimal_units_reaches_the_h100() -> None:
    """80G (decimal, about 74.5 GiB) fits the H100's 81559 MiB: the only pool big enough, so the Pod
    is pinned there to wait (its node is full), with a warning."""
    obj = load_sample("min-memory.yaml")
    obj["metadata"]["annotations"]["gpupool.io/min-memory"] = "80G"
    result, _ = check_placed(obj, "ml-train", demo_policy(), shared_demo_index())
    assert result.placement is not None
    assert str(result.placement.pool) == "nvidia/high/NVIDIA-H100-80GB-HBM3"
    assert any("wait" in w for w in result.warnings)


def test_students_default_class_is_low() -> None:
    """students get their namespace's default class, low, when the Pod names none."""
    _, result, _ = placed_sample("students-default-class.yaml")
    assert result.placement is not None and result.placement.pool.gpu_class == "low"


def test_students_may_not_ask_for_high() -> None:
    """A class the namespace does not allow is refused, naming the annotation and what is allowed."""
    obj = load_sample("students-default-class.yaml")
    obj["metadata"]["annotations"]["gpupool.io/gpu-class"] = "high"
    result = evaluate(obj, "students", demo_policy(), shared_demo_index())
    assert not result.allowed
    assert "gpupool.io/gpu-class" in result.message and "high" in result.message
    assert "low" in result.message and "medium" in result.message


def test_target_container_gets_the_gpus() -> None:
    """gpupool.io/container: trainer puts the GPU on the second container; the first is untouched."""
    obj, result, patched = placed_sample("target-container.yaml")
    assert patched["spec"]["containers"][0] == obj["spec"]["containers"][0]
    assert target_limits(patched, 1)["nvidia.com/gpu"] == "1"
    assert patched["spec"]["containers"][1]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert all(not op["path"].startswith("/spec/containers/0") for op in result.patch)


def test_team_a_quota_denies_two_more_gpus() -> None:
    """team-a's gpu-quota allows 4 with 3 used: 2 more are denied, naming quota, used, requested, hard."""
    _, result = sample_verdict("team-a-quota.yaml")
    assert not result.allowed and result.code == 403
    assert "gpu-quota" in result.message
    assert re.search(r"used\D{0,5}3\b", result.message), result.message
    assert re.search(r"request\w*\D{0,5}2\b", result.message), result.message
    assert re.search(r"hard\D{0,5}4\b", result.message), result.message


def test_team_a_one_gpu_fits_the_quota() -> None:
    """One GPU keeps team-a within its quota (3 + 1 <= 4): placed in the default class medium."""
    obj = load_sample("team-a-quota.yaml")
    obj["metadata"]["annotations"]["gpupool.io/gpu-count"] = "1"
    result, _ = check_placed(obj, "team-a", demo_policy(), shared_demo_index())
    assert result.placement is not None and str(result.placement.pool) == T4


def test_team_a_memory_quota_passes_the_high_pools_over_for_a_t4() -> None:
    """team-a holds 70Gi of its 100Gi GPU memory: one more A100 (40Gi) or H100 (80Gi) GPU would exceed
    it, so the Pod that prefers high is placed on a T4 (15Gi), the next class it names; the explain lines
    say why the high pools were passed over."""
    _, result, _ = placed_sample("team-a-memory-quota.yaml")
    assert str(result.placement.pool) == T4  # type: ignore[union-attr]
    assert (
        f"{A100}: rejected: GPU memory quota in namespace team-a exceeded: used 70Gi + requested 40Gi > hard 100Gi"
    ) in result.reasons
    high_only = load_sample("team-a-memory-quota.yaml")
    high_only["metadata"]["annotations"]["gpupool.io/gpu-class"] = "high"
    denied = evaluate(high_only, "team-a", demo_policy(), shared_demo_index())
    assert (denied.allowed, denied.code, denied.reason) == (False, 403, "memory-quota")


def test_team_b_tutorial_quota_is_enforced_by_gpupool() -> None:
    """team-b's `nvidia.com/gpu: 4` (the tutorial's form) is not enforced by Kubernetes; gpupool counts
    the 1 GPU team-b's inference Pod holds and refuses 4 more, saying how to write the enforced form.
    Without the policy switch, the same Pod would be placed."""
    obj, result = sample_verdict("team-b-tutorial-quota.yaml")
    assert (result.allowed, result.code, result.reason) == (False, 403, "quota")
    assert result.message == (
        "exceeded quota compute-resources in namespace team-b: nvidia.com/gpu used 1 + requested 4 > hard 4; "
        "Kubernetes does not enforce 'nvidia.com/gpu' for extended resources, gpupool does; write "
        "'requests.nvidia.com/gpu: 4' to have Kubernetes enforce it"
    )
    off = make_policy("defaults: {enforceAllGpuQuotaForms: false}")
    assert evaluate(obj, "team-b", off, build_index(list(_demo_objects()), off)).allowed
    three = load_sample("team-b-tutorial-quota.yaml")
    three["metadata"]["annotations"]["gpupool.io/gpu-count"] = "3"
    assert sample_verdict_of(three).allowed


def sample_verdict_of(obj: dict[str, Any]) -> Verdict:
    return evaluate(obj, obj["metadata"]["namespace"], demo_policy(), shared_demo_index())


def test_bad_annotation_is_denied_naming_the_annotation() -> None:
    """A misspelt gpupool.io/ key and a count that is not a number: denied (400) with a message that
    names the bad annotation and what is accepted."""
    _, result = sample_verdict("bad-annotation.yaml")
    assert not result.allowed and result.code == 400
    assert result.patch == ()
    assert "gpupool.io/gpu-clas" in result.message
    assert "gpupool.io/gpu-class" in result.message


def test_bad_count_alone_is_denied_naming_value_and_range() -> None:
    """gpu-count "two": the message names the annotation, the value and the accepted range."""
    obj = load_sample("bad-annotation.yaml")
    del obj["metadata"]["annotations"]["gpupool.io/gpu-clas"]
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert not result.allowed and result.code == 400
    assert "gpupool.io/gpu-count" in result.message and "two" in result.message and "64" in result.message


def test_vendor_amd_gets_the_amd_resource_and_toleration() -> None:
    """vendor amd: amd.com/gpu (not nvidia.com/gpu) on the MI250X pool, with the AMD taint tolerated
    and the product-name label pinned."""
    _, result, patched = placed_sample("vendor-amd.yaml")
    limits = target_limits(patched, 0)
    assert limits["amd.com/gpu"] == "2" and "nvidia.com/gpu" not in limits
    assert patched["spec"]["containers"][0]["resources"]["requests"]["amd.com/gpu"] == "2"
    assert patched["spec"]["nodeSelector"] == {"amd.com/gpu.product-name": "AMD_Instinct_MI250X"}
    assert [t["key"] for t in patched["spec"]["tolerations"]] == ["amd.com/gpu"]
    assert result.placement is not None and result.placement.resource == "amd.com/gpu"


def test_vendor_ascend_keeps_the_users_node_selector() -> None:
    """vendor ascend: 8 huawei.com/Ascend910 on the Ascend node; the user's kubernetes.io/arch entry
    stays and the accelerator label is added."""
    _, _, patched = placed_sample("vendor-ascend.yaml")
    assert patched["spec"]["nodeSelector"] == {
        "kubernetes.io/arch": "arm64",
        "accelerator": "huawei-Ascend910",
    }
    assert target_limits(patched, 0)["huawei.com/Ascend910"] == "8"
    assert [t["key"] for t in patched["spec"]["tolerations"]] == ["huawei.com/Ascend910"]


def test_cuda_pod_never_lands_on_another_vendor() -> None:
    """Without gpupool.io/vendor, a Pod that wants 8 GPUs while no NVIDIA node has 8 free is not sent
    to the Ascend node that has 8 free: it stays on NVIDIA (and waits, onNoCapacity warn)."""
    obj = load_sample("gpu-count.yaml")
    obj["metadata"]["annotations"]["gpupool.io/gpu-count"] = "8"
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert result.allowed and result.placement is not None
    assert result.placement.pool.vendor == "nvidia"
    assert result.placement.resource == "nvidia.com/gpu"


# GPUs per node (allocatable) of each demo pool, from examples/cluster.yaml.
DEMO_NODE_SIZE = {
    T4: 4,
    "nvidia/medium/NVIDIA-L4": 4,
    A100: 8,
    "nvidia/high/NVIDIA-H100-80GB-HBM3": 8,
    RTX3060: 1,
    RTX4090: 2,
}


def test_waiting_pod_is_pinned_where_a_node_can_hold_it() -> None:
    """Issue 2 §5: a Pod's GPUs are on one node, and under onNoCapacity warn the Pod is pinned to the
    best matching pool *to wait* there. A pool none of whose nodes has 8 GPUs can never run an 8-GPU Pod,
    so the 8-GPU Pod must wait on the A100 or H100 pool (8 GPUs per node), not on the 1-GPU RTX 3060."""
    obj = load_sample("gpu-count.yaml")
    obj["metadata"]["annotations"]["gpupool.io/gpu-count"] = "8"
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert result.allowed and result.placement is not None
    assert DEMO_NODE_SIZE[str(result.placement.pool)] >= 8, str(result.placement.pool)
    assert any("wait" in w for w in result.warnings)


def test_pod_larger_than_any_node_is_denied() -> None:
    """No node of the demo cluster has 64 GPUs: waiting cannot help, so the Pod is denied with a
    message naming the count, instead of being pinned to a pool where it never schedules."""
    obj = load_sample("gpu-count.yaml")
    obj["metadata"]["annotations"]["gpupool.io/gpu-count"] = "64"
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert not result.allowed
    assert "64" in result.message
