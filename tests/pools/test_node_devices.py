"""The devices a node offers, read from the labels GPU Feature Discovery writes: whole GPUs, MIG
instances (single and mixed strategy) and time-sliced replicas, and the nodes that must not be used."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import (
    ascend_node,
    gpu_node,
    mig_mixed_node,
    mig_single_node,
    policy,
    renamed_shared_node,
    shared_node,
)
from webhook.pools.kubeobj import node_from_obj
from webhook.pools.node_devices import Device, node_devices

POLICY = policy()
NVIDIA = POLICY.vendors["nvidia"]


def devices_of(obj: dict[str, Any]) -> tuple[list[Device], list[str]]:
    return node_devices(node_from_obj(obj, POLICY.gpu_resources, POLICY.partition_prefixes), NVIDIA, POLICY)


def test_a_single_strategy_mig_node_offers_instances_not_gpus() -> None:
    """The issue's node: `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`, 4864 MiB, 56 devices are 56 MIG instances
    of 4864 MiB on nvidia.com/gpu, pinned by their exact product, not 56 A100s."""
    ((device,), problems) = devices_of(mig_single_node("mig-a"))
    assert problems == []
    assert device == Device(
        resource="nvidia.com/gpu",
        kind="mig",
        product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        profile="1g.5gb",
        replicas=0,
        selector=(("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),),
        memory_mib=4864,
        allocatable=56,
        sold_mib=5 * 1024,  # 1g.5gb, sold as 5 GB (a GiB: webhook.domain.memory)
    )


def test_a_mixed_strategy_node_offers_each_profile_on_its_resource_and_its_whole_gpus() -> None:
    """Mixed strategy: the remaining whole GPUs stay whole GPUs on nvidia.com/gpu; each profile is a
    device on nvidia.com/mig-<profile>, described by its own product, memory and count labels."""
    devices, problems = devices_of(mig_mixed_node("mixed-a"))
    assert problems == []
    by_resource = {d.resource: d for d in devices}
    assert sorted(by_resource) == ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb"]
    whole = by_resource["nvidia.com/gpu"]
    assert (whole.kind, whole.product, whole.memory_mib, whole.allocatable) == (
        "gpu",
        "NVIDIA-A100-SXM4-40GB",
        40960,
        4,
    )
    mig = by_resource["nvidia.com/mig-3g.20gb"]
    assert (mig.kind, mig.product, mig.profile, mig.memory_mib, mig.allocatable) == (
        "mig",
        "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        "3g.20gb",
        20096,
        4,
    )
    assert mig.selector == (("nvidia.com/mig-3g.20gb.product", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"),)


def test_a_mixed_profile_without_labels_is_named_from_its_gpu_and_its_profile() -> None:
    """Without `<resource>.product` and `.memory` labels, the instance is `<model>-MIG-<profile>` and has
    the memory its profile's name promises (never more than it has)."""
    obj = mig_mixed_node("mixed-b", instances={})
    obj["status"]["allocatable"]["nvidia.com/mig-2g.10gb"] = "3"
    devices, _ = devices_of(obj)
    mig = next(d for d in devices if d.resource == "nvidia.com/mig-2g.10gb")
    assert (mig.product, mig.memory_mib, mig.allocatable) == ("NVIDIA-A100-SXM4-40GB-MIG-2g.10gb", 9536, 3)
    assert mig.selector == (("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),)


def test_a_time_sliced_node_offers_replicas_with_a_share_of_the_memory() -> None:
    """The issue's node: `Tesla-T4-SHARED` with 4 replicas: 4 shared devices of 15360 / 4 MiB each."""
    ((device,), _) = devices_of(shared_node("ts-a"))
    assert (device.kind, device.product, device.replicas, device.memory_mib, device.allocatable) == (
        "shared",
        "Tesla-T4-SHARED",
        4,
        3840,
        4,
    )
    assert device.selector == (("nvidia.com/gpu.product", "Tesla-T4-SHARED"),)


@pytest.mark.parametrize(
    ("labels", "pin"),
    [
        ({"nvidia.com/gpu.replicas": "4"}, ("nvidia.com/gpu.replicas", "4")),
        (
            {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.count": "1"},
            ("nvidia.com/gpu.sharing-strategy", "mps"),
        ),
    ],
)
def test_replicas_without_the_shared_suffix_are_still_replicas(labels: dict[str, str], pin: tuple[str, str]) -> None:
    """Sharing told by `nvidia.com/gpu.replicas` above 1 or a time-slicing/MPS sharing strategy alone:
    the device is a replica all the same, named as GFD would name it, and its selector pins the label
    that tells its nodes from whole-GPU ones. Replicas come from the label, else from allocatable / count."""
    ((device,), _) = devices_of(gpu_node("ts-b", "Tesla-T4", 4, labels=labels))
    assert (device.kind, device.product, device.replicas, device.memory_mib) == ("shared", "Tesla-T4-SHARED", 4, 3840)
    assert pin in device.selector


def test_a_shared_node_whose_replicas_are_unknown_promises_no_memory() -> None:
    """`-SHARED` with neither a replicas label nor a GPU count: how much of the GPU a replica gets is
    unknown, so its memory is unknown (it never satisfies a min-memory)."""
    obj = gpu_node("ts-c", "Tesla-T4-SHARED", 4)
    ((device,), _) = devices_of(obj)
    assert (device.kind, device.memory_mib) == ("shared", 0)


def test_an_invalid_mig_layout_is_reported_not_pooled() -> None:
    """GFD's `-MIG-INVALID` (count 0) is reported even when the device plugin advertises nothing."""
    obj = gpu_node("bad-a", "NVIDIA-A100-SXM4-40GB-MIG-INVALID", 0, labels={"nvidia.com/gpu.count": "0"})
    del obj["status"]["allocatable"]["nvidia.com/gpu"]
    devices, problems = devices_of(obj)
    assert devices == [] and "invalid MIG layout" in problems[0]
    devices, problems = devices_of(mig_single_node("bad-b", labels={"nvidia.com/gpu.count": "0"}))
    assert devices == [] and "MIG layout is invalid" in problems[0]


@pytest.mark.parametrize("state", ["pending", "rebooting", "failed"])
def test_a_node_whose_mig_configuration_is_changing_is_reported_not_pooled(state: str) -> None:
    """While the MIG manager applies a layout (or after it failed), none of the node's devices are used."""
    devices, problems = devices_of(mig_mixed_node("changing", labels={"nvidia.com/mig.config.state": state}))
    assert devices == []
    assert problems == [f"its MIG configuration is not in place (nvidia.com/mig.config.state={state})"]


def test_a_node_whose_mig_configuration_is_in_place_is_pooled() -> None:
    devices, problems = devices_of(mig_mixed_node("done", labels={"nvidia.com/mig.config.state": "success"}))
    assert len(devices) == 3 and problems == []


def test_a_node_without_gpu_resources_offers_nothing() -> None:
    """Stray GPU labels on a CPU node (even a MIG state) are no pool's business."""
    obj = gpu_node("cpu", labels={"nvidia.com/mig.config.state": "pending"})
    del obj["status"]["allocatable"]["nvidia.com/gpu"]
    assert devices_of(obj) == ([], [])


# --- replicas on a resource of their own, other cards and virtual NPUs -----------------------------------


def test_replicas_renamed_by_default_are_shared_devices_of_their_gpu() -> None:
    """GFD's `renameByDefault: true`: 16 replicas of 4 H100s on nvidia.com/gpu.shared, the product not
    suffixed. One shared device: its own resource, the product as GFD would suffix it, a quarter of the
    GPU's memory, pinned by the product label (the resource itself reaches only nodes that offer it)."""
    ((device,), problems) = devices_of(renamed_shared_node("ts-h100"))
    assert problems == []
    assert device == Device(
        resource="nvidia.com/gpu.shared",
        kind="shared",
        product="NVIDIA-H100-80GB-HBM3-SHARED",
        profile="",
        replicas=4,
        selector=(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),),
        memory_mib=81559 // 4,
        allocatable=16,
        sold_mib=80 * 1024 // 4,
    )


def test_renamed_replicas_beside_whole_gpus_leave_the_whole_gpus_whole() -> None:
    """While a node still shows nvidia.com/gpu beside the renamed replicas, the sharing labels describe
    the replicas: the GPUs stay whole GPUs of their own product."""
    obj = renamed_shared_node("ts-h100")
    obj["status"]["allocatable"]["nvidia.com/gpu"] = "2"
    devices, _ = devices_of(obj)
    assert sorted((d.resource, d.kind, d.product) for d in devices) == [
        ("nvidia.com/gpu", "gpu", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.shared", "shared", "NVIDIA-H100-80GB-HBM3-SHARED"),
    ]


def test_renamed_replicas_of_a_mig_profile_are_shared_instances() -> None:
    """Mixed strategy with renaming: nvidia.com/mig-1g.5gb.shared carries replicas of 1g.5gb instances,
    described by the nvidia.com/mig-1g.5gb.* labels (its product not suffixed)."""
    obj = mig_mixed_node("mixed-a", whole=0, instances={"1g.5gb": (7, 4864)})
    obj["metadata"]["labels"]["nvidia.com/mig-1g.5gb.replicas"] = "2"
    allocatable = obj["status"]["allocatable"]
    allocatable["nvidia.com/mig-1g.5gb.shared"] = str(2 * int(allocatable.pop("nvidia.com/mig-1g.5gb")))
    devices, _ = devices_of(obj)
    shared = next(d for d in devices if d.resource == "nvidia.com/mig-1g.5gb.shared")
    assert (shared.kind, shared.product, shared.profile, shared.replicas, shared.memory_mib, shared.allocatable) == (
        "shared",
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
        "1g.5gb",
        2,
        4864 // 2,
        14,
    )


ASCEND = POLICY.vendors["ascend"]


def ascend_devices(obj: dict[str, Any]) -> list[Device]:
    devices, problems = node_devices(
        node_from_obj(obj, POLICY.gpu_resources, POLICY.partition_prefixes), ASCEND, POLICY
    )
    assert problems == []
    return devices


def test_an_ascend_310p_card_is_a_whole_device_on_its_own_resource() -> None:
    """A 310P node (`accelerator=huawei-Ascend310P`, huawei.com/Ascend310P): whole devices of the Ascend
    vendor on that resource, with the product table's memory."""
    (device,) = ascend_devices(ascend_node("a310p", "Ascend310P", {"huawei.com/Ascend310P": 4}))
    assert (device.resource, device.kind, device.product, device.memory_mib, device.allocatable) == (
        "huawei.com/Ascend310P",
        "gpu",
        "huawei-Ascend310P",
        24 * 1024,
        4,
    )
    assert device.selector == (("accelerator", "huawei-Ascend310P"),)


@pytest.mark.parametrize(
    ("card", "resource", "product"),
    [
        ("Ascend910", "huawei.com/Ascend910-4c", "huawei-Ascend910-vNPU-4c"),
        ("Ascend310P", "huawei.com/Ascend310P-2c.1cpu", "huawei-Ascend310P-vNPU-2c.1cpu"),
    ],
)
def test_a_virtual_npu_is_a_partition_of_its_card(card: str, resource: str, product: str) -> None:
    """Static vNPUs are partitions of the card: kind mig, named after the card and the template, pinned
    to nodes of the card, their memory unknown (no label says it)."""
    devices = ascend_devices(ascend_node("v", card, {f"huawei.com/{card}": 1, resource: 4}))
    vnpu = next(d for d in devices if d.resource == resource)
    assert (vnpu.kind, vnpu.product, vnpu.memory_mib, vnpu.allocatable) == ("mig", product, 0, 4)
    assert vnpu.selector == (("accelerator", f"huawei-{card}"),)
    assert {d.resource for d in devices} == {f"huawei.com/{card}", resource}
