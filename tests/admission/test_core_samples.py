"""Each sample Pod of examples/pods/ lands on the demo inventory in the pool its annotations ask for
(class, device, MIG, compute capability, CUDA, fallback, count, groups, driver, memory), with a patch
that applies, validates and is idempotent, with jsonpatch and with kubectl alike (tests/admission/demo.py).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from tests.admission.demo import (
    A100,
    A100_1G_MIXED,
    A100_1G_SINGLE,
    A100_3G,
    H100,
    L4,
    REPO,
    RTX3060,
    RTX4090,
    SAMPLES,
    T4,
    T4_SHARED,
    check_placed,
    demo_index,
    demo_policy,
    kubectl_patch,
    load_sample,
    placed_sample,
    sample_verdict,
    shared_demo_index,
    target_limits,
)
from webhook.admission.core import evaluate
from webhook.domain.model import PoolKey
from webhook.pools.reservations import Reservation

SAMPLE_OUTCOMES = {
    "bad-annotation.yaml": None,
    "class-hint.yaml": None,
    "class-medium.yaml": T4,
    "class-preference.yaml": T4,
    "device-mig.yaml": A100_3G,
    "device-shared.yaml": T4_SHARED,
    "fallback.yaml": A100,
    "first-pod.yaml": L4,
    "generate-name.yaml": RTX3060,
    "gpu-count.yaml": A100,
    "gpu-limit-only.yaml": RTX3060,
    "group-pytorchjob-worker.yaml": A100,
    "group-size.yaml": A100,
    "group-strict.yaml": H100,
    "mig-request.yaml": A100_1G_MIXED,
    "min-compute-capability.yaml": RTX4090,
    "min-cuda.yaml": RTX4090,
    "min-driver.yaml": RTX4090,
    "min-memory.yaml": RTX4090,
    "pinned-nodeselector.yaml": T4,
    "plain-cpu.yaml": None,
    "product-a100.yaml": A100,
    "product-h20-not-h200.yaml": None,
    "students-default-class.yaml": RTX3060,
    "students-device-default.yaml": T4_SHARED,
    "target-container.yaml": T4,
    "team-a-memory-quota.yaml": T4,
    "team-a-quota.yaml": None,
    "team-b-tutorial-quota.yaml": None,
    "vendor-amd.yaml": "amd/high/AMD_Instinct_MI250X",
    "vendor-ascend.yaml": "ascend/high/huawei-Ascend910",
}
PLACED_SAMPLES = sorted(name for name, pool in SAMPLE_OUTCOMES.items() if pool)


def test_every_sample_pod_has_a_scenario() -> None:
    """Each file in examples/pods/ is covered by a scenario below (and each scenario has its file)."""
    assert sorted(p.name for p in SAMPLES.glob("*.yaml")) == sorted(SAMPLE_OUTCOMES)


@pytest.mark.parametrize("name", PLACED_SAMPLES)
def test_sample_is_placed_in_its_pool_and_the_patch_is_valid_and_idempotent(name: str) -> None:
    """Each placeable sample lands in the pool the rules give; its patch applies, validates, and is
    empty when the patched Pod is evaluated again."""
    _, result, _ = placed_sample(name)
    assert result.placement is not None
    assert str(result.placement.pool) == SAMPLE_OUTCOMES[name]


@pytest.mark.parametrize("name", PLACED_SAMPLES)
def test_sample_patch_gives_the_same_pod_with_kubectl(name: str, tmp_path: Path) -> None:
    """kube-apiserver's JSON patch library (through kubectl) produces exactly the Pod jsonpatch does;
    kubectl patch --local adds no defaults, so whole documents are compared."""
    obj, result, patched = placed_sample(name)
    assert kubectl_patch(obj, list(result.patch), tmp_path) == patched


def test_the_readmes_first_example_is_a_sample_and_lands_on_a_24_gb_card() -> None:
    """The Pod at the top of the README, as examples/pods/first-pod.yaml: the same annotations, placed on
    the demo's L4s (24 GB as sold, 23034 MiB reported). Without the toleration of the L4 node's taint it
    is denied, naming the taint: what the README says beside it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    first = yaml.safe_load(readme.split("```yaml\n", 1)[1].split("```", 1)[0])
    obj, result, _ = placed_sample("first-pod.yaml")
    assert obj["metadata"]["annotations"] == first["metadata"]["annotations"]
    assert result.placement is not None and str(result.placement.pool) == L4
    untolerated = copy.deepcopy(obj)
    del untolerated["spec"]["tolerations"]
    denied = evaluate(untolerated, "ml-train", demo_policy(), demo_index())
    assert not denied.allowed
    assert any("NVIDIA-L4" in r and "dedicated=inference" in r for r in denied.reasons)


def test_class_medium_goes_to_t4_with_limit_requests_selector_and_annotation() -> None:
    """medium: T4 has free GPUs and L4 is tainted, so T4; the limit is added, requests kept equal
    (the container sets requests), and the nodeSelector pins class label and product label."""
    _, result, patched = placed_sample("class-medium.yaml")
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert resources["requests"]["nvidia.com/gpu"] == "1"
    assert resources["requests"]["cpu"] == "4" and resources["limits"]["memory"] == "16Gi"
    assert patched["spec"]["nodeSelector"] == {
        "gpu.accelerator/class": "medium",
        "nvidia.com/gpu.product": "Tesla-T4",
    }
    assert "tolerations" not in patched["spec"], "T4 nodes carry no taint to tolerate"
    assert result.warnings == ()
    reasons = "\n".join(result.reasons)
    assert "NVIDIA-L4" in reasons and "dedicated=inference" in reasons


def test_class_medium_is_not_pinned_to_shared_replicas() -> None:
    """The issue's second case: beside the dedicated T4s, the time-sliced T4 has more free "GPUs", but a
    Pod that did not ask to share gets a whole T4; the replicas are passed over saying why."""
    _, result, patched = placed_sample("class-medium.yaml")
    assert patched["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert any(r.startswith(f"{T4_SHARED}: rejected: device shared not in gpu") for r in result.reasons)


def test_class_high_gets_a_whole_a100_not_a_mig_slice() -> None:
    """The issue's first case: class high goes to a whole 40 GB A100, pinned to the whole-GPU product,
    not to a 5 GB slice of the single-strategy MIG node (which a class label and product prefix share)."""
    obj = load_sample("class-medium.yaml")
    obj["metadata"]["annotations"]["gpupool.io/gpu-class"] = "high"
    result, patched = check_placed(obj, "ml-train", demo_policy(), shared_demo_index())
    assert result.placement is not None and str(result.placement.pool) == A100
    assert patched["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert result.placement.device == "gpu"


def test_device_mig_takes_the_smallest_instance_with_enough_memory() -> None:
    """`mig,gpu` with 16Gi: a 3g.20gb instance (20096Mi) of the mixed-strategy node, not a 1g.5gb (too
    small) nor a whole GPU; its own resource is added, pinned by the profile's product label."""
    _, result, patched = placed_sample("device-mig.yaml")
    limits = target_limits(patched, 0)
    assert limits["nvidia.com/mig-3g.20gb"] == "1" and "nvidia.com/gpu" not in limits
    assert patched["spec"]["nodeSelector"] == {
        "gpu.accelerator/class": "high",
        "nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
    }
    assert [t["key"] for t in patched["spec"]["tolerations"]] == ["nvidia.com/gpu"]
    assert any(
        r.startswith(f"{A100_1G_SINGLE}: rejected: 5Gi as sold (4864Mi reported) < min-memory 16Gi")
        for r in result.reasons
    )


def test_device_mig_falls_back_to_a_whole_gpu_when_no_instance_that_size_is_free() -> None:
    """With the three free 3g.20gb instances taken, the same Pod gets a whole GPU (of the least capable
    class with 16Gi: the RTX 4090), not a smaller instance."""
    index = demo_index()
    for i in range(3):
        index.reserve(
            Reservation(namespace="ml-train", pool=PoolKey.parse(A100_3G), selector=(), gpus=1, name=f"other-{i}"),
            now=0.0,
        )  # type: ignore[arg-type]
    result, _ = check_placed(load_sample("device-mig.yaml"), "ml-train", demo_policy(), index)
    assert result.placement is not None and str(result.placement.pool) == RTX4090


def test_device_shared_takes_a_replica_and_the_same_pod_without_it_a_whole_t4() -> None:
    """`device: shared`: a replica of the time-sliced T4 (3840Mi); without the annotation, a dedicated T4."""
    _, result, patched = placed_sample("device-shared.yaml")
    assert patched["spec"]["nodeSelector"] == {
        "gpu.accelerator/class": "medium",
        "nvidia.com/gpu.product": "Tesla-T4-SHARED",
    }
    assert result.placement is not None and result.placement.device == "shared"
    obj = load_sample("device-shared.yaml")
    del obj["metadata"]["annotations"]["gpupool.io/device"]
    plain, _ = check_placed(obj, "ml-train", demo_policy(), shared_demo_index())
    assert plain.placement is not None and str(plain.placement.pool) == T4


def test_two_shared_replicas_alone_are_refused_naming_both_annotations() -> None:
    obj = load_sample("device-shared.yaml")
    obj["metadata"]["annotations"]["gpupool.io/gpu-count"] = "2"
    _, result = obj, evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert (result.allowed, result.code) == (False, 400)
    assert "gpupool.io/gpu-count: 2 with gpupool.io/device: shared" in result.message


def test_students_get_a_replica_by_their_namespace_default_and_a_gpu_when_they_ask() -> None:
    """examples/policy.yaml gives students `device: [shared, gpu]`: a medium Pod gets a replica; one that
    names `gpupool.io/device: gpu` gets a whole T4."""
    _, result, _ = placed_sample("students-device-default.yaml")
    assert result.placement is not None and result.placement.device == "shared"
    obj = load_sample("students-device-default.yaml")
    obj["metadata"]["annotations"]["gpupool.io/device"] = "gpu"
    whole, _ = check_placed(obj, "students", demo_policy(), shared_demo_index())
    assert whole.placement is not None and str(whole.placement.pool) == T4


def test_a_pod_requesting_a_mig_instance_is_placed_among_that_resources_pools() -> None:
    """`nvidia.com/mig-1g.5gb: 1` and no annotation: the mixed-strategy 1g.5gb pool, not the single
    strategy's (another resource) nor a whole GPU; the limit is kept as written."""
    obj, result, patched = placed_sample("mig-request.yaml")
    assert patched["spec"]["containers"] == obj["spec"]["containers"]
    assert patched["spec"]["nodeSelector"] == {
        "gpu.accelerator/class": "high",
        "nvidia.com/mig-1g.5gb.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    }
    assert any(r.startswith(f"{A100_1G_SINGLE}: rejected: its devices are nvidia.com/gpu") for r in result.reasons)


def test_a_mig_request_in_a_namespace_that_may_not_use_high_is_refused() -> None:
    """The MIG instances are high-class: students (low, medium) may not have one, like any high GPU."""
    obj = load_sample("mig-request.yaml")
    result = evaluate(obj, "students", demo_policy(), shared_demo_index())
    assert (result.allowed, result.code) == (False, 403)
    assert "class high is not allowed in namespace students" in result.message


def test_min_compute_capability_passes_over_older_gpus() -> None:
    """8.9: the RTX 4090 (8.9); the RTX 3060 (8.6) and the T4s (7.5) are passed over saying so."""
    _, result, _ = placed_sample("min-compute-capability.yaml")
    reasons = "\n".join(result.reasons)
    assert "NVIDIA-GeForce-RTX-3060: rejected: compute capability 8.6 < min-compute-capability 8.9" in reasons
    assert "nvidia/medium/Tesla-T4: rejected: compute capability 7.5 < min-compute-capability 8.9" in reasons


def test_min_compute_capability_on_amd_is_refused() -> None:
    obj = load_sample("min-compute-capability.yaml")
    obj["metadata"]["annotations"]["gpupool.io/vendor"] = "amd"
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert (result.allowed, result.code) == (False, 400) and "gpupool.io/min-compute-capability" in result.message


def test_min_cuda_derives_old_nodes_cuda_from_their_driver() -> None:
    """12.3: the RTX 3060 has no CUDA label, and its driver 525.60.13 runs CUDA 12.0 (NVIDIA's table);
    the A100s and T4s say 12.2; the RTX 4090 says 12.3 and is taken."""
    _, result, _ = placed_sample("min-cuda.yaml")
    reasons = "\n".join(result.reasons)
    assert "NVIDIA-GeForce-RTX-3060: rejected: CUDA 12.0 < min-cuda 12.3" in reasons
    assert f"{A100}: rejected: CUDA 12.2 < min-cuda 12.3" in reasons


def test_class_preference_takes_the_first_class_with_free_gpus() -> None:
    """medium,high: the medium T4 pool has a free GPU, so the Pod does not go to high."""
    _, result, _ = placed_sample("class-preference.yaml")
    assert result.placement is not None and result.placement.pool.gpu_class == "medium"
    assert result.warnings == ()


def test_fallback_sample_goes_to_the_least_capable_high_pool() -> None:
    """4 GPUs on one medium node: no T4 node has 4 free, the L4 is tainted; with fallback the Pod goes
    to high, where the 40 GB A100 (7 free on one node) beats the full 80 GB H100; the A100's GPU taint
    is tolerated by an added toleration."""
    _, result, patched = placed_sample("fallback.yaml")
    assert result.placement is not None and result.placement.fallback
    assert target_limits(patched, 0)["nvidia.com/gpu"] == "4"
    tolerations = patched["spec"]["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" and t.get("effect") in (None, "NoSchedule") for t in tolerations)


def test_fallback_sample_without_fallback_waits_on_the_medium_pool() -> None:
    """The same Pod without fallback is admitted to the best medium pool (onNoCapacity warn) with a
    warning that it will wait."""
    obj = load_sample("fallback.yaml")
    del obj["metadata"]["annotations"]["gpupool.io/fallback"]
    result, _ = check_placed(obj, "ml-train", demo_policy(), shared_demo_index())
    assert result.placement is not None and str(result.placement.pool) == T4
    assert not result.placement.has_capacity
    assert any("wait" in w for w in result.warnings)


def test_generate_name_pod_is_placed_on_the_smaller_low_card() -> None:
    """A Pod with only generateName is answered all the same; low: the RTX 3060 (12 GiB) before the
    RTX 4090 (24 GiB); its nodes have no class label, so only the product label is pinned."""
    _, _, patched = placed_sample("generate-name.yaml")
    assert "name" not in patched["metadata"]
    assert patched["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-3060"}


def test_gpu_count_four_needs_one_node_with_four_free() -> None:
    """4 GPUs, any class, least capable first: no low or T4 node has 4 free (free GPUs on several
    nodes do not add up), the L4 is tainted, so the A100 takes it, without a warning."""
    _, result, patched = placed_sample("gpu-count.yaml")
    assert target_limits(patched, 0)["nvidia.com/gpu"] == "4"
    assert result.warnings == ()
    assert result.placement is not None and result.placement.has_capacity


def test_gpu_limit_only_pod_keeps_its_limit_and_gets_selector_and_annotation() -> None:
    """No annotation but nvidia.com/gpu: 1: placed with its own count (the limit untouched), in the
    least capable pool with a free GPU, since ml-train has no default class."""
    obj, result, patched = placed_sample("gpu-limit-only.yaml")
    assert patched["spec"]["containers"] == obj["spec"]["containers"]
    assert not any(op["path"].startswith("/spec/containers") for op in result.patch)
    assert patched["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-3060"}


def test_a_pytorchjob_worker_joins_its_master_on_the_a100_pool() -> None:
    """The worker's group comes from the training operator's label; its master runs on the A100 pool, so
    the 2-GPU worker goes there, where the ranking alone would take the T4s (it names no class)."""
    obj, result, _ = placed_sample("group-pytorchjob-worker.yaml")
    assert result.placement is not None and str(result.placement.pool) == A100
    assert result.group is not None and (result.group.name, str(result.group.pool)) == (
        "KubeflowJob/llama-7b-sft",
        A100,
    )
    alone = copy.deepcopy(obj)
    del alone["metadata"]["labels"], alone["metadata"]["ownerReferences"]
    lone = evaluate(alone, "ml-train", demo_policy(), shared_demo_index())
    assert lone.placement is not None and str(lone.placement.pool) == T4


def test_a_strict_worker_waits_with_its_master_on_the_full_h100_pool() -> None:
    """group-policy strict: the H100 node its master holds is full, so the worker is pinned there with a
    warning that it will wait; under the default (prefer) it goes to the A100 pool, saying the group
    is split."""
    obj, result = sample_verdict("group-strict.yaml")
    assert result.placement is not None and str(result.placement.pool) == H100
    assert not result.placement.has_capacity
    assert result.warnings == (
        "gpupool: no NVIDIA-H100-80GB-HBM3 node has 4 free GPUs now; the Pod will wait with group "
        "KubeflowJob/mixtral-pretrain",
    )
    del obj["metadata"]["annotations"]["gpupool.io/group-policy"]
    prefer = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert prefer.placement is not None and str(prefer.placement.pool) == A100
    assert prefer.warnings == (
        "gpupool: group KubeflowJob/mixtral-pretrain split across pools NVIDIA-H100-80GB-HBM3 and "
        "NVIDIA-A100-SXM4-40GB",
    )


def test_group_size_takes_the_pool_with_room_for_the_whole_sweep() -> None:
    """4 Pods of 2 GPUs fit at once on the A100 pool, not on the T4s the ranking alone would take."""
    obj, result, _ = placed_sample("group-size.yaml")
    assert str(result.placement.pool) == A100  # type: ignore[union-attr]
    del obj["metadata"]["annotations"]["gpupool.io/group-size"]
    assert str(evaluate(obj, "ml-train", demo_policy(), shared_demo_index()).placement.pool) == T4  # type: ignore[union-attr]


def test_min_driver_skips_older_drivers() -> None:
    """min-driver 545: only the RTX 4090 (545.23.08) and the H100 (550) qualify; the low class first.
    The RTX 3060's driver comes from the legacy labels (525.60.13) and is too old."""
    _, result, _ = placed_sample("min-driver.yaml")
    reasons = "\n".join(result.reasons)
    assert re.search(r"RTX-3060.*525\.60\.13", reasons), reasons


def test_min_memory_prefers_the_24_gb_card() -> None:
    """min-memory 20Gi: T4 (15 GiB) and RTX 3060 are too small; the 24 GB RTX 4090 is taken, not an
    A100 or the 80 GB H100."""
    _, result, _ = placed_sample("min-memory.yaml")
    t4 = [r for r in result.reasons if r.startswith(f"{T4}:")]
    assert t4 and all("min-memory" in r for r in t4), result.reasons
