"""Pod shapes: Pods that differ only in what gpupool never reads share a key; any difference in what it
reads gives a different key; Pods that cannot be keyed exactly get none. (That a shared memo never
changes an answer is checked on `evaluate` itself, in test_admission.)"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.builders import pod
from webhook.shapes import shape_key


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


@pytest.mark.parametrize(
    "obj",
    [None, [], "pod", {"metadata": None, "spec": {}}, {"metadata": {}, "spec": None},
     {"metadata": {"annotations": "x"}, "spec": {"containers": []}}, {"metadata": {}, "spec": {"containers": None}},
     {"metadata": {}, "spec": {"containers": [], "tolerations": {}}},
     {"metadata": {}, "spec": {"containers": [], "nodeSelector": []}},
     {"metadata": {}, "spec": {"containers": [], "initContainers": "x"}},
     {"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {1: "x"}}]}},
     {"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 2**70}}}]}}],
    ids=["none", "list", "string", "metadata-null", "spec-null", "annotations-string", "containers-null",
         "tolerations-map", "nodeselector-list", "initcontainers-string", "int-key", "huge-int"],
)  # fmt: skip
def test_pods_that_cannot_be_keyed_exactly_get_no_key(obj: Any) -> None:
    assert shape_key(obj, "ml") is None


def test_a_container_that_is_not_an_object_is_not_confused_with_an_empty_one() -> None:
    odd = {"metadata": {}, "spec": {"containers": ["x"]}}
    empty = {"metadata": {}, "spec": {"containers": [{}]}}
    assert shape_key(odd, "ml") != shape_key(empty, "ml")
