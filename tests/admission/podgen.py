"""Hypothesis strategies and helpers for the core's property tests (tests/admission/test_core_*.py,
test_hints.py, test_validation.py): Pods as they reach admission (annotation values the rules accept and
refuse, every shape of resources, selectors and tolerations, workload identities), Pods one field apart,
the demo cluster edited node by node (taints, class labels, MIG and time-sliced devices), the demo
policy with a twin namespace, and the fixes a denial names.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import orjson
from hypothesis import strategies as st

from tests.admission.demo import (
    A100,
    A100_1G_SINGLE,
    A100_3G,
    EXAMPLES,
    RTX3060,
    T4,
    T4_SHARED,
    _demo_objects,
)
from tests.builders import pod, quota
from tests.builders import policy as make_policy
from webhook.domain.policy import Policy

# --- property-based: random annotation values and Pod shapes ----------------------------------------------

# Per annotation: values the rules accept (some of which match no pool) and values they refuse.
_VALUES: dict[str, tuple[list[str], list[str]]] = {
    "gpu-class": (
        ["low", "medium", "high", "medium,high", "high,medium", "low,medium,high", " medium "],
        ["", "huge", "medium,", ",", "medium,medium", "MEDIUM"],
    ),
    "gpu-count": (["1", "1", "2", "4", "8", " 2", "64"], ["0", "65", "two", "-1", "1.5", "", "1e1", "+1"]),
    "min-memory": (
        ["24Gi", "40G", "16384Mi", "20Gi", "12Gi", "1Ki", "1e9", "80Gi", "80G"],
        ["0", "-1Gi", "abc", "", "24gi", "24 Gi"],
    ),
    "gpu-product": (
        ["A100", "a100", "T4", "tesla-t4", "A10", "H20", "H100-80GB", "A100,T4", "RTX-4090", "L4",
         "NVIDIA-A100-SXM4-40GB", "GeForce", "MI250X", "Ascend910"],
        ["", ",", "A100,,T4", "H100;rm", "A100 T4"],
    ),
    "min-driver": (
        ["535", "535.104.05", "545", "550.54.15", "600", "525.60"],
        ["1.2.3.4.5", "abc", "", "535.", "v535"],
    ),
    "vendor": (["nvidia", "nvidia", "amd", "ascend", " amd "], ["intel", "NVIDIA", ""]),
    "container": (["main", "sidecar", "worker"], ["nope", "", "init"]),
    "fallback": (["true", "false", "True"], ["yes", "", "1"]),
    "pool": ([T4, A100, RTX3060, "amd/high/AMD_Instinct_MI250X", T4_SHARED, A100_3G, A100_1G_SINGLE],
             ["bad", "a/b/c/d", "nvidia/huge/X", "//"]),
    "device": (["gpu", "mig", "shared", "mig,gpu", "shared,gpu", "gpu,shared", "gpu,mig,shared", " shared "],
               ["", "tpu", "gpu,gpu", "mig,", "GPU"]),
    "min-compute-capability": (["7.5", "8.0", "8.6", "8.9", "9.0", "9", "10.0"], ["", "8.0.1", "sm_80", "８.0"]),
    "min-cuda": (["12.0", "12.2", "12.3", "12.4", "11", "13.0"], ["", "12.4.1", "cuda12", "12,4"]),
    "group": (["sweep", "llama-7b-sft", "a.b_c-1"], ["", "a/b", "-x", " sweep", "x" * 64]),
    "group-policy": (["prefer", "strict", " strict "], ["loose", "", "STRICT"]),
    "group-size": (["1", "2", "4", "16", "4096"], ["0", "4097", "many", "", "１"]),
}  # fmt: skip
# Who a Pod is, beside its shape: its controller owner and the label of a multi-Job workload. The demo
# cluster's two PyTorchJob masters are on the A100 and H100 pools, so Pods of their groups are pulled there.
OWNERS = [None, None, ("Job", "train"), ("ReplicaSet", "web-7f9c"), ("PyTorchJob", "llama-7b-sft")]
KUBEFLOW = "training.kubeflow.org/job-name"
WORKLOAD_LABELS = [None, None, None, (KUBEFLOW, "llama-7b-sft"), (KUBEFLOW, "mixtral-pretrain"),
                   ("jobset.sigs.k8s.io/jobset-name", "js")]  # fmt: skip


def set_identity(meta: dict[str, Any], owner: tuple[str, str] | None, label: tuple[str, str] | None) -> None:
    """Give a Pod's metadata a controller owner and a workload label (None: take it away)."""
    meta.pop("ownerReferences", None)
    meta.pop("labels", None)
    if owner is not None:
        kind, name = owner
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": kind, "name": name, "uid": f"uid-{name}",
                                    "controller": True}]  # fmt: skip
    if label is not None:
        meta["labels"] = {label[0]: label[1]}


_RANDOM_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)


@st.composite
def annotation_value(draw: st.DrawFn, key: str) -> str:
    """Mostly a value the rules accept, sometimes one they refuse, rarely random text."""
    good, bad = _VALUES[key]
    kind = draw(st.sampled_from(["good"] * 12 + ["bad", "bad", "text"]))
    if kind == "text":
        return draw(_RANDOM_TEXT)
    return draw(st.sampled_from(bad if kind == "bad" else good))


@st.composite
def annotations_st(draw: st.DrawFn) -> dict[str, str]:
    """gpupool.io/ annotations with plausible and broken values, sometimes unknown gpupool.io/ keys,
    and annotations of other tools."""
    common = sorted(set(_VALUES) - {"pool"})
    keys = draw(st.lists(st.sampled_from(common), min_size=1, max_size=4, unique=True))
    if draw(st.sampled_from([False] * 9 + [True])):
        keys.append("pool")
    out = {f"gpupool.io/{key}": draw(annotation_value(key)) for key in keys}
    if draw(st.sampled_from([False] * 14 + [True])):
        unknown = draw(st.sampled_from(["gpu-clas", "gpus", "memory", "x", "GPU-Class", ""]))
        out[f"gpupool.io/{unknown}"] = draw(_RANDOM_TEXT)
    if draw(st.booleans()):
        out["example.com/owner"] = draw(_RANDOM_TEXT)
    return out


_GPU_QUANTITIES = st.sampled_from(["1", "2", "4", "0", "abc", "1.5", "64", "100"])
_GPU_RESOURCES = st.sampled_from(
    ["nvidia.com/gpu", "nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910", "nvidia.com/mig-1g.5gb",
     "nvidia.com/mig-3g.20gb"]
)  # fmt: skip


@st.composite
def resources_st(draw: st.DrawFn) -> dict[str, Any] | None:
    shape = draw(st.sampled_from(["absent", "null", "empty", "limits", "requests", "both"]))
    if shape == "absent":
        return None
    if shape == "null":
        return {"resources": None}
    if shape == "empty":
        return {"resources": {}}
    res: dict[str, Any] = {}
    gpu = draw(st.none() | st.tuples(_GPU_RESOURCES, _GPU_QUANTITIES))
    for kind in ("limits", "requests"):
        if shape in (kind, "both"):
            entries = {"cpu": "1"} if kind == "requests" else {"memory": "1Gi"}
            if gpu is not None and draw(st.integers(0, 4)) > 0:
                entries[gpu[0]] = gpu[1]
            res[kind] = entries
    return {"resources": res}


@st.composite
def container_st(draw: st.DrawFn, name: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "registry.example/app:1"}
    resources = draw(resources_st())
    if resources is not None:
        container.update(resources)
    return container


@st.composite
def pod_st(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod as it reaches admission, in the shapes users and controllers write."""
    meta: dict[str, Any] = {}
    naming = draw(st.sampled_from(["name", "generateName", "both"]))
    if naming in ("name", "both"):
        meta["name"] = "job"
    if naming in ("generateName", "both"):
        meta["generateName"] = "job-"
    annotations = draw(st.sampled_from(["absent", "null", "map", "map", "map", "map"]))
    if annotations == "null":
        meta["annotations"] = None
    elif annotations == "map":
        meta["annotations"] = draw(annotations_st())
    set_identity(meta, draw(st.sampled_from(OWNERS)), draw(st.sampled_from(WORKLOAD_LABELS)))
    names = draw(st.lists(st.sampled_from(["main", "sidecar", "worker"]), min_size=1, max_size=3, unique=True))
    spec: dict[str, Any] = {"containers": [draw(container_st(n)) for n in names]}
    if draw(st.booleans()):
        init = draw(container_st("init"))
        if draw(st.booleans()):
            init["restartPolicy"] = "Always"
        spec["initContainers"] = [init]
    selector: Any = draw(
        st.sampled_from(
            [None, "null", {}, {"kubernetes.io/os": "linux"}, {"nvidia.com/gpu.product": "Tesla-T4"},
             {"gpu.accelerator/class": "high"}, {"gpu.accelerator/class": "low", "kubernetes.io/arch": "amd64"},
             {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
             {"nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"}]
        )
    )  # fmt: skip
    if selector == "null":
        spec["nodeSelector"] = None
    elif selector is not None:
        spec["nodeSelector"] = dict(selector)
    tolerations = draw(
        st.sampled_from(
            [None, [], [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}],
             [{"operator": "Exists"}], [{"key": "example.com/spot", "operator": "Exists"}]]
        )
    )  # fmt: skip
    if tolerations is not None:
        spec["tolerations"] = copy.deepcopy(tolerations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


NAMESPACES = st.sampled_from(["ml-train", "team-a", "team-b", "students", "default"])


TAINTS = [
    {"key": "dedicated", "value": "inference", "effect": "NoSchedule"},
    {"key": "example.com/spot", "effect": "NoExecute"},
    {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
]


PINS = [
    ("gpu.accelerator/class", "medium"),
    ("gpu.accelerator/class", "high"),
    ("nvidia.com/gpu.product", "Tesla-T4"),
    ("kubernetes.io/os", "linux"),
    ("nvidia.com/gpu.product", "Tesla-T4-SHARED"),
    ("nvidia.com/mig-3g.20gb.product", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"),
    ("nvidia.com/gpu.replicas", "1"),
]


# (left out, taint added (index in TAINTS), class label, device change)
NodeEdit = tuple[bool, int | None, str | None, str | None]
DEVICE_EDITS = [None, None, None, None, "mig-pending", "time-sliced", "mig-single", "mig-invalid", "no-compute"]
NODE_EDITS = st.tuples(
    st.integers(0, 9).map(lambda n: n == 0),
    st.none() | st.integers(0, len(TAINTS) - 1),
    st.sampled_from([None, None, None, "remove", "low", "medium", "high"]),
    st.sampled_from(DEVICE_EDITS),
)


def _edit_device(labels: dict[str, str], status: dict[str, Any], edit: str) -> None:
    """A GPU node turned into another kind of device, as GFD would label it, or its MIG layout changing."""
    allocatable = status.setdefault("allocatable", {})
    gpus = int(allocatable.get("nvidia.com/gpu", "0"))
    product = labels.get("nvidia.com/gpu.product", "")
    if not gpus or not product:
        return
    if edit == "mig-pending":
        labels["nvidia.com/mig.config.state"] = "pending"
    elif edit == "time-sliced" and not product.endswith("-SHARED"):
        labels |= {"nvidia.com/gpu.product": f"{product}-SHARED", "nvidia.com/gpu.replicas": "2"}
        allocatable["nvidia.com/gpu"] = str(gpus * 2)
    elif edit == "mig-single" and "-MIG-" not in product:
        labels |= {"nvidia.com/gpu.product": f"{product}-MIG-1g.5gb", "nvidia.com/gpu.memory": "4864"}
        allocatable["nvidia.com/gpu"] = str(gpus * 7)
    elif edit == "mig-invalid":
        labels |= {"nvidia.com/gpu.product": f"{product}-MIG-INVALID", "nvidia.com/gpu.count": "0"}
    elif edit == "no-compute":
        labels.pop("nvidia.com/gpu.compute.major", None)


@functools.cache
def _demo_json() -> bytes:
    """The demo cluster as JSON, read back for each fleet: a copy four times cheaper than `copy.deepcopy`,
    which was a third of the property tests that draw a fleet per example (the objects hold JSON only)."""
    return orjson.dumps(list(_demo_objects()))


def edited_fleet(edits: list[NodeEdit]) -> list[dict[str, Any]]:
    """The demo cluster changed by `edits` (one per node, in order): nodes left out, taints added
    (tolerated by some generated Pods, by none, or the GPU taint gpupool tolerates itself), class labels
    moved or removed, devices changed (MIG, time-slicing, a MIG layout being applied or invalid, compute
    labels gone). (Edits, not objects, are what hypothesis draws: they print short.)"""
    objects, nodes = [], 0
    for obj in orjson.loads(_demo_json()):
        if obj["kind"] == "Node":
            left_out, taint, relabel, device = edits[nodes % len(edits)] if edits else (False, None, None, None)
            nodes += 1
            if left_out and nodes > 1:  # the first node always stays: a snapshot needs one
                continue
            spec, labels = obj.setdefault("spec", {}), obj["metadata"].setdefault("labels", {})
            if taint is not None:
                spec["taints"] = [*spec.get("taints", []), TAINTS[taint]]
            if relabel == "remove":
                labels.pop("gpu.accelerator/class", None)
            elif relabel is not None:
                labels["gpu.accelerator/class"] = relabel
            if device is not None:
                _edit_device(labels, obj.setdefault("status", {}), device)
        objects.append(obj)
    # The limits. form, which only gpupool enforces, beside team-a's requests. and team-b's bare form.
    objects.append(quota("limits-form", "students", {"limits.nvidia.com/gpu": "1"}))
    return objects


@functools.cache
def twin_policy() -> Policy:
    """The demo policy plus `students-b`, ruled exactly like `students` (namespaces that differ in name
    only still get their own name in every message), and a GPU-memory quota for team-b, whose
    ResourceQuota is in the tutorial's form: every quota form is met."""
    text = (EXAMPLES / "policy.yaml").read_text("utf-8")
    twin = "\n  students-b:\n    allowedClasses: [low, medium]\n    defaultClass: low\n    device: [shared, gpu]\n"
    return make_policy(text + twin + "  team-b:\n    memoryQuota: 40Gi\n")


TWIN_NAMESPACES = st.sampled_from(["ml-train", "team-a", "team-b", "students", "students-b", "default"])


@st.composite
def one_field_apart_st(draw: st.DrawFn) -> list[tuple[dict[str, Any], str]]:
    """A valid GPU Pod, then variants of it that differ in exactly one thing the request holds: one
    annotation set to another accepted value (or removed), a toleration, a nodeSelector pin, the
    namespace (students-b is ruled like students), the default class or devices asked for by name,
    another container's GPUs, a MIG profile's resource instead of the GPUs, or the vendor. Where a memo key
    misses a field, two of these share an answer only one should get."""
    annotations = {f"gpupool.io/{k}": draw(st.sampled_from(_VALUES[k][0])) for k in draw(st.sets(st.sampled_from(
        ["gpu-class", "min-memory", "gpu-count", "gpu-product", "min-driver", "fallback", "group-policy",
         "group-size", "device", "min-compute-capability", "min-cuda"])))}  # fmt: skip
    resource = draw(st.sampled_from(["nvidia.com/gpu"] * 4 + ["nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb"]))
    base = pod("job", annotations=annotations, gpus=draw(st.none() | st.integers(1, 2)), resource=resource)
    set_identity(base["metadata"], draw(st.sampled_from(OWNERS)), draw(st.sampled_from(WORKLOAD_LABELS)))
    namespace = draw(TWIN_NAMESPACES)
    calls = [(base, namespace)]
    for _ in range(draw(st.integers(1, 6))):
        variant, ns = copy.deepcopy(base), namespace
        change = draw(
            st.sampled_from(
                ["annotation", "annotation", "annotation", "toleration", "pin", "namespace", "default spelled out",
                 "another container", "vendor", "identity", "device spelled out", "mig resource"]
            )
        )  # fmt: skip
        if change == "vendor":  # a Pod with no GPU limit of its own, then the same asking for AMD
            variant["spec"]["containers"][0].pop("resources", None)
            calls.append((copy.deepcopy(variant), ns))
            variant["metadata"]["annotations"]["gpupool.io/vendor"] = "amd"
        elif change == "default spelled out":  # students' default class, then the same asked for by name
            variant["metadata"]["annotations"].pop("gpupool.io/gpu-class", None)
            calls.append((copy.deepcopy(variant), "students"))
            variant["metadata"]["annotations"]["gpupool.io/gpu-class"] = "low"
            ns = "students"
        elif change == "device spelled out":  # students' default devices, then the same asked for by name
            variant["metadata"]["annotations"].pop("gpupool.io/device", None)
            calls.append((copy.deepcopy(variant), "students"))
            variant["metadata"]["annotations"]["gpupool.io/device"] = "shared,gpu"
            ns = "students"
        elif change == "mig resource":  # the same count, of a MIG profile's resource
            variant["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.20gb": "1"}}
        elif change == "another container":  # the Pod's GPUs change, the target container's do not
            helper = {"name": "helper", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            variant["spec"]["containers"].append(helper)
        elif change == "annotation":
            key = draw(st.sampled_from(sorted(set(_VALUES) - {"container"})))
            if draw(st.integers(0, 4)) == 0:
                variant["metadata"]["annotations"].pop(f"gpupool.io/{key}", None)
            else:
                variant["metadata"]["annotations"][f"gpupool.io/{key}"] = draw(st.sampled_from(_VALUES[key][0]))
        elif change == "identity":  # another workload group, nothing else
            set_identity(variant["metadata"], draw(st.sampled_from(OWNERS)), draw(st.sampled_from(WORKLOAD_LABELS)))
        elif change == "toleration":
            variant["spec"]["tolerations"] = [draw(st.sampled_from(TAINTS))]
        elif change == "pin":
            variant["spec"]["nodeSelector"] = dict([draw(st.sampled_from(PINS))])
        else:
            ns = draw(TWIN_NAMESPACES)
        calls.append((variant, ns))
    return calls


_FIX = re.compile(r"(?:set|or) (gpupool\.io/[a-z-]+): ([A-Za-z0-9._-]+)")


def named_fixes(message: str) -> list[tuple[str, str]]:
    """The annotation values a denial names as fixes (`set gpupool.io/gpu-class: high`)."""
    return _FIX.findall(message)


_STOPPED = re.compile(r" with (gpupool\.io/[a-z-]+): ([A-Za-z0-9._-]+), but not now: ")


def stopped_fixes(message: str) -> list[tuple[str, str]]:
    """The annotation values a denial names as the Pod's to set but stopped now by a quota
    (`with gpupool.io/gpu-class: high, but not now: ...`)."""
    return _STOPPED.findall(message)


def with_annotation(obj: dict[str, Any], key: str, value: str) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    changed["metadata"]["annotations"] = {**(changed["metadata"].get("annotations") or {}), key: value}
    return changed
