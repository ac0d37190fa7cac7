"""The patch: applied by a real RFC 6902 engine to the original Pod, with missing parents and escaping."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tests import scheduling
from tests.builders import pod
from webhook.admission.patch import PatchSpec, build_patch, escape
from webhook.admission.pod import read_pod
from webhook.domain.affinity import DOES_NOT_EXIST, NOT_IN, PoolConstraint, Requirement
from webhook.domain.model import Taint

SELECTOR = {"gpu.accelerator/class": "high", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


CLASSES = Requirement("gpu.accelerator/class", NOT_IN, ("high", "low"))
UNSHARED = Requirement("nvidia.com/gpu.replicas", DOES_NOT_EXIST)


T4_SELECTOR = {"nvidia.com/gpu.product": "Tesla-T4"}


def patch_of(obj: dict[str, Any], count: int = 2, expressions: tuple[Requirement, ...] = ()) -> list[dict[str, Any]]:
    """The patch for the Pod as the core builds it: from the Pod's shape (so its own tolerations count).
    With `expressions` the pool is the T4s of a half-labelled fleet (product label, requirements)."""
    selector = T4_SELECTOR if expressions else SELECTOR
    spec = PatchSpec(
        constraint=PoolConstraint(tuple(selector.items()), expressions),
        gpu_taints=(GPU_TAINT,),
        container_index=0,
        resource="nvidia.com/gpu",
        gpus=count,
        pool="nvidia/high/NVIDIA-A100-SXM4-40GB",
    )
    return list(build_patch(read_pod(obj).shape, spec).ops)


def applied(obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return jsonpatch.apply_patch(obj, patch_of(obj, **kw))  # type: ignore[no-any-return]


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def with_affinity(obj: dict[str, Any], affinity: dict[str, Any]) -> dict[str, Any]:
    obj["spec"]["affinity"] = affinity
    return obj


TERMS = [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ws-rtx3060-01"]}]},
    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-1a"]}]},
]
REQUIRED = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": TERMS}}}


@pytest.mark.parametrize(
    "affinity",
    [
        None,
        {"podAntiAffinity": {}},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    ],
    ids=["no-affinity", "affinity-without-node-affinity", "node-affinity-without-required"],
)
def test_requirements_are_one_new_term_when_the_pod_has_none(affinity: dict[str, Any] | None) -> None:
    """A Pod without required node affinity gets one term of the pool's requirements, its missing parents
    added whole and what it had (pod anti-affinity, preferred terms) kept."""
    obj = pod() if affinity is None else with_affinity(pod(), affinity)
    result = applied(obj, expressions=(CLASSES, UNSHARED))
    node_affinity = result["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [CLASSES.as_json(), UNSHARED.as_json()]}]
    }
    for key, value in (affinity or {}).items():
        if key != "nodeAffinity":
            assert result["spec"]["affinity"][key] == value
    if affinity and "nodeAffinity" in affinity:
        assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == []
    assert patch_of(result, expressions=(CLASSES, UNSHARED)) == []


def test_requirements_are_anded_into_every_term_the_pod_has() -> None:
    """The scheduler ORs terms: a term that names a node, or a zone, would otherwise reach nodes outside
    the pool. Every term gets the requirements appended (a term without matchExpressions gets the list);
    nothing the user wrote is dropped, and the patched Pod's nodes are its own terms' within the pool's."""
    obj = with_affinity(pod(), copy.deepcopy(REQUIRED))
    result = applied(obj, expressions=(CLASSES,))
    terms = result["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0] == {**TERMS[0], "matchExpressions": [CLASSES.as_json()]}
    assert terms[1]["matchExpressions"] == [*TERMS[1]["matchExpressions"], CLASSES.as_json()]
    fleet = [
        node("ws-rtx3060-01", **{"gpu.accelerator/class": "low"}, **T4_SELECTOR),
        node("t4-eu", **{"topology.kubernetes.io/zone": "eu-1a", "gpu.accelerator/class": "high"}, **T4_SELECTOR),
        node("t4-eu-unlabelled", **{"topology.kubernetes.io/zone": "eu-1a"}, **T4_SELECTOR),
        node("t4-us", **{"topology.kubernetes.io/zone": "us-1a"}, **T4_SELECTOR),
    ]
    assert scheduling.reachable(obj, fleet) == {"ws-rtx3060-01", "t4-eu", "t4-eu-unlabelled", "t4-us"} - {"t4-us"}
    assert scheduling.reachable(result, fleet) == {"t4-eu-unlabelled"}
    assert patch_of(result, expressions=(CLASSES,)) == []


def test_a_requirement_the_nodeselector_already_satisfies_is_not_added() -> None:
    """A Pod that pins the class label itself needs no `NotIn` on it."""
    obj = pod(node_selector={"gpu.accelerator/class": "medium"})
    ops = patch_of(obj, expressions=(CLASSES,))
    assert not any(op["path"].startswith("/spec/affinity") for op in ops)


def test_escape_follows_rfc_6901() -> None:
    """`/` and `~` in keys are escaped so `nvidia.com/gpu` is one token."""
    assert escape("nvidia.com/gpu") == "nvidia.com~1gpu"
    assert escape("a~b/c") == "a~0b~1c"


def test_bare_pod_gets_whole_parents() -> None:
    """No nodeSelector, tolerations, resources or annotations: each is added whole, in one op."""
    obj = pod(annotations=None)
    ops = patch_of(obj)
    assert [op["path"] for op in ops] == [
        "/spec/nodeSelector",
        "/spec/tolerations",
        "/spec/containers/0/resources",
        "/metadata/annotations",
    ]
    result = jsonpatch.apply_patch(obj, ops)
    assert result["spec"]["nodeSelector"] == SELECTOR
    assert result["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert result["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert result["metadata"]["annotations"] == {"gpupool.io/pool": "nvidia/high/NVIDIA-A100-SXM4-40GB"}


def test_user_entries_are_kept_and_appended_to() -> None:
    """The user's nodeSelector keys, tolerations and annotations stay; gpupool's are added beside them."""
    obj = pod(
        annotations={"team": "vision"},
        node_selector={"topology.kubernetes.io/zone": "eu-1a"},
        tolerations=[{"key": "spot", "operator": "Exists"}],
    )
    result = applied(obj)
    assert result["spec"]["nodeSelector"] == {"topology.kubernetes.io/zone": "eu-1a", **SELECTOR}
    assert result["spec"]["tolerations"][0] == {"key": "spot", "operator": "Exists"}
    assert len(result["spec"]["tolerations"]) == 2
    assert result["metadata"]["annotations"]["team"] == "vision"


def test_null_parents_are_replaced_whole() -> None:
    """`nodeSelector: null` and `annotations: null` cannot take children: they get whole maps."""
    obj = pod(annotations=None)
    obj["spec"]["nodeSelector"] = None
    obj["metadata"]["annotations"] = None
    result = applied(obj)
    assert result["spec"]["nodeSelector"] == SELECTOR


def test_tolerated_taints_add_no_toleration() -> None:
    """A Pod that already tolerates the GPU taint (even by a wildcard) gets no second toleration."""
    obj = pod(tolerations=[{"operator": "Exists"}])
    ops = patch_of(obj)
    assert not any(op["path"].startswith("/spec/tolerations") for op in ops)


def test_requests_kept_equal_where_the_container_sets_them() -> None:
    """With a requests map, the GPU request is added equal to the limit; without, it defaults to it."""
    obj = pod(
        containers=[
            {"name": "main", "image": "x", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}
        ]
    )
    resources = applied(obj)["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "1", "nvidia.com/gpu": "2"},
        "limits": {"memory": "1Gi", "nvidia.com/gpu": "2"},
    }


def test_existing_equal_limit_is_left_alone() -> None:
    """An integer limit equal to the count needs no op."""
    obj = pod(containers=[{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 2}}}])
    assert not any("resources" in op["path"] for op in patch_of(obj))


@pytest.mark.parametrize(
    "obj",
    [
        pod(annotations=None),
        pod(annotations={"a": "b"}, node_selector={}, tolerations=[]),
        pod(containers=[{"name": "main", "image": "x", "resources": {}}]),
    ],
    ids=["bare", "empty-maps", "empty-resources"],
)
def test_patch_of_the_patched_pod_is_empty(obj: dict[str, Any]) -> None:
    """Idempotent: kube-apiserver may call the webhook again with the patched Pod."""
    result = applied(obj)
    assert patch_of(result) == []


def test_count_zero_adds_no_limit() -> None:
    """When the Pod's own GPU requests stand (count 0), only the pinning is patched."""
    obj = pod(annotations=None)
    ops = patch_of(obj, count=0)
    assert not any("resources" in op["path"] for op in ops)
