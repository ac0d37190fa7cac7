"""What a node contributes to its pool, from the labels real clusters carry."""

from __future__ import annotations

from tests.builders import gpu_node, policy
from webhook.domain.model import PoolKey, Taint
from webhook.pools.kubeobj import node_from_obj
from webhook.pools.nodes import node_facts

POLICY = policy()


def facts_of(obj: dict):  # type: ignore[no-untyped-def,type-arg]
    return node_facts(node_from_obj(obj, POLICY.gpu_resources), POLICY)


def test_explicit_class_label_wins_over_product_table() -> None:
    """An admin's label puts a T4 in class low although the table says medium; it pins both labels."""
    (f,), problems = facts_of(gpu_node("n", "Tesla-T4-SHARED", gpu_class="low"))
    assert problems == []
    assert f.pool == PoolKey("nvidia", "low", "Tesla-T4")
    assert f.selector == (("gpu.accelerator/class", "low"), ("nvidia.com/gpu.product", "Tesla-T4-SHARED"))


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
