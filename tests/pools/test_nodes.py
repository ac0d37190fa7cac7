"""What a node contributes to its pool, from the labels real clusters carry."""

from __future__ import annotations

from tests.builders import gpu_node, mig_mixed_node, mig_single_node, policy, shared_node
from webhook.domain.model import PoolKey, Taint
from webhook.pools.kubeobj import node_from_obj
from webhook.pools.nodes import node_facts

POLICY = policy()


def facts_of(obj: dict):  # type: ignore[no-untyped-def,type-arg]
    return node_facts(node_from_obj(obj, POLICY.gpu_resources, POLICY.partition_prefixes), POLICY)


def test_explicit_class_label_wins_over_product_table() -> None:
    """An admin's label puts a T4 in class low although the table says medium; it pins both labels."""
    (f,), problems = facts_of(gpu_node("n", "Tesla-T4", gpu_class="low"))
    assert problems == []
    assert f.pool == PoolKey("nvidia", "low", "Tesla-T4")
    assert f.selector == (("gpu.accelerator/class", "low"), ("nvidia.com/gpu.product", "Tesla-T4"))


def test_unlabelled_node_gets_class_from_product_table_and_pins_product_only() -> None:
    """GFD labels alone are enough: H100 is high, and only the product label pins it."""
    (f,), _ = facts_of(gpu_node("n", "NVIDIA-H100-80GB-HBM3", gpu_class=None, memory_mib=81559))
    assert f.pool == PoolKey("nvidia", "high", "NVIDIA-H100-80GB-HBM3")
    assert f.selector == (("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),)
    assert f.memory_mib == 81559


def test_memory_falls_back_to_product_table() -> None:
    """Without nvidia.com/gpu.memory the product table gives the memory."""
    (f,), _ = facts_of(gpu_node("n", "NVIDIA-L4", memory_mib=None))
    assert f.memory_mib == 24 * 1024


def test_legacy_driver_labels_are_read() -> None:
    """Older GFD releases label major/minor/rev separately."""
    obj = gpu_node(
        "n",
        driver=None,
        labels={
            "nvidia.com/cuda.driver.major": "525",
            "nvidia.com/cuda.driver.minor": "60",
            "nvidia.com/cuda.driver.rev": "13",
        },
    )
    (f,), _ = facts_of(obj)
    assert f.driver == (525, 60, 13)


def test_gpu_taints_are_separated_from_other_taints() -> None:
    """Policy GPU taints are tolerated by gpupool; other blocking taints stay the Pod's business."""
    obj = gpu_node(
        "n",
        taints=[
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "inference", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"},
        ],
    )
    (f,), _ = facts_of(obj)
    assert f.gpu_taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert f.other_taints == (Taint("dedicated", "inference", "NoSchedule"),)


def test_not_ready_or_cordoned_nodes_are_not_usable() -> None:
    """Only Ready, schedulable nodes offer free GPUs."""
    assert not facts_of(gpu_node("n", ready=False))[0][0].usable
    assert not facts_of(gpu_node("n", unschedulable=True))[0][0].usable
    assert facts_of(gpu_node("n"))[0][0].usable


def test_amd_and_ascend_nodes() -> None:
    """Other vendors are recognised by their resource and labels, with their own memory units."""
    amd = gpu_node(
        "m",
        gpu_class=None,
        resource="amd.com/gpu",
        labels={"amd.com/gpu.product-name": "AMD_Instinct_MI250X", "amd.com/gpu.vram": "64G"},
    )
    (f,), _ = facts_of(amd)
    assert (f.pool, f.memory_mib, f.resource) == (PoolKey("amd", "high", "AMD_Instinct_MI250X"), 65536, "amd.com/gpu")
    npu = gpu_node("a", gpu_class=None, resource="huawei.com/Ascend910", labels={"accelerator": "huawei-Ascend910"})
    (g,), _ = facts_of(npu)
    assert (g.pool, g.memory_mib) == (PoolKey("ascend", "high", "huawei-Ascend910"), 32 * 1024)


def test_unclassifiable_nodes_are_reported_not_guessed() -> None:
    """An unknown class label or an unknown product without a label is reported with the reason."""
    facts, problems = facts_of(gpu_node("n", gpu_class="ultra"))
    assert facts == [] and "gpu.accelerator/class=ultra is not a class" in problems[0].reason
    facts, problems = facts_of(gpu_node("q", "Quadro-P2000", gpu_class=None))
    assert facts == [] and "Quadro-P2000 is not in the policy's product table" in problems[0].reason


def test_cpu_node_has_no_facts() -> None:
    """A node without a GPU resource is no pool's business, even with stray GPU labels."""
    obj = gpu_node("cpu")
    del obj["status"]["allocatable"]["nvidia.com/gpu"]
    assert facts_of(obj) == ([], [])


def test_mig_and_shared_pools_are_of_their_own_product_and_their_gpus_class() -> None:
    """A MIG instance's or replica's pool is its exact device product, in its GPU's class (the product
    table's A100 and T4 entries), not the GPU's pool; a mixed-strategy profile is on its own resource."""
    (single,), _ = facts_of(mig_single_node("mig-a", gpu_class=None))
    assert (single.pool, single.kind, single.memory_mib) == (
        PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
        "mig",
        4864,
    )
    (shared,), _ = facts_of(shared_node("ts-a", gpu_class=None))
    assert (shared.pool, shared.kind, shared.replicas) == (PoolKey("nvidia", "medium", "Tesla-T4-SHARED"), "shared", 4)
    mixed, _ = facts_of(mig_mixed_node("mixed-a", gpu_class=None))
    assert sorted(f.pool for f in mixed) == [
        PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB"),
        PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/mig-1g.5gb"),
        PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/mig-3g.20gb"),
    ]


def test_a_more_specific_product_entry_or_the_class_label_gives_a_device_another_class() -> None:
    """`A100-MIG-1g.5gb: low` is more specific than `A100: high`; the node's class label wins over both."""
    custom = policy("products: [{match: A100, class: high}, {match: A100-MIG-1g.5gb, class: low}]")
    node = node_from_obj(mig_single_node("mig-a", gpu_class=None), custom.gpu_resources, custom.partition_prefixes)
    ((f,), _) = node_facts(node, custom)
    assert f.pool.gpu_class == "low"
    ((g,), _) = facts_of(mig_single_node("mig-b", gpu_class="medium"))
    assert g.pool.gpu_class == "medium"
    assert ("gpu.accelerator/class", "medium") in g.selector


def test_compute_capability_comes_from_gfd_labels_else_the_product_table() -> None:
    """GFD's compute labels first; without them the product table (T4 7.5); unknown products have none."""
    labelled = gpu_node("n", labels={"nvidia.com/gpu.compute.major": "7", "nvidia.com/gpu.compute.minor": "5"})
    assert facts_of(labelled)[0][0].compute == (7, 5)
    assert facts_of(gpu_node("n", "NVIDIA-L4"))[0][0].compute == (8, 9)
    assert facts_of(gpu_node("n", "Quadro-P2000"))[0][0].compute is None


def test_cuda_comes_from_gfd_labels_else_from_the_driver() -> None:
    """The runtime-version label, else its major and minor labels, else NVIDIA's driver table
    (535.104.05 runs CUDA 12.2); no driver, no CUDA."""
    full = gpu_node("n", labels={"nvidia.com/cuda.runtime-version.full": "12.4"})
    assert facts_of(full)[0][0].cuda == (12, 4)
    parts = gpu_node(
        "n", labels={"nvidia.com/cuda.runtime-version.major": "12", "nvidia.com/cuda.runtime-version.minor": "3"}
    )
    assert facts_of(parts)[0][0].cuda == (12, 3)
    assert facts_of(gpu_node("n", driver="535.104.05"))[0][0].cuda == (12, 2)
    assert facts_of(gpu_node("n", driver=None))[0][0].cuda is None


def test_other_vendors_have_no_compute_capability_or_cuda() -> None:
    amd = gpu_node("m", gpu_class="high", resource="amd.com/gpu", labels={"amd.com/gpu.product-name": "MI250X"})
    ((f,), _) = facts_of(amd)
    assert (f.compute, f.cuda) == (None, None)


def test_unusable_devices_are_reported_with_the_reason() -> None:
    """A changing MIG layout is reported for the node's NVIDIA devices, not pooled."""
    facts, problems = facts_of(mig_mixed_node("changing", labels={"nvidia.com/mig.config.state": "rebooting"}))
    assert facts == []
    assert [(u.node, u.vendor) for u in problems] == [("changing", "nvidia")]
    assert "nvidia.com/mig.config.state=rebooting" in problems[0].reason
