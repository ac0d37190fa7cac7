"""Whatever a review carries, the core answers and never raises: random annotation values and Pod
shapes get a patch that applies and is idempotent, malformed objects a 400 naming the field, and
hostile values and the largest reviews an answer in bounded time.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.admission.demo import (
    POOL_KEY,
    _demo_objects,
    apply,
    assert_feasible,
    demo_index,
    demo_policy,
    shared_demo_index,
    validate_pod,
)
from tests.admission.podgen import (
    NAMESPACES,
    pod_st,
)
from tests.builders import pod
from webhook.admission.core import Admitter, evaluate
from webhook.admission.pod import MAX_CONTAINERS, MAX_EXTENDED_RESOURCES, MAX_SELECTOR_ENTRIES, MAX_TOLERATIONS
from webhook.pools.kubeobj import pod_gpu_requests
from webhook.sources.snapshot import SnapshotInventory


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=pod_st(), namespace=NAMESPACES)
def test_evaluate_never_raises_and_every_patch_applies_and_is_idempotent(obj: dict[str, Any], namespace: str) -> None:
    """For any annotation values and Pod shape: an answer (never an exception), a message on every
    denial, a patch only with a pool, a patch that applies to the original Pod and yields a valid
    1.29 Pod, and an empty patch for the patched Pod with the same pool."""
    policy, index = demo_policy(), shared_demo_index()
    original = copy.deepcopy(obj)
    result = evaluate(obj, namespace, policy, index)
    assert obj == original, "evaluate changed the Pod it was given"
    event(result.outcome)
    if not result.allowed:
        assert result.message.strip()
        assert result.code in (400, 403)
        assert result.patch == () and result.placement is None
        return
    assert result.code == 200
    if result.placement is None:
        assert result.patch == ()
        return
    assert all(len(w) <= 120 for w in result.warnings), "kubectl shows warnings; keep each under 120 characters"
    patched = apply(obj, result.patch)
    validate_pod(patched)
    assert patched["metadata"]["annotations"][POOL_KEY] == str(result.placement.pool)
    # What the inventory holds for the Pod is what the patched Pod will really request, where it can run.
    requests = pod_gpu_requests(patched["spec"], policy.gpu_resources, policy.partition_prefixes)
    assert requests.get(result.placement.resource, 0) == result.placement.pod_total
    assert_feasible(result, patched, policy, index, list(_demo_objects()), original=original)
    again = evaluate(patched, namespace, policy, index)
    assert again.allowed, again.message
    assert again.patch == ()
    assert again.placement is not None and again.placement.pool == result.placement.pool


@settings(max_examples=100, deadline=None)
@given(value=st.one_of(st.integers(), st.none(), st.booleans(), st.lists(st.text(max_size=3), max_size=2)))
def test_non_string_annotation_values_are_denied_not_raised(value: object) -> None:
    """An annotation value that is not a string (unquoted YAML `2`, `true`, an empty value) is refused
    with a message naming the annotation."""
    obj = pod(annotations={})
    obj["metadata"]["annotations"]["gpupool.io/gpu-count"] = value
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert not result.allowed
    assert "gpupool.io/gpu-count" in result.message


@pytest.mark.parametrize(
    ("obj", "field"),
    [(None, "the object is not a Pod"), ([], "the object is not a Pod"), ("pod", "the object is not a Pod"),
     ({"kind": "Pod"}, "metadata"), ({"metadata": None, "spec": None}, "metadata"),
     ({"metadata": {"annotations": "x"}, "spec": {}}, "metadata.annotations"),
     ({"metadata": {"annotations": {"gpupool.io/gpu-class": "low"}}, "spec": {"containers": None}}, "no containers"),
     ({"metadata": {"annotations": {"gpupool.io/gpu-class": "low"}}, "spec": {"containers": ["x", 3]}},
      "spec.containers[0]"),
     ({"metadata": {"ownerReferences": 5}, "spec": {"containers": [{"name": "a"}]}}, "metadata.ownerReferences")],
    ids=["none", "list", "string", "no-metadata", "null-parts", "annotations-string", "containers-null",
         "containers-not-objects", "owner-references-number"],
)  # fmt: skip
def test_malformed_objects_are_refused_naming_the_field(obj: Any, field: str) -> None:
    """Whatever arrives, the core answers, never raises: a Pod that is not well-formed is refused (400)
    with the field that is wrong, and never gets a patch that could not apply."""
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert (result.allowed, result.code, result.patch) == (False, 400, ())
    assert field in result.message


def test_a_pod_with_no_namespace_anywhere_is_refused_in_the_review() -> None:
    """No namespace on the Pod nor on the request: no rule can apply, so it is refused (400), in the
    review, naming the field."""
    obj = pod(gpus=1)
    del obj["metadata"]["namespace"]
    result = evaluate(obj, "", demo_policy(), shared_demo_index())
    assert (result.allowed, result.code) == (False, 400)
    assert "metadata.namespace" in result.message


# --- hostile input: every review costs bounded time ---------------------------------------------------

HOSTILE_TEXT = st.one_of(
    st.text(max_size=64),
    st.integers(1, 60_000).map(lambda n: "1" * n + "x"),  # a long digit run the old regex backtracked on
    st.integers(1, 7).map(lambda n: "1e" + "9" * n),  # exponents up to a ten-million-digit power of ten
    st.sampled_from(["²", "２", "٣", "535.²", "1.٥Gi", "\u0663\u0662"]),  # digits that are not ASCII
    st.integers(1, 6000).map(lambda n: "7" * n),  # counts beyond int()'s digit limit
)
HOSTILE_VALUE: Any = st.recursive(
    HOSTILE_TEXT | st.integers() | st.none() | st.booleans(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
ANNOTATION_KEYS = st.sampled_from(
    [
        "device",
        "min-compute-capability",
        "min-cuda",
        "gpu-class",
        "min-memory",
        "gpu-count",
        "gpu-product",
        "min-driver",
        "vendor",
        "container",
        "fallback",
        "pool",
        "x",
    ]
).map(lambda k: f"gpupool.io/{k}")
HOSTILE_BUDGET_SECONDS = 0.5  # bounds a blow-up (the old parser took 25 s); not a performance goal


@st.composite
def hostile_pod_st(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    obj = pod(annotations={k: draw(HOSTILE_VALUE) for k in draw(st.lists(ANNOTATION_KEYS, max_size=4))})
    where = draw(st.sampled_from(["limits", "requests", "tolerations", "nodeSelector", "env", "none"]))
    value = draw(HOSTILE_VALUE)
    container = obj["spec"]["containers"][0]
    if where in ("limits", "requests"):
        container["resources"] = {where: {"nvidia.com/gpu": value}}
    elif where == "tolerations":
        obj["spec"]["tolerations"] = [{"key": value, "operator": "Exists"}]
    elif where == "nodeSelector":
        obj["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": value}
    elif where == "env":
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    return obj, [where]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=hostile_pod_st())
def test_hostile_values_are_answered_within_a_small_bound(case: tuple[dict[str, Any], list[str]]) -> None:
    """Long digit runs, huge exponents, Unicode digits and nested values in every field the core reads:
    each gets an answer (allowed, or refused with a 400 that names what is wrong), never an exception
    or an internal error, quickly, and a denial message stays short."""
    obj, _ = case
    started = time.perf_counter()
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    elapsed = time.perf_counter() - started
    assert elapsed < HOSTILE_BUDGET_SECONDS, f"{elapsed:.3f} s"
    assert result.allowed or (result.code in (400, 403) and 0 < len(result.message) <= 2048)


def _bulk(kind: str) -> dict[str, Any]:
    """A Pod that fills about 3 MiB (kube-apiserver's body limit) with one kind of field, within the
    counts gpupool reads (webhook.admission.pod's MAX_*), or far beyond them ("too-many-...")."""
    obj = pod(annotations={"gpupool.io/gpu-class": "medium"})
    spec, container = obj["spec"], obj["spec"]["containers"][0]
    if kind == "tolerations":
        spec["tolerations"] = [{"key": f"{i}{'k' * 3000}", "operator": "Exists"} for i in range(MAX_TOLERATIONS)]
    elif kind == "too-many-tolerations":
        spec["tolerations"] = [{"key": f"k{i}", "operator": "Exists"} for i in range(60_000)]
    elif kind == "containers":
        limits = {f"example.com/r{j}": "1" * 80 for j in range(MAX_EXTENDED_RESOURCES)}
        spec["containers"] = [{"name": f"c{i}", "resources": {"limits": limits}} for i in range(MAX_CONTAINERS)]
    elif kind == "too-many-containers":
        spec["containers"] = [
            {"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(30_000)
        ]
    elif kind == "annotations":
        obj["metadata"]["annotations"].update({f"gpupool.io/k{i}": "1" * 20 for i in range(60_000)})
    elif kind == "other-annotations":
        obj["metadata"]["annotations"].update({f"example.com/k{i}": "1" * 20 for i in range(60_000)})
    elif kind == "nodeSelector":
        spec["nodeSelector"] = {f"example.com/label-{i}": "x" * 12_000 for i in range(MAX_SELECTOR_ENTRIES)}
    elif kind == "too-many-selector-labels":
        spec["nodeSelector"] = {f"example.com/label-{i}": "x" * 20 for i in range(60_000)}
    elif kind == "env":
        container["env"] = [{"name": f"VAR_{i}", "value": "x" * 20} for i in range(60_000)]
    elif kind == "one-value":
        obj["metadata"]["annotations"]["gpupool.io/min-memory"] = "1" * (3 * 2**20 - 100)
    return obj


@pytest.mark.parametrize(
    "kind",
    ["tolerations", "too-many-tolerations", "containers", "too-many-containers", "annotations", "other-annotations",
     "nodeSelector", "too-many-selector-labels", "env", "one-value"],
)  # fmt: skip
def test_the_largest_reviews_are_answered_in_milliseconds(kind: str, request: pytest.FixtureRequest) -> None:
    """The worst case, measured: a Pod of about 3 MiB made of one kind of field, through the Admitter (as
    the server runs it: read, decide, reserve), twice (cold, then with its shape remembered). The time
    is printed at the end of the run (tests/conftest.py); the assertion only catches a blow-up."""
    obj = _bulk(kind)
    adm = Admitter(demo_policy(), SnapshotInventory(demo_index(), "demo"))
    worst = 0.0
    for _ in range(2):
        started = time.perf_counter()
        result = adm.admit(obj, namespace="ml-train", dry_run=True)
        worst = max(worst, time.perf_counter() - started)
    request.node.user_properties.append(("worst-case seconds", round(worst, 4)))
    assert result.allowed or result.message
    assert worst < 2.0, f"{kind}: {worst:.3f} s"
