"""Pods on device resources other than a vendor's GPU resource, end to end: time-sliced replicas that GPU
Feature Discovery renames (`nvidia.com/gpu.shared`), Ascend's other cards (`huawei.com/Ascend310P`) and
its virtual NPUs (`huawei.com/Ascend910-4c`). Each is a device of its vendor and of its card's class:
pooled, listed, checked against the namespace's classes and quotas, and placed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.builders import ascend_node, gpu_node, index_of, pod, quota, renamed_shared_node
from tests.builders import policy as make_policy
from webhook.admission.core import evaluate
from webhook.admission.verdict import Verdict
from webhook.commands.cli import main

POLICY_TEXT = """
namespaces:
  students: {allowedClasses: [low, medium], device: [shared, gpu]}
  research: {}
"""
POLICY = make_policy(POLICY_TEXT)


def fleet() -> list[dict[str, Any]]:
    """A time-sliced H100 node with its replicas renamed (high), a T4 (medium), Ascend 910 nodes with
    static virtual NPUs (high) and a 310P node (low)."""
    return [
        renamed_shared_node("ts-h100"),
        gpu_node("t4-a", "Tesla-T4", 4),
        ascend_node("npu-a", "Ascend910", {"huawei.com/Ascend910": 4, "huawei.com/Ascend910-4c": 8}),
        ascend_node("npu-b", "Ascend310P", {"huawei.com/Ascend310P": 4}),
    ]


def admit(obj: dict[str, Any], namespace: str, objects: list[dict[str, Any]] | None = None) -> Verdict:
    return evaluate(obj, namespace, POLICY, index_of(objects if objects is not None else fleet(), POLICY))


def patched(obj: dict[str, Any], result: Verdict) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(obj, list(result.patch))
    return out


class TestRenamedReplicas:
    def test_a_students_pod_on_renamed_h100_replicas_is_refused(self) -> None:
        """A share of an H100 is high: a students Pod requesting nvidia.com/gpu.shared itself is refused,
        naming the pool and the class (it went through unchecked)."""
        result = admit(pod("p", "students", gpus=1, resource="nvidia.com/gpu.shared"), "students")
        assert (result.allowed, result.code, result.reason) == (False, 403, "no-match")
        assert "NVIDIA-H100-80GB-HBM3-SHARED: class high is not allowed in namespace students" in result.message

    def test_a_pod_naming_the_node_is_checked_against_the_replicas_pool(self) -> None:
        result = admit(pod("p", "students", gpus=1, resource="nvidia.com/gpu.shared", node="ts-h100"), "students")
        assert (result.allowed, result.reason) == (False, "bound-node")
        assert "class high is not allowed" in result.message

    def test_a_pod_asking_for_a_shared_device_is_placed_on_the_renamed_replicas(self) -> None:
        """`gpupool.io/device: shared` (and high allowed): placed on the renamed pool, its limit on
        nvidia.com/gpu.shared, pinned to the H100 nodes, holding a quarter of an H100's memory."""
        obj = pod("p", "research", annotations={"gpupool.io/device": "shared", "gpupool.io/gpu-class": "high"})
        result = admit(obj, "research")
        assert result.placement is not None, result.message
        assert str(result.placement.pool) == "nvidia/high/NVIDIA-H100-80GB-HBM3-SHARED/nvidia.com/gpu.shared"
        assert (result.placement.resource, result.placement.device) == ("nvidia.com/gpu.shared", "shared")
        out = patched(obj, result)
        assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
        assert out["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        again = admit(out, "research")
        assert (again.allowed, again.patch) == (True, ())

    def test_a_pod_requesting_the_renamed_resource_gets_only_replicas(self) -> None:
        """A Pod's own nvidia.com/gpu.shared request says its device: `gpupool.io/device: gpu` contradicts it."""
        obj = pod("p", "research", gpus=1, resource="nvidia.com/gpu.shared", annotations={"gpupool.io/device": "gpu"})
        result = admit(obj, "research")
        assert (result.allowed, result.code) == (False, 400)
        assert "contradicts the Pod's own nvidia.com/gpu.shared request (shared replicas)" in result.message

    def test_the_replicas_count_against_their_resource_quota(self) -> None:
        objects = [*fleet(), quota("q", "research", {"requests.nvidia.com/gpu.shared": "1"},
                                   {"requests.nvidia.com/gpu.shared": "1"})]  # fmt: skip
        result = admit(pod("p", "research", gpus=1, resource="nvidia.com/gpu.shared"), "research", objects)
        assert (result.allowed, result.reason) == (False, "quota")
        assert "requests.nvidia.com/gpu.shared used 1 + requested 1 > hard 1" in result.message


class TestAscend:
    def test_a_virtual_npu_of_a_910_is_high(self) -> None:
        """huawei.com/Ascend910-4c is a partition of a 910 (high): refused for students, placed elsewhere on
        the vNPU pool with its own request kept."""
        obj = pod("p", "students", gpus=1, resource="huawei.com/Ascend910-4c")
        refused = admit(obj, "students")
        assert (refused.allowed, refused.reason) == (False, "no-match")
        assert "class high is not allowed in namespace students" in refused.message
        placed = admit(pod("p", "research", gpus=1, resource="huawei.com/Ascend910-4c"), "research")
        assert placed.placement is not None
        assert str(placed.placement.pool) == "ascend/high/huawei-Ascend910-vNPU-4c/huawei.com/Ascend910-4c"
        assert placed.placement.device == "mig"

    def test_a_310p_card_is_placed_as_a_low_device(self) -> None:
        """huawei.com/Ascend310P is a whole card of the Ascend vendor, class low by the product table:
        students may use it, and it is placed on the 310P nodes."""
        obj = pod("p", "students", gpus=1, resource="huawei.com/Ascend310P")
        result = admit(obj, "students")
        assert result.placement is not None, result.message
        assert str(result.placement.pool) == "ascend/low/huawei-Ascend310P/huawei.com/Ascend310P"
        assert patched(obj, result)["spec"]["nodeSelector"] == {"accelerator": "huawei-Ascend310P"}

    def test_an_ascend_pod_that_names_its_vendor_may_get_a_310p(self) -> None:
        """With `gpupool.io/vendor: ascend` and classes low or medium, the 310P pool is the one that fits;
        the patch asks for its resource."""
        obj = pod("p", "students", annotations={"gpupool.io/vendor": "ascend", "gpupool.io/device": "gpu"})
        result = admit(obj, "students")
        assert result.placement is not None, result.message
        assert result.placement.resource == "huawei.com/Ascend310P"
        limits = patched(obj, result)["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"huawei.com/Ascend310P": "1"}

    @pytest.mark.parametrize("resource", ["huawei.com/Ascend910-4c", "huawei.com/Ascend310P"])
    def test_their_resource_quotas_hold(self, resource: str) -> None:
        objects = [*fleet(), quota("q", "research", {resource: "0"})]
        result = admit(pod("p", "research", gpus=1, resource=resource), "research", objects)
        assert (result.allowed, result.reason) == (False, "quota")
        assert f"{resource} used 0 + requested 1 > hard 0" in result.message

    def test_a_virtual_npu_counts_one_high_device_against_the_class_quota(self) -> None:
        pol = make_policy("namespaces: {team: {classQuota: {high: 1}}}")
        held = pod("held", "team", gpus=1, resource="huawei.com/Ascend910-4c", node="npu-a", phase="Running")
        index = index_of([*fleet(), held], pol)
        result = evaluate(pod("p", "team", gpus=1, resource="huawei.com/Ascend910-4c"), "team", pol, index)
        assert (result.allowed, result.reason) == (False, "class-quota")
        assert "class quota high in namespace team exceeded: used 1 + requested 1 > hard 1" in result.message


def test_the_inventory_lists_every_such_pool(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`gpupool inventory` shows the renamed replicas, the 310P cards and the virtual NPUs as pools."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": fleet()}), "utf-8")
    assert main(["inventory", "--inventory", str(path), "-o", "json"]) == 0
    out, _ = capsys.readouterr()
    pools = {(p["vendor"], p["class"], p["device"], p["product"]) for p in yaml.safe_load(out)["pools"]}
    assert {
        ("nvidia", "high", "shared", "NVIDIA-H100-80GB-HBM3-SHARED"),
        ("ascend", "high", "mig", "huawei-Ascend910-vNPU-4c"),
        ("ascend", "low", "gpu", "huawei-Ascend310P"),
        ("ascend", "high", "gpu", "huawei-Ascend910"),
    } <= pools
