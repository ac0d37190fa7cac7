"""Issue 13: a GPU Pod obeys its namespace's classes and quotas however it arrives: bound to a node,
owned by a DaemonSet, naming its devices in NVIDIA_VISIBLE_DEVICES, or asking for a MIG partition.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.admission.admitting import ESCAPE_POLICY, daemonset_pod, escape, escape_fleet
from tests.admission.demo import (
    check_placed,
)
from tests.builders import GPU_TAINT, index_of, mig_mixed_node, pod
from tests.builders import policy as make_policy

# --- issue 13: a GPU Pod obeys its namespace's classes and quotas, however it arrives ---------------------


class TestBoundPods:
    def test_a_student_pod_naming_an_h100_node_is_denied(self) -> None:
        """Finding 1: `nodeName: h100-a` with one GPU, in a namespace that may not use the high class, is
        refused naming the node's pool and the rule; nothing is patched."""
        result = escape(pod("p", "students", gpus=1, node="h100-a"), "students")
        assert (result.allowed, result.code, result.reason) == (False, 403, "bound-node")
        assert "node h100-a is in pool nvidia/high/NVIDIA-H100-80GB-HBM3" in result.message
        assert "class high is not allowed in namespace students" in result.message

    def test_a_pod_naming_an_allowed_node_is_allowed_without_a_patch(self) -> None:
        """The same Pod naming a T4 node is within its rules: allowed, nothing to patch, its pool known."""
        result = escape(pod("p", "students", gpus=1, node="t4-a"), "students")
        assert (result.allowed, result.patch) == (True, ())
        assert result.placement is not None and str(result.placement.pool) == "nvidia/medium/Tesla-T4"

    def test_a_bound_pod_over_the_class_quota_is_denied(self) -> None:
        """Two medium GPUs already held in students (quota 2): a third, naming a T4 node, is refused."""
        held = [pod(f"held-{i}", "students", gpus=1, node="t4-b", phase="Running",
                    annotations={"gpupool.io/pool": "nvidia/medium/Tesla-T4"}) for i in range(2)]  # fmt: skip
        result = escape(pod("p", "students", gpus=1, node="t4-a"), "students", [*escape_fleet(), *held])
        assert (result.allowed, result.reason) == (False, "class-quota")
        assert "class quota medium in namespace students exceeded: used 2 + requested 1 > hard 2" in result.message

    def test_a_bound_pod_contradicting_its_own_annotations_is_denied(self) -> None:
        """A Pod that asks for class low but names a T4 (medium) node is told so."""
        obj = pod("p", "students", gpus=1, node="t4-a", annotations={"gpupool.io/gpu-class": "low"})
        result = escape(obj, "students")
        assert not result.allowed and "class medium not in low (annotation)" in result.message

    def test_a_node_gpupool_cannot_class_is_refused_where_classes_are_limited(self) -> None:
        """A node without GPUs gpupool knows (a CPU node, a node not seen yet) cannot be checked: refused in
        a namespace with class rules, allowed with a warning elsewhere."""
        denied = escape(pod("p", "students", gpus=1, node="cpu-a"), "students")
        assert (denied.allowed, denied.reason) == (False, "bound-node")
        assert "names node cpu-a, which has no nvidia GPUs gpupool can class" in denied.message
        free = escape(pod("p", "ml", gpus=1, node="unseen-node"), "ml")
        assert free.allowed and free.patch == () and "not checked" in free.warnings[0]

    def test_a_bound_pod_without_gpus_is_left_alone(self) -> None:
        """Annotations alone add no GPUs to a Pod that names its node: nothing to check there."""
        result = escape(pod("p", "students", node="h100-a", annotations={"gpupool.io/gpu-class": "low"}), "students")
        assert (result.allowed, result.patch) == (True, ())


class TestDaemonSetPods:
    def test_a_daemonset_owner_grants_no_exemption(self) -> None:
        """Finding 2: a Pod with a DaemonSet owner reference, an H100 product nodeSelector and a GPU limit,
        but no node affinity, is placed like any Pod: the H100 pool is not allowed, so it is refused."""
        obj = pod("p", "students", gpus=1, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x"}]
        result = escape(obj, "students")
        assert not result.allowed and "class high is not allowed in namespace students" in result.message

    def test_a_daemonset_pod_is_checked_against_the_node_it_is_pinned_to(self) -> None:
        """A real DaemonSet Pod (pinned by node affinity) on an H100 node, in students: refused; on a T4
        node: allowed without a patch."""
        assert not escape(daemonset_pod("h100-a", namespace="students"), "students").allowed
        allowed = escape(daemonset_pod("t4-a", namespace="students"), "students")
        assert (allowed.allowed, allowed.patch) == (True, ())


class TestVisibleDevices:
    @staticmethod
    def with_env(value: str | None = "all", *, gpus: int | None = None, source: bool = False) -> dict[str, Any]:
        obj = pod("p", "students", gpus=gpus, node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
        entry: dict[str, Any] = {"name": "NVIDIA_VISIBLE_DEVICES"}
        if source:
            entry["valueFrom"] = {"configMapKeyRef": {"name": "gpus", "key": "visible"}}
        else:
            entry["value"] = value
        obj["spec"]["containers"][0]["env"] = [entry]
        return obj

    @pytest.mark.parametrize("value", ["all", "0,1", "GPU-8a2f3c1e-6b5d-4e0f-9a1b-2c3d4e5f6a7b"])
    def test_visible_devices_without_a_gpu_resource_is_denied(self, value: str) -> None:
        """Finding 6: a container with no GPU resource that sets NVIDIA_VISIBLE_DEVICES to all or a device
        list is refused, saying why."""
        result = escape(self.with_env(value), "students")
        assert (result.allowed, result.code, result.reason) == (False, 403, "visible-devices")
        assert "sets NVIDIA_VISIBLE_DEVICES=" in result.message and "requests no GPU resource" in result.message

    def test_a_value_from_a_config_map_is_denied_as_unreadable(self) -> None:
        """gpupool cannot see a value that comes from a ConfigMap or Secret, so it refuses it."""
        result = escape(self.with_env(source=True), "students")
        assert not result.allowed and "from a configMapKeyRef, which gpupool cannot read" in result.message

    @pytest.mark.parametrize("value", ["void", "none", "", "NONE"])
    def test_values_that_expose_no_gpu_are_allowed(self, value: str) -> None:
        """void, none and empty expose nothing: the Pod is not gpupool's to place and goes on unchanged."""
        result = escape(self.with_env(value), "students")
        assert (result.allowed, result.patch) == (True, ())

    def test_a_container_that_requests_gpus_may_not_set_it_either(self) -> None:
        """With a GPU resource the device plugin sets the variable itself: `all` would show the container
        every GPU of the node, so it is refused too (webhook.admission.request.visible_devices_problem)."""
        result = escape(self.with_env("all", gpus=1), "students")
        assert result.reason == "visible-devices"

    def test_a_namespace_can_be_opted_out_and_the_check_switched_off(self) -> None:
        """allowVisibleDevices opts a namespace out; defaults.checkVisibleDevices: false turns the rule off."""
        assert escape(self.with_env(), "tools").allowed
        off = ESCAPE_POLICY + "defaults: {checkVisibleDevices: false}\n"
        assert escape(self.with_env(), "students", text=off).allowed


MIG_MEDIUM = "products: [{match: A100, class: high}, {match: A100-MIG-3g.20gb, class: medium}]\n"


def mig_fleet() -> list[dict[str, Any]]:
    """The escape fleet with a mixed-strategy A100 node: 4 whole high GPUs, 4 3g.20gb and 14 1g.5gb."""
    return [*escape_fleet(), mig_mixed_node("mixed-a", gpu_class=None, taints=[GPU_TAINT])]


def mig_pod(name: str, namespace: str, profile: str = "3g.20gb", **kw: Any) -> dict[str, Any]:
    return pod(name, namespace, gpus=1, resource=f"nvidia.com/mig-{profile}", **kw)


class TestPartitions:
    def test_a_mig_request_is_placed_among_the_pools_of_its_resource(self) -> None:
        """A Pod that requests a MIG instance itself is placed like any Pod, among the pools of that
        resource (it pins the device as it pins the vendor): pinned to nodes offering the profile, its
        own request kept, the GPU taint tolerated."""
        pol = make_policy(ESCAPE_POLICY)
        result, patched = check_placed(mig_pod("p", "ml"), "ml", pol, index_of(mig_fleet(), pol), mig_fleet())
        assert result.placement is not None
        assert str(result.placement.pool) == "nvidia/high/NVIDIA-A100-SXM4-40GB-MIG-3g.20gb/nvidia.com/mig-3g.20gb"
        assert (result.placement.resource, result.placement.device) == ("nvidia.com/mig-3g.20gb", "mig")
        assert patched["spec"]["nodeSelector"] == {
            "nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
        }
        assert patched["spec"]["containers"] == mig_pod("p", "ml")["spec"]["containers"]

    def test_a_mig_request_is_held_to_the_namespaces_classes(self) -> None:
        """In a namespace that may not use high, a high MIG instance is refused like a high GPU; a medium
        one (by a more specific product entry) is placed."""
        high = escape(mig_pod("p", "students"), "students", mig_fleet())
        assert (high.allowed, high.code) == (False, 403)
        assert "class high is not allowed in namespace students" in high.message
        medium = escape(mig_pod("p", "students"), "students", mig_fleet(), text=ESCAPE_POLICY + MIG_MEDIUM)
        assert medium.placement is not None and medium.placement.pool.gpu_class == "medium"

    def test_several_kinds_of_device_in_one_pod_are_not_placed(self) -> None:
        """A MIG instance and a whole GPU in one Pod: no one pool offers both, so the Pod is refused where
        classes are limited and left alone with a warning elsewhere."""
        obj = mig_pod("p", "students")
        obj["spec"]["containers"].append({"name": "b", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
        refused = escape(obj, "students", mig_fleet())
        assert not refused.allowed and "several kinds of device" in refused.message
        free = escape(obj, "ml", mig_fleet())
        assert (free.allowed, free.patch) == (True, ()) and "several kinds of device" in free.warnings[0]

    def test_a_mig_pod_naming_its_node_is_checked_against_the_pool_of_its_resource(self) -> None:
        """On a node offering high whole GPUs and medium 3g.20gb instances, a students Pod naming the node
        may use an instance but not a whole GPU."""
        text = ESCAPE_POLICY + MIG_MEDIUM
        on_mig = escape(mig_pod("p", "students", node="mixed-a"), "students", mig_fleet(), text=text)
        assert on_mig.allowed and on_mig.placement is not None
        assert on_mig.placement.pool.product == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
        on_gpu = escape(pod("p", "students", gpus=1, node="mixed-a"), "students", mig_fleet(), text=text)
        assert not on_gpu.allowed and "class high is not allowed" in on_gpu.message

    def test_a_mig_pod_naming_a_node_without_that_profile_is_refused_where_classes_are_limited(self) -> None:
        """The H100 node offers no 1g.10gb instances: nothing gpupool can check, so students may not."""
        obj = mig_pod("p", "students", "1g.10gb", node="h100-a")
        result = escape(obj, "students")
        assert not result.allowed and "no nvidia.com/mig-1g.10gb devices gpupool can class" in result.message
