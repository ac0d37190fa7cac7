"""MIG geometry: which instances fit one GPU of a model, and the memory a profile counts on."""

from __future__ import annotations

import pytest

from webhook.mig.config import parse_config
from webhook.mig.geometry import MODELS, Catalog, placement
from webhook.mig.layouts import layout_yield

CATALOG = Catalog()


def model(name: str):  # type: ignore[no-untyped-def]
    return next(m for m in MODELS if m.name == name)


@pytest.mark.parametrize(
    "counts",
    [
        {"7g.80gb": 1},
        {"4g.40gb": 1, "3g.40gb": 1},
        {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
        {"3g.40gb": 2},
        {"3g.40gb": 1, "2g.20gb": 2},
        {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},  # needs the 3g at slice 4: found by backtracking
        {"3g.40gb": 1, "1g.10gb": 4},
        {"2g.20gb": 3, "1g.10gb": 1},
        {"2g.20gb": 2, "1g.10gb": 3},
        {"2g.20gb": 1, "1g.10gb": 5},
        {"1g.10gb": 7},
        {"1g.20gb": 4},
    ],
)
def test_the_layouts_nvidia_documents_fit_an_a100_80gb(counts: dict[str, int]) -> None:
    assert not isinstance(placement(model("A100-80GB"), counts), str)


@pytest.mark.parametrize(
    ("counts", "why"),
    [
        ({"1g.10gb": 8}, "at most 7 x 1g.10gb"),
        ({"3g.40gb": 3}, "at most 2 x 3g.40gb"),
        ({"4g.40gb": 1, "2g.20gb": 2}, "no placement"),  # the second 2g would start at slice 6
        ({"3g.40gb": 2, "1g.10gb": 1}, "more than the 8 memory slices"),
        ({"2g.20gb": 3, "1g.10gb": 2}, "no placement"),
        ({"3g.20gb": 1}, "no MIG profile '3g.20gb'"),  # an A100-40GB's profile
    ],
)
def test_what_does_not_fit_says_why(counts: dict[str, int], why: str) -> None:
    result = placement(model("A100-80GB"), counts)
    assert isinstance(result, str)
    assert why in result


def test_an_a30_has_four_slices() -> None:
    a30 = model("A30")
    assert not isinstance(placement(a30, {"2g.12gb": 1, "1g.6gb": 2}), str)
    assert "more than the 4 memory slices" in str(placement(a30, {"2g.12gb": 1, "1g.6gb": 3}))
    assert "more than the 4 memory slices" in str(placement(a30, {"4g.24gb": 1, "1g.6gb": 1}))


def test_products_find_their_model_with_or_without_gfds_mig_suffix() -> None:
    assert CATALOG.model_of("NVIDIA-A100-SXM4-80GB").name == "A100-80GB"  # type: ignore[union-attr]
    assert CATALOG.model_of("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb").name == "A100-80GB"  # type: ignore[union-attr]
    assert CATALOG.model_of("NVIDIA-A100-80GB-PCIe").name == "A100-80GB"  # type: ignore[union-attr]
    assert CATALOG.model_of("NVIDIA-H100-80GB-HBM3").name == "H100-80GB"  # type: ignore[union-attr]
    assert CATALOG.model_of("Tesla-T4") is None
    assert CATALOG.model_of("NVIDIA-A100-SXM4-40GB-EXTRA") is None  # exact, never by substring
    assert CATALOG.device_ids("NVIDIA-A100-PCIE-40GB") == (0x20B110DE, 0x20F110DE)


def test_the_memory_gfd_reports_is_the_memory_a_profile_counts_on() -> None:
    a100 = model("A100-80GB")
    assert a100.profiles["1g.10gb"].memory_mib == 9728  # what GFD labels on an A100 80GB
    assert a100.profiles["3g.40gb"].memory_mib == 40192
    assert a100.smallest_fitting(35 * 1024).name == "3g.40gb"  # type: ignore[union-attr]
    # 40192 MiB reported, 40 GB as sold: min-memory 40Gi is met by the profile sold as 40 GB (issue 30).
    assert a100.smallest_fitting(40 * 1024).name == "3g.40gb"  # type: ignore[union-attr]
    assert a100.smallest_fitting(41 * 1024).name == "7g.80gb"  # type: ignore[union-attr]
    assert a100.smallest_fitting(81 * 1024) is None


def test_estimates_stay_below_what_the_name_promises() -> None:
    for m in MODELS:
        for p in m.profiles.values():
            if not p.measured:
                assert p.memory_mib < int(p.name.split(".")[1].split("gb")[0]) * 10**9 // 2**20


def test_memory_the_fleet_reports_replaces_the_table() -> None:
    h200 = Catalog().observed([("NVIDIA-H200-MIG-1g.18gb", "1g.18gb", 16896), ("Tesla-T4", "1g.5gb", 1)])
    profile = h200.model_of("NVIDIA-H200").profiles["1g.18gb"]  # type: ignore[union-attr]
    assert (profile.memory_mib, profile.measured) == (16896, True)
    # Nonsense is left out: no instance has 0 MiB or twice its name's memory.
    same = Catalog().observed([("NVIDIA-H200", "1g.18gb", 0), ("NVIDIA-H200", "1g.18gb", 10**9)])
    assert same.model_of("NVIDIA-H200").profiles["1g.18gb"].measured is False  # type: ignore[union-attr]


def test_one_name_means_different_cuts_on_different_models() -> None:
    config = parse_config(
        'version: v1\nmig-configs:\n  all-1g.10gb:\n    - device-filter: ["0x20B210DE"]\n      devices: all\n'
        '      mig-enabled: true\n      mig-devices: {"1g.10gb": 7}\n    - device-filter: ["0x20B010DE"]\n'
        '      devices: all\n      mig-enabled: true\n      mig-devices: {"1g.10gb": 4}\n'
    )
    layout = config.layouts["all-1g.10gb"]
    on_80 = layout_yield(layout, "NVIDIA-A100-SXM4-80GB", 1, CATALOG)
    on_40 = layout_yield(layout, "NVIDIA-A100-SXM4-40GB", 1, CATALOG)
    assert not isinstance(on_80, str) and on_80.count("1g.10gb") == 7
    assert not isinstance(on_40, str) and on_40.count("1g.10gb") == 4
