"""The domain's values: a pool's name as gpupool writes it in gpupool.io/pool, and reads it back."""

from __future__ import annotations

import pytest

from webhook.domain.model import PoolKey


@pytest.mark.parametrize(
    "key",
    [
        PoolKey("nvidia", "medium", "Tesla-T4"),
        PoolKey("nvidia", "medium", "Tesla-T4-SHARED"),
        PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
        PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "nvidia.com/mig-3g.20gb"),
    ],
)
def test_a_pool_name_reads_back_as_the_same_pool(key: PoolKey) -> None:
    """Whole GPUs, replicas and single-strategy MIG instances are vendor/class/product; a mixed-strategy
    MIG instance, on a resource of its own, adds it: two pools of one product on two resources differ."""
    assert PoolKey.parse(str(key)) == key


def test_whole_gpu_pool_names_are_unchanged() -> None:
    assert str(PoolKey("nvidia", "medium", "Tesla-T4")) == "nvidia/medium/Tesla-T4"
    assert str(PoolKey("nvidia", "high", "X-MIG-3g.20gb", "nvidia.com/mig-3g.20gb")) == (
        "nvidia/high/X-MIG-3g.20gb/nvidia.com/mig-3g.20gb"
    )


@pytest.mark.parametrize("text", ["bad", "a/b", "a/b/c/d", "//", "a//c", "a/b/c/d/", "a/b/c//e", "a/b/c/d/e/f"])
def test_anything_else_is_not_a_pool_name(text: str) -> None:
    assert PoolKey.parse(text) is None
