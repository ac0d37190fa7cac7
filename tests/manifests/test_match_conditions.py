"""The mutating webhook's matchConditions, evaluated with a real CEL implementation: exactly the Pods
gpupool must see are sent, on CREATE and on updates of pods/ephemeralcontainers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import celpy
import pytest
from celpy import celtypes
from celpy.adapter import json_to_cel
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.manifests.rendered import (
    ENV_NAMES,
    KUBECTL,
    RESOURCE_NAMES,
    Obj,
    Rendering,
)
from tests.manifests.sending import DEFAULT_POLICY, MIRROR, pod, should_be_sent
from webhook.admission.pod import read_pod
from webhook.admission.request import wants_gpus

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not on PATH: the manifests are rendered with `kubectl kustomize`"
)


# --- matchConditions, evaluated with CEL ---------------------------------------------------------


Condition = Callable[..., Any]  # (object, subresource="") -> CEL result


@pytest.fixture(scope="module")
def conditions(rendered: dict[str, Rendering]) -> dict[str, Condition]:
    """The webhook's matchConditions compiled with cel-python, by name; each takes the object and the
    request's subresource ("" for a Pod CREATE, "ephemeralcontainers" for its UPDATE)."""
    env = celpy.Environment()
    compiled: dict[str, Condition] = {}
    for condition in rendered["base"].webhook["matchConditions"]:
        program = env.program(env.compile(condition["expression"]))

        def evaluate(obj: Obj, sub_resource: str = "", program: Any = program) -> Any:
            request: Obj = {"operation": "CREATE", "namespace": "team-a", "object": obj, "dryRun": False}
            if sub_resource:  # kube-apiserver leaves the field out when there is none
                request |= {"operation": "UPDATE", "subResource": sub_resource, "oldObject": obj}
            return program.evaluate({"object": json_to_cel(obj), "request": json_to_cel(request)})

        compiled[condition["name"]] = evaluate
    return compiled


def sent(conditions: Mapping[str, Condition], obj: Obj, sub_resource: str = "") -> bool:
    """What kube-apiserver does: send the request only when every condition is true."""
    results = [conditions[name](obj, sub_resource) for name in conditions]
    assert all(isinstance(r, celtypes.BoolType) for r in results), results
    return all(bool(r) for r in results)


class TestMatchConditions:
    @pytest.mark.parametrize(
        "obj",
        [
            pod(annotations={"gpupool.io/gpu-class": "high"}),
            pod(annotations={"gpupool.io/min-memory": "24Gi", "team": "ml"}),
            pod(limits={"nvidia.com/gpu": "1"}),
            pod(requests={"nvidia.com/gpu": "2"}),
            pod(limits={"cpu": "1"}, init_limits={"nvidia.com/gpu": "1"}),
            pod(init_requests={"amd.com/gpu": "1"}),
            pod(limits={"nvidia.com/mig-1g.5gb": "1"}),
            pod(limits={"nvidia.com/gpu.shared": "1"}),
            pod(requests={"huawei.com/Ascend910-4c": "1"}),
            pod(requests={"nvidia.com/mig-3g.20gb": "1"}),
            pod(limits={"amd.com/gpu": "1"}),
            pod(limits={"huawei.com/Ascend910": "1"}),
            pod(requests={"huawei.com/Ascend310P": "1"}),
            pod(env=["PATH", "NVIDIA_VISIBLE_DEVICES"]),
            pod(init_env=["NVIDIA_VISIBLE_DEVICES"]),
            pod(limits={"nvidia.com/gpu": "1"}, owner_kind="ReplicaSet"),
            pod(limits={"nvidia.com/gpu": "1"}, node_name="gpu-node-1"),
            pod(annotations={"gpupool.io/gpu-class": "high"}, owner_kind="DaemonSet"),
            pod(env=["NVIDIA_VISIBLE_DEVICES"], owner_kind="DaemonSet", node_name="gpu-node-1"),
        ],
        ids=[
            "annotated",
            "annotated-among-others",
            "gpu-limit",
            "gpu-requests-only",
            "init-container-gpu",
            "init-container-requests",
            "mig-limit",
            "renamed-shared-replica",
            "ascend-virtual-npu",
            "mig-requests",
            "amd",
            "ascend",
            "ascend-requests",
            "visible-devices-env",
            "init-container-visible-devices",
            "replicaset-pod",
            "bound-to-a-node",
            "daemonset",
            "daemonset-with-visible-devices",
        ],
    )
    def test_sent(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """A Pod that opted in with a gpupool.io/ annotation or uses a GPU (a GPU resource, MIG slices
        included, or NVIDIA_VISIBLE_DEVICES) is sent to gpupool, bound to a node or a DaemonSet's or not."""
        assert should_be_sent(obj) is True
        assert sent(conditions, obj) is True

    @pytest.mark.parametrize(
        "obj",
        [
            pod(),
            pod(limits={"cpu": "2", "memory": "4Gi"}, requests={"cpu": "1"}),
            pod(annotations={"example.com/owner": "ml"}),
            pod(annotations={"notgpupool.io/gpu-class": "high", "gpupool.io.example/x": "y"}),
            pod(annotations={}),
            pod(limits={"nvidia.com/gpux": "1", "nvidia.com/mig": "1", "example.com/gpu": "1"}),
            pod(env=["NVIDIA_DRIVER_CAPABILITIES", "nvidia_visible_devices", "CUDA_VISIBLE_DEVICES"], init_env=[]),
            pod(annotations={MIRROR: "hash", "gpupool.io/gpu-class": "high"}, limits={"nvidia.com/gpu": "1"}),
            pod(annotations={MIRROR: ""}, env=["NVIDIA_VISIBLE_DEVICES"], node_name="gpu-node-1"),
        ],
        ids=[
            "plain",
            "cpu-only",
            "unrelated-annotation",
            "lookalike-prefix",
            "empty-annotations",
            "lookalike-resources",
            "other-env",
            "mirror-pod",
            "mirror-pod-empty-value",
        ],
    )
    def test_not_sent(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """Plain Pods, look-alike annotations, resources and variables, and mirror Pods are never sent,
        so they cannot be blocked by gpupool."""
        assert should_be_sent(obj) is False
        assert sent(conditions, obj) is False

    def test_every_resource_of_the_policy_is_sent(self, conditions: dict[str, Condition]) -> None:
        """Every device resource of the default policy's vendors (their GPUs, other cards, renamed
        replicas) and a partition of each partition prefix is one the conditions recognise."""
        for vendor in DEFAULT_POLICY.vendors.values():
            for resource in (*vendor.resources, *(f"{p}x" for p in vendor.partition_prefixes)):
                assert DEFAULT_POLICY.vendor_of(resource) is vendor
                assert sent(conditions, pod(limits={resource: "1"})), resource

    @pytest.mark.parametrize(
        "obj",
        [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "a"}]}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}},
            {"metadata": {"ownerReferences": []}, "spec": {"containers": [{"name": "a", "resources": {"limits": {}}}]}},
            {"metadata": {"annotations": {}}, "spec": {"containers": [{"name": "a", "env": [{"value": "x"}, {}]}]}},
            {"metadata": {}, "spec": {"containers": [], "initContainers": [{"name": "i", "env": []}]}},
        ],
        ids=["no-resources", "no-containers", "no-spec", "empty-lists", "env-without-names", "only-init-containers"],
    )
    def test_conditions_never_fail_to_evaluate(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """Odd but decodable Pods give false or true, never an error (which failurePolicy Fail turns into
        a rejected Pod)."""
        for name, evaluate in conditions.items():
            assert isinstance(evaluate(obj), celtypes.BoolType), name

    @settings(max_examples=150, deadline=None)
    @given(
        parts=st.fixed_dictionaries(
            {
                "annotations": st.none()
                | st.dictionaries(
                    st.sampled_from(["gpupool.io/gpu-count", "app", "x.gpupool.io/y", MIRROR]), st.just("1")
                ),
                "limits": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "requests": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "env": st.none() | st.lists(st.sampled_from(ENV_NAMES), max_size=3),
                "init_limits": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "init_requests": st.none() | st.dictionaries(st.sampled_from(RESOURCE_NAMES), st.just("1")),
                "init_env": st.none() | st.lists(st.sampled_from(ENV_NAMES), max_size=3),
                "node_name": st.none() | st.sampled_from(["", "node-1"]),
                "owner_kind": st.none() | st.sampled_from(["ReplicaSet", "Job", "DaemonSet"]),
            }
        )
    )
    def test_conditions_agree_with_the_rule(self, conditions: dict[str, Condition], parts: dict[str, Any]) -> None:
        """For any mix of annotations, resources, variables, nodeName and owner, the conditions send the
        Pod exactly when `should_be_sent` says so; and every Pod the core itself checks with the default
        policy is sent (one it would check but kube-apiserver never sends is a hole in the policy). The
        conditions may send more: any huawei.com/Ascend* model, where the default policy knows Ascend910."""
        obj = pod(**parts)
        assert sent(conditions, obj) is should_be_sent(obj)
        view = read_pod(obj, "ml")
        if not view.mirror and wants_gpus(view.shape, DEFAULT_POLICY):
            assert should_be_sent(obj)


def debugged(*envs: list[str], annotations: dict[str, str] | None = None) -> Obj:
    """A GPU Pod as kube-apiserver sends it for an update of pods/ephemeralcontainers: one ephemeral
    container per entry of `envs`, with those environment variables."""
    obj = pod(annotations=annotations, limits={"nvidia.com/gpu": "1"}, env=["NVIDIA_VISIBLE_DEVICES"])
    obj["spec"]["ephemeralContainers"] = [
        {"name": f"debugger-{i}", "image": "busybox", "env": [{"name": n, "value": "all"} for n in names]}
        for i, names in enumerate(envs)
    ]
    return obj


class TestEphemeralContainerConditions:
    @pytest.mark.parametrize(
        "obj",
        [debugged(["NVIDIA_VISIBLE_DEVICES"]), debugged(["PATH"], ["PATH", "NVIDIA_VISIBLE_DEVICES"])],
        ids=["one", "the-second-of-two"],
    )
    def test_an_ephemeral_container_that_sets_visible_devices_is_sent(
        self, conditions: dict[str, Condition], obj: Obj
    ) -> None:
        """`kubectl debug` adding a container that sets NVIDIA_VISIBLE_DEVICES is sent to gpupool."""
        assert sent(conditions, obj, "ephemeralcontainers") is True

    @pytest.mark.parametrize(
        "obj",
        [
            debugged(["PATH"], annotations={"gpupool.io/gpu-class": "high"}),
            debugged(),
            debugged([], ["nvidia_visible_devices", "CUDA_VISIBLE_DEVICES"]),
            {"metadata": {}, "spec": {"containers": [{"name": "a"}], "ephemeralContainers": [{"name": "d"}]}},
            {"metadata": {}, "spec": {"containers": [{"name": "a"}]}},
        ],
        ids=["annotated-gpu-pod", "no-ephemeral-containers", "other-variables", "no-env", "no-list"],
    )
    def test_any_other_ephemeral_container_update_is_not_sent(self, conditions: dict[str, Condition], obj: Obj) -> None:
        """Whatever the Pod (a GPU Pod that opted in, with NVIDIA_VISIBLE_DEVICES in a regular container),
        `kubectl debug` without the variable never reaches gpupool, so it cannot be blocked by it."""
        assert sent(conditions, obj, "ephemeralcontainers") is False
        for name, evaluate in conditions.items():
            assert isinstance(evaluate(obj, "ephemeralcontainers"), celtypes.BoolType), name

    def test_the_ephemeral_condition_lets_every_pod_create_through(self, conditions: dict[str, Condition]) -> None:
        """On a Pod CREATE the condition for ephemeral containers holds, so only the others decide."""
        for obj in (pod(), pod(limits={"nvidia.com/gpu": "1"}), debugged()):
            assert conditions["ephemeral-container-sets-visible-devices"](obj) == celtypes.BoolType(True)
