"""Devices as GPU Feature Discovery names them, device preference lists, and the CUDA a driver runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.domain.devices import (
    CUDA_MIN_DRIVER,
    DeviceProduct,
    cuda_of_driver,
    device_kind,
    parse_device_list,
    profile_memory_mib,
    split_product,
    valid_profile,
)


@pytest.mark.parametrize(
    ("label", "parts"),
    [
        ("Tesla-T4", DeviceProduct("Tesla-T4", "", False)),
        ("Tesla-T4-SHARED", DeviceProduct("Tesla-T4", "", True)),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", DeviceProduct("NVIDIA-A100-SXM4-40GB", "1g.5gb", False)),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", DeviceProduct("NVIDIA-A100-SXM4-40GB", "1g.5gb", True)),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me", DeviceProduct("NVIDIA-H100-80GB-HBM3", "1g.10gb.me", False)),
        ("NVIDIA-A100-SXM4-40GB-MIG-INVALID", DeviceProduct("NVIDIA-A100-SXM4-40GB", "INVALID", False)),
        ("", DeviceProduct("", "", False)),
    ],
)
def test_a_product_label_says_the_model_the_mig_profile_and_sharing(label: str, parts: DeviceProduct) -> None:
    """GFD's single-strategy MIG and sharing suffixes are read, not dropped: they say which device it is."""
    assert split_product(label) == parts


def test_the_product_says_the_kind_of_device() -> None:
    """A pool's product names its kind: whole GPU, MIG instance, or shared replica (of a GPU or an instance)."""
    assert [device_kind(p) for p in ("NVIDIA-L4", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "Tesla-T4-SHARED")] == [
        "gpu",
        "mig",
        "shared",
    ]
    assert device_kind("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED") == "shared"


@pytest.mark.parametrize("profile", ["1g.5gb", "3g.20gb", "7g.80gb", "1c.3g.20gb", "1g.10gb.me", "1g.10gb+me"])
def test_mig_profiles_gfd_writes_are_read(profile: str) -> None:
    """Every profile shape GFD writes is a profile; their names promise their memory."""
    assert valid_profile(profile)


@pytest.mark.parametrize("profile", ["INVALID", "", "3g", "g.5gb", "１g.5gb", "3g.20gb-x"])
def test_anything_else_is_not_a_mig_profile(profile: str) -> None:
    assert not valid_profile(profile)


def test_a_profile_name_never_promises_more_memory_than_the_instance_has() -> None:
    """`1g.5gb` is 5 decimal GB, 4768 MiB, under the 4864 MiB GFD reports for it; `3g.20gb` under 20096."""
    assert profile_memory_mib("1g.5gb") == 4768
    assert profile_memory_mib("3g.20gb") == 19073
    assert profile_memory_mib("INVALID") == 0


def test_device_lists_keep_their_order() -> None:
    """`mig,gpu` and `[mig, gpu]` are the same ordered preference."""
    assert parse_device_list("mig, gpu") == ("mig", "gpu")
    assert parse_device_list(["shared", "gpu"]) == ("shared", "gpu")


@pytest.mark.parametrize(
    ("value", "problem"),
    [("", "empty entry"), ("gpu,", "empty entry"), ("tpu", "not a device kind"), ("gpu,gpu", "twice"),
     ([], "is empty"), ("GPU", "not a device kind")],
)  # fmt: skip
def test_bad_device_lists_say_what_is_wrong(value: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_device_list(value)


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ((535, 104, 5), (12, 2)),
        ((535, 54, 3), (12, 2)),
        ((535, 54, 2), (12, 1)),
        ((550, 54, 15), (12, 4)),
        ((545, 23, 8), (12, 3)),
        ((525, 60, 13), (12, 0)),
        ((570, 26), (12, 8)),
        ((580, 65, 6), (13, 0)),
        ((470, 82, 1), (11, 4)),
        ((999,), (13, 2)),
        ((390, 46), None),
        (None, None),
    ],
)
def test_the_cuda_a_driver_runs_follows_nvidias_table(driver: tuple[int, ...] | None, cuda: object) -> None:
    """A driver runs the newest CUDA release whose minimum driver it meets (NVIDIA's release notes)."""
    assert cuda_of_driver(driver) == cuda


@given(st.tuples(st.integers(300, 700), st.integers(0, 200), st.integers(0, 20)))
def test_a_newer_driver_never_runs_an_older_cuda(driver: tuple[int, int, int]) -> None:
    """The table is ordered: raising a driver's version never lowers the CUDA it runs."""
    newer = (driver[0], driver[1], driver[2] + 1)
    assert (cuda_of_driver(newer) or (0,)) >= (cuda_of_driver(driver) or (0,))


def test_the_driver_table_is_newest_first() -> None:
    cudas = [c for c, _ in CUDA_MIN_DRIVER]
    drivers = [d + (0,) * (3 - len(d)) for _, d in CUDA_MIN_DRIVER]
    assert cudas == sorted(cudas, reverse=True) and drivers == sorted(drivers, reverse=True)
