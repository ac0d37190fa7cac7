"""What a named layout yields on a node: per device filter, GPU model and GPU index, or why not."""

from __future__ import annotations

from tests.mig.configs import A30, A100_40, A100_40_PCIE, A100_80, CUSTOM, H100, H200, H200_NVL, operator_layouts
from webhook.mig.config import parse_config
from webhook.mig.layouts import Layouts, Yield, gpu_count


def yields(layouts: Layouts, product: str, gpus: int = 1) -> dict[str, str]:
    return {n: y.describe() if isinstance(y, Yield) else f"! {y}" for n, y in layouts.on(product, gpus).items()}


def test_device_filters_choose_the_entry_per_model() -> None:
    layouts = operator_layouts("all-1g.10gb", "all-balanced", "all-1g.35gb")
    assert yields(layouts, A100_80, 8)["all-1g.10gb"] == "56 x 1g.10gb"
    assert yields(layouts, A100_40, 8)["all-1g.10gb"] == "32 x 1g.10gb"
    assert yields(layouts, H100)["all-balanced"] == "2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb"
    assert yields(layouts, A100_40)["all-balanced"] == "2 x 1g.5gb, 1 x 2g.10gb, 1 x 3g.20gb"
    assert yields(layouts, A30)["all-balanced"] == "2 x 1g.6gb, 1 x 2g.12gb"
    assert yields(layouts, H200)["all-1g.35gb"] == "4 x 1g.35gb"
    # The H200 NVL (0x233B) is in no entry's filter: mig-manager would leave its GPUs as they are.
    assert yields(layouts, H200_NVL)["all-1g.35gb"].startswith("! no entry of all-1g.35gb matches GPU 0")


def test_a_layout_without_a_filter_is_judged_by_the_models_geometry() -> None:
    layouts = operator_layouts("all-3g.40gb", "all-3g.20gb", "all-7g.80gb")
    on_80, on_40 = yields(layouts, A100_80, 2), yields(layouts, A100_40, 2)
    assert on_80["all-3g.40gb"] == "4 x 3g.40gb"
    assert "has no MIG profile '3g.40gb'" in on_40["all-3g.40gb"]
    assert on_40["all-3g.20gb"] == "4 x 3g.20gb"
    assert "has no MIG profile '3g.20gb'" in on_80["all-3g.20gb"]


def test_a_filter_that_names_only_one_of_a_products_pci_ids_cannot_be_told() -> None:
    config = parse_config(
        'version: v1\nmig-configs:\n  one-id: [{device-filter: "0x20B110DE", devices: all, mig-enabled: true,'
        ' mig-devices: {"3g.20gb": 2}}]\n  both: [{device-filter: ["0x20B110DE", "0x20F110DE"], devices: all,'
        ' mig-enabled: true, mig-devices: {"3g.20gb": 2}}]\n  by-subsystem: [{device-filter: "0x20B010DE:0x147E10DE",'
        ' devices: all, mig-enabled: true, mig-devices: {"3g.20gb": 2}}]\n'
    )
    layouts = Layouts.choosable(config)
    on_pcie = yields(layouts, A100_40_PCIE)
    assert "may or may not match" in on_pcie["one-id"]
    assert on_pcie["both"] == "2 x 3g.20gb"
    assert "may or may not match" in yields(layouts, A100_40)["by-subsystem"]  # no label tells the subsystem
    assert yields(layouts, A100_80)["both"].startswith("! no entry of both matches GPU 0")


def test_gpu_indexes_and_the_last_matching_entry_win() -> None:
    layouts = Layouts.choosable(parse_config(CUSTOM))
    on_8 = yields(layouts, A100_80, 8)
    assert on_8["half-and-half"] == "14 x 3g.40gb, 1 whole GPUs"
    assert (
        on_8["gpu0-only"] == "! no entry of gpu0-only matches GPU 1 of the node, which mig-manager would leave as it is"
    )
    assert yields(layouts, A100_80, 1)["gpu0-only"] == "1 x 7g.80gb"


def test_unknown_models_counts_and_names_say_why() -> None:
    layouts = operator_layouts("all-3g.40gb", "no-such-layout")
    assert yields(layouts, "Tesla-T4")["all-3g.40gb"] == "! gpupool knows no MIG geometry of Tesla-T4"
    assert yields(layouts, A100_80, 0)["all-3g.40gb"] == "! the node's GPU count is unknown (nvidia.com/gpu.count)"
    assert yields(layouts, A100_80)["no-such-layout"] == "! the mig-parted config has no layout 'no-such-layout'"
    assert set(layouts.usable(A100_80, 1)) == {"all-3g.40gb"}


def test_by_default_every_mig_enabled_layout_may_be_chosen() -> None:
    layouts = operator_layouts()
    assert "all-disabled" not in layouts.names and "all-enabled" not in layouts.names
    assert set(layouts.usable(A100_80, 1)) == {
        "all-1g.10gb",
        "all-2g.20gb",
        "all-3g.40gb",
        "all-7g.80gb",
        "all-balanced",
    }


def test_physical_gpus_under_each_strategy() -> None:
    config = operator_layouts().config
    catalog = operator_layouts().catalog

    mixed = {"nvidia.com/gpu.product": A100_80, "nvidia.com/gpu.count": "8", "nvidia.com/mig.config": "all-1g.10gb"}
    assert gpu_count(mixed, config, catalog) == 8
    # Single strategy: gpu.count counts the instances, 7 per GPU under all-1g.10gb.
    single = {**mixed, "nvidia.com/gpu.product": f"{A100_80}-MIG-1g.10gb", "nvidia.com/gpu.count": "56"}
    assert gpu_count(single, config, catalog) == 8
    assert gpu_count({**single, "nvidia.com/gpu.count": "55"}, config, catalog) == 0  # not whole GPUs: unknown
    assert gpu_count({**single, "nvidia.com/mig.config": "custom"}, config, catalog) == 0
