"""`gpupool inventory`: one row per pool of devices, with its kind and exact product, and the nodes that
are not pooled with the reason. Run through `webhook.commands.cli.main`, as the console script does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import gpu_node, issue_fleet, mig_mixed_node
from webhook.commands.cli import main


def snapshot(tmp_path: Path) -> str:
    """The issue's fleet as `kubectl get nodes -o yaml` prints it, with a node GFD calls invalid and one
    whose MIG configuration is being applied."""
    nodes = [
        *[n for n in issue_fleet() if n["metadata"]["name"] != "mixed-a"],
        mig_mixed_node("mixed-a", whole=2, instances={"3g.20gb": (4, 20096)}),
        gpu_node("bad-a", "NVIDIA-A100-SXM4-40GB-MIG-INVALID", 0, labels={"nvidia.com/gpu.count": "0"}),
        mig_mixed_node("busy-a", labels={"nvidia.com/mig.config.state": "pending"}),
    ]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}), "utf-8")
    return str(path)


def inventory(capsys: pytest.CaptureFixture[str], path: str, *args: str) -> str:
    assert main(["inventory", "--inventory", path, *args]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if not line.startswith("WARNING")]


def test_the_table_has_one_row_per_device_pool(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The issue's first complaint: 56 5 GB slices and 12 whole 40 GB GPUs are two pools, not one "A100"
    pool of 68 with 4864Mi; the time-sliced T4 is a pool of replicas beside the dedicated T4."""
    table = rows(inventory(capsys, snapshot(tmp_path)))
    assert table[0] == [
        "VENDOR",
        "CLASS",
        "DEVICE",
        "PRODUCT",
        "MEMORY",
        "NODES",
        "GPUS",
        "ALLOCATED",
        "FREE",
        "PENDING",
    ]
    by_product = {row[3]: row for row in table[1:]}
    assert by_product["NVIDIA-A100-SXM4-40GB"][2:8] == ["gpu", "NVIDIA-A100-SXM4-40GB", "40Gi", "3", "14", "0"]
    assert by_product["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"][2:7] == [
        "mig",
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "4864Mi",
        "1",
        "56",
    ]
    # a mixed-strategy profile, on a resource of its own, is named as gpupool.io/pool names it
    mixed = "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb"
    assert by_product[mixed][2:7] == ["mig", mixed, "20096Mi", "1", "4"]
    assert by_product["Tesla-T4-SHARED"][2:7] == ["shared", "Tesla-T4-SHARED", "3840Mi", "1", "4"]
    assert by_product["Tesla-T4"][2:7] == ["gpu", "Tesla-T4", "15Gi", "1", "1"]


def test_wide_output_says_how_each_gpu_is_divided(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`-o wide`: the resource, and the MIG profile or the replicas per GPU."""
    table = rows(inventory(capsys, snapshot(tmp_path), "-o", "wide"))
    assert table[0][-2:] == ["RESOURCE", "PARTITION"]
    by_product = {row[3]: row for row in table[1:]}
    assert by_product["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"][-2:] == ["nvidia.com/gpu", "1g.5gb"]
    assert by_product["NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb"][-2:] == [
        "nvidia.com/mig-3g.20gb",
        "3g.20gb",
    ]
    assert by_product["Tesla-T4-SHARED"][-3:] == ["nvidia.com/gpu", "4", "replicas"]
    assert by_product["Tesla-T4"][-2:] == ["nvidia.com/gpu", "-"]


def test_json_names_the_device_of_each_pool(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report: dict[str, Any] = json.loads(inventory(capsys, snapshot(tmp_path), "-o", "json"))
    by_product = {p["product"]: p for p in report["pools"]}
    shared, mig = by_product["Tesla-T4-SHARED"], by_product["NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"]
    assert (shared["device"], shared["replicas"], shared["memoryMiB"]) == ("shared", [4], 3840)
    assert (mig["device"], mig["profile"], mig["resource"]) == ("mig", "3g.20gb", "nvidia.com/mig-3g.20gb")


def test_nodes_that_must_not_be_used_are_listed_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An invalid MIG layout and a MIG configuration being applied: not pooled, and the admin is told why."""
    warnings = [line for line in inventory(capsys, snapshot(tmp_path)).splitlines() if line.startswith("WARNING")]
    invalid = "WARNING: node bad-a: nvidia GPUs not pooled: GPU Feature Discovery reports an invalid MIG layout"
    assert any(w.startswith(invalid) for w in warnings)
    assert (
        "WARNING: node busy-a: nvidia GPUs not pooled: its MIG configuration is not in place "
        "(nvidia.com/mig.config.state=pending)"
    ) in warnings


def test_a_half_labelled_product_is_pooled_without_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """T4 nodes classed by the product table beside one labelled high: both pools are listed and placed
    (node affinity tells their nodes apart), so there is nothing to warn the admin about."""
    nodes = [gpu_node("t4-a", gpu_class=None), gpu_node("t4-reserved", gpu_class="high")]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}), "utf-8")
    out = inventory(capsys, str(path))
    assert not [line for line in out.splitlines() if line.startswith("WARNING")]
    assert "medium" in out and "high" in out
