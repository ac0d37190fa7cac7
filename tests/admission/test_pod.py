"""The Pod view: read once, every field the core reads checked, with a clear refusal naming the field.

Its shape is the memo's key: Pods that differ only in what gpupool never reads share a shape; any
difference in what it reads gives a different one. (That a shared memo never changes an answer is
checked on `evaluate` itself, in test_admission.)"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.builders import pod
from webhook.admission.pod import (
    MAX_CONTAINERS,
    MAX_EXTENDED_RESOURCES,
    MAX_OWN_ANNOTATIONS,
    MAX_OWNERS,
    MAX_SELECTOR_ENTRIES,
    MAX_TOLERATIONS,
    PodError,
    PodShape,
    read_pod,
)


def base() -> dict[str, Any]:
    obj = pod(
        "train-7f9c",
        "ml",
        annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/min-memory": "16Gi"},
        gpus=1,
        node_selector={"kubernetes.io/os": "linux"},
        tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    )
    obj["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox", "restartPolicy": "Always"}]
    return obj


def shape_key(obj: Any, namespace: str) -> PodShape:
    return read_pod(obj, namespace).shape


def changed(edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    obj = copy.deepcopy(base())
    edit(obj)
    return obj


# Edits of fields gpupool never reads: a Deployment's replicas differ like this.
SAME_SHAPE = {
    "name": lambda p: p["metadata"].update(name="train-x2k4d"),
    "generateName": lambda p: p["metadata"].update(generateName="train-"),
    "labels": lambda p: p["metadata"].update(labels={"app": "train", "pod-template-hash": "7f9c"}),
    "other tools' annotations": lambda p: p["metadata"]["annotations"].update({"example.com/owner": "ana"}),
    "image": lambda p: p["spec"]["containers"][0].update(image="nvcr.io/nvidia/pytorch:24.03-py3"),
    "command": lambda p: p["spec"]["containers"][0].update(command=["python", "train.py"]),
    "volumes": lambda p: p["spec"].update(volumes=[{"name": "data", "emptyDir": {}}]),
    "managedFields": lambda p: p["metadata"].update(managedFields=[{"manager": "kubectl-create"}]),
    "status": lambda p: p.update(status={}),
}

# Edits of fields the request or the patch depends on.
NEW_SHAPE = {
    "a gpupool annotation": lambda p: p["metadata"]["annotations"].update({"gpupool.io/gpu-count": "2"}),
    "an annotation's value": lambda p: p["metadata"]["annotations"].update({"gpupool.io/gpu-class": "high"}),
    "the pool annotation": lambda p: p["metadata"]["annotations"].update({"gpupool.io/pool": "nvidia/low/T4"}),
    "annotations absent": lambda p: p["metadata"].pop("annotations"),
    "a container's GPUs": lambda p: p["spec"]["containers"][0].update(resources={"limits": {"nvidia.com/gpu": "2"}}),
    "a container's name": lambda p: p["spec"]["containers"][0].update(name="trainer"),
    "another container": lambda p: p["spec"]["containers"].append({"name": "side", "image": "x"}),
    "an init container's restartPolicy": lambda p: p["spec"]["initContainers"][0].pop("restartPolicy"),
    "no init containers": lambda p: p["spec"].pop("initContainers"),
    "the nodeSelector": lambda p: p["spec"]["nodeSelector"].update({"gpu.accelerator/class": "low"}),
    "no nodeSelector": lambda p: p["spec"].pop("nodeSelector"),
    "a toleration": lambda p: p["spec"]["tolerations"].append({"operator": "Exists"}),
    "privileged": lambda p: p["spec"]["containers"][0].update(securityContext={"privileged": True}),
    "no tolerations": lambda p: p["spec"].pop("tolerations"),
    "a GPU limit as a number": lambda p: p["spec"]["containers"][0].update(resources={"limits": {"nvidia.com/gpu": 1}}),
}


@pytest.mark.parametrize("edit", SAME_SHAPE.values(), ids=SAME_SHAPE.keys())
def test_fields_gpupool_never_reads_keep_the_key(edit: Callable[[dict[str, Any]], object]) -> None:
    key = shape_key(base(), "ml")
    assert key is not None
    assert shape_key(changed(edit), "ml") == key


@pytest.mark.parametrize("edit", NEW_SHAPE.values(), ids=NEW_SHAPE.keys())
def test_fields_gpupool_reads_change_the_key(edit: Callable[[dict[str, Any]], object]) -> None:
    key = shape_key(changed(edit), "ml")
    assert key is not None
    assert key != shape_key(base(), "ml")


def test_the_namespace_is_part_of_the_shape() -> None:
    assert shape_key(base(), "ml") != shape_key(base(), "students")


def test_every_new_shape_is_distinct_from_every_other() -> None:
    keys = [shape_key(changed(edit), "ml") for edit in NEW_SHAPE.values()]
    assert len(set(keys)) == len(keys)


def meta(**fields: Any) -> dict[str, Any]:
    return {"metadata": fields, "spec": {}}


def spec(**fields: Any) -> dict[str, Any]:
    return {"metadata": {}, "spec": {"containers": [], **fields}}


def container(**fields: Any) -> dict[str, Any]:
    return spec(containers=[{"name": "a", **fields}])


MALFORMED = {
    "none": (None, "the object is not a Pod: expected an object, got null"),
    "list": ([], "the object is not a Pod: expected an object, got a list of 0 items"),
    "string": ("pod", "the object is not a Pod: expected an object, got 'pod'"),
    "no-metadata": ({"spec": {}}, "metadata: expected an object, got null"),
    "metadata-null": ({"metadata": None, "spec": {}}, "metadata: expected an object, got null"),
    "spec-null": ({"metadata": {}, "spec": None}, "spec: expected an object, got null"),
    "annotations-string": (meta(annotations="x"), "metadata.annotations: expected an object"),
    "annotation-number": (
        meta(annotations={"gpupool.io/gpu-count": 2}),
        "metadata.annotations.'gpupool.io/gpu-count': expected a string value, got 2",
    ),
    "owner-references-number": (meta(ownerReferences=5), "metadata.ownerReferences: expected a list of owner refer"),
    "owner-reference-null": (meta(ownerReferences=[None]), r"metadata.ownerReferences\[0\]: expected an owner ref"),
    "owner-name-number": (
        meta(ownerReferences=[{"kind": "Job", "name": 7}]),
        r"metadata.ownerReferences\[0\].name: expected a string, got 7",
    ),
    "owner-controller-string": (
        meta(ownerReferences=[{"kind": "Job", "name": "j", "controller": "true"}]),
        r"metadata.ownerReferences\[0\].controller: expected true or false, got 'true'",
    ),
    "labels-list": (meta(labels=[]), "metadata.labels: expected an object"),
    "workload-label-number": (
        meta(labels={"ray.io/cluster": 3}),
        "metadata.labels.ray.io/cluster: expected a string, got 3",
    ),
    "name-number": (meta(name=7), "metadata.name: expected a string, got 7"),
    "node-name-list": (spec(nodeName=["a"]), "spec.nodeName: expected a string"),
    "containers-map": (spec(containers={}), "spec.containers: expected a list of containers"),
    "container-null": (spec(containers=[{"name": "a"}, None]), r"spec.containers\[1\]: expected a container"),
    "tolerations-map": (spec(tolerations={}), "spec.tolerations: expected a list"),
    "toleration-key-number": (spec(tolerations=[{"key": 1}]), r"spec.tolerations\[0\].key: expected a string"),
    "nodeselector-list": (spec(nodeSelector=[]), "spec.nodeSelector: expected an object"),
    "nodeselector-number": (spec(nodeSelector={"a": 1}), "spec.nodeSelector.'a': expected a string value"),
    "initcontainers-string": (spec(initContainers="x"), "spec.initContainers: expected a list"),
    "limits-list": (container(resources={"limits": []}), r"spec.containers\[0\].resources.limits: expected an object"),
    "huge-int": (
        container(resources={"limits": {"nvidia.com/gpu": 2**70}}),
        r"spec.containers\[0\].resources.limits.'nvidia.com/gpu': expected a quantity",
    ),
    "limit-null": (
        container(resources={"limits": {"nvidia.com/gpu": None}}),
        'expected a quantity such as "1", got null',
    ),
    "env-entry-number": (container(env=[7]), r"spec.containers\[0\].env\[0\]: expected an environment variable"),
    "int-key": (
        container(resources={"limits": {1: "x"}}),
        r"spec.containers\[0\].resources.limits: expected resource names \(strings\), got 1",
    ),
}


@pytest.mark.parametrize(("obj", "words"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_pods_are_refused_naming_the_field(obj: Any, words: str) -> None:
    """A field the core reads that is not what Kubernetes allows is refused with its path and what is
    accepted, before anything else looks at the Pod."""
    with pytest.raises(PodError, match=words):
        read_pod(obj, "ml")


def test_a_pod_without_any_namespace_is_refused() -> None:
    """The namespace decides the policy; a Pod with none, in a request with none, cannot be judged."""
    with pytest.raises(PodError, match="metadata.namespace: the Pod has no namespace and neither has the request"):
        read_pod({"metadata": {"name": "a"}, "spec": {"containers": []}}, "")


def test_identity_is_read_beside_the_shape() -> None:
    """Name, generateName, node, owners and the node a DaemonSet's affinity names are read once."""
    obj = pod("agent-x7", "monitoring", annotations={"kubernetes.io/config.mirror": "abc"}, gpus=1, node="gpu-1")
    obj["metadata"]["generateName"] = "agent-"
    obj["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "agent", "controller": True}]
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}
                ]
            }
        }
    }
    view = read_pod(obj)
    assert (view.namespace, view.name, view.generate_name, view.node_name) == (
        "monitoring",
        "agent-x7",
        "agent-",
        "gpu-1",
    )
    assert (view.mirror, view.daemonset) == (True, True)
    assert view.shape.requirements.named_nodes() == {"gpu-1"}
    assert view.shape.annotations == ()  # the mirror annotation is not gpupool's


@pytest.mark.parametrize("controller", [None, False])
def test_a_daemonset_reference_that_is_not_the_controller_is_no_daemonset(controller: bool | None) -> None:
    """Only the controller places a Pod: a DaemonSet reference without `controller: true` grants nothing."""
    obj = pod("p", "students", gpus=1)
    owner: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent"}
    if controller is not None:
        owner["controller"] = controller
    obj["metadata"]["ownerReferences"] = [owner]
    assert read_pod(obj).daemonset is False


AFFINITY_ERRORS = [
    ({"nodeSelectorTerms": []}, "nodeSelectorTerms: expected a list of at least one term"),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Near", "values": ["a"]}]}]},
     "operator: expected one of In, NotIn, Exists, DoesNotExist, Gt, Lt"),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In"}]}]}, "In needs at least one value"),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1_0"]}]}]},
     "Gt takes exactly one whole number"),
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["a"]}]}]},
     "matchFields may only name metadata.name"),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["a"]}]}]},
     "Exists takes no values"),
    ({"nodeSelectorTerms": [{}] * 65}, "65 terms; gpupool reads at most 64"),
]  # fmt: skip


@pytest.mark.parametrize(("required", "message"), AFFINITY_ERRORS, ids=[m for _, m in AFFINITY_ERRORS])
def test_a_malformed_node_affinity_is_refused_naming_the_field(required: dict[str, Any], message: str) -> None:
    """Node affinity is read as kube-apiserver checks it, with bounds: what is wrong is named, never guessed."""
    obj = pod("p", gpus=1)
    obj["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    with pytest.raises(PodError, match=re.escape(message)) as caught:
        read_pod(obj)
    assert "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution" in str(caught.value)


def test_the_workload_group_is_identity_not_shape() -> None:
    """Two Pods of one Job share a group; two Jobs' Pods of one shape share the shape (and so the memo
    of what the shape decides) but not the group. A gpupool.io/group annotation is both."""
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u1", "controller": True}]
    first, second, other = changed(lambda p: None), changed(lambda p: None), changed(lambda p: None)
    first["metadata"]["ownerReferences"] = copy.deepcopy(owner)
    second["metadata"].update(name="train-2", ownerReferences=copy.deepcopy(owner))
    other["metadata"]["ownerReferences"] = [{**owner[0], "name": "eval"}]
    views = [read_pod(p, "ml") for p in (first, second, other)]
    assert [v.group for v in views] == ["Job/train", "Job/train", "Job/eval"]
    assert views[0].shape == views[1].shape == views[2].shape
    named = changed(lambda p: p["metadata"]["annotations"].update({"gpupool.io/group": "sweep"}))
    named["metadata"]["labels"] = {"jobset.sigs.k8s.io/jobset-name": "llama"}
    assert read_pod(named, "ml").group == "sweep"
    assert read_pod(named, "ml").shape != views[0].shape
    del named["metadata"]["annotations"]["gpupool.io/group"]
    assert read_pod(named, "ml").group == "JobSet/llama"
    assert read_pod(base(), "ml").group == ""


def test_visible_devices_are_read_from_the_env_last_entry_winning() -> None:
    """NVIDIA_VISIBLE_DEVICES as the runtime will see it: the last entry of that name, or its source."""
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    source = [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    containers = [{"name": "a", "env": env}, {"name": "b", "env": source}, {"name": "c"}]
    views = read_pod(pod(containers=containers)).shape.containers
    assert [(c.visible_devices, c.visible_devices_from) for c in views] == [
        ("all", ""),
        ("", "configMapKeyRef"),
        (None, ""),
    ]


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda p: p["spec"].update(tolerations=[{"operator": "Exists"}] * (MAX_TOLERATIONS + 1)),
         f"spec.tolerations: {MAX_TOLERATIONS + 1} tolerations; gpupool reads at most {MAX_TOLERATIONS}"),
        (lambda p: p["spec"].update(containers=[{"name": "c"}] * (MAX_CONTAINERS + 1)),
         f"spec.containers: {MAX_CONTAINERS + 1} containers; gpupool reads at most {MAX_CONTAINERS}"),
        (lambda p: p["spec"].update(initContainers=[{"name": "c"}] * (MAX_CONTAINERS + 1)),
         f"spec.initContainers: {MAX_CONTAINERS + 1} containers; gpupool reads at most {MAX_CONTAINERS}"),
        (lambda p: p["spec"].update(nodeSelector={f"l{i}": "x" for i in range(MAX_SELECTOR_ENTRIES + 1)}),
         f"spec.nodeSelector: {MAX_SELECTOR_ENTRIES + 1} labels; gpupool reads at most {MAX_SELECTOR_ENTRIES}"),
        (lambda p: p["metadata"]["annotations"].update({f"gpupool.io/k{i}": "x" for i in range(10_000)}),
         f"metadata.annotations: more than {MAX_OWN_ANNOTATIONS} gpupool.io/ annotations"),
        (lambda p: p["metadata"].update(ownerReferences=[{"kind": "Job", "name": "j"}] * (MAX_OWNERS + 1)),
         f"metadata.ownerReferences: {MAX_OWNERS + 1} owner references; gpupool reads at most {MAX_OWNERS}"),
        (lambda p: p["spec"]["containers"][0].update(
            resources={"limits": {f"example.com/r{i}": "1" for i in range(MAX_EXTENDED_RESOURCES + 1)}}),
         rf"spec.containers\[0\].resources.limits: {MAX_EXTENDED_RESOURCES + 1} extended resources"),
    ],
    ids=["tolerations", "containers", "init-containers", "node-selector", "own-annotations", "owners",
         "extended-resources"],
)  # fmt: skip
def test_lists_the_core_reads_are_bounded(edit: Callable[[dict[str, Any]], object], words: str) -> None:
    """Far more items than any real Pod has are refused by their count before they are read, so the
    largest review costs milliseconds (the limits are documented)."""
    with pytest.raises(PodError, match=words):
        read_pod(changed(edit), "ml")
