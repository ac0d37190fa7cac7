"""Denials that say how to fix them (webhook.admission.hints): the one annotation value that would place
the Pod now, and only such a value: never a class the namespace does not allow, never past a quota."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.admission.demo import EXAMPLES, _demo_objects, demo_policy, sample_verdict, shared_demo_index
from tests.admission.podgen import (
    NODE_EDITS,
    TAINTS,
    TWIN_NAMESPACES,
    NodeEdit,
    edited_fleet,
    named_fixes,
    stopped_fixes,
    twin_policy,
    with_annotation,
)
from tests.builders import fleet, gpu_node, index_of, mig_mixed_node, pod, policy
from webhook.admission.choice import ADMIT, choose
from webhook.admission.core import evaluate
from webhook.admission.hints import HINTED, MAX_MESSAGE_CHARS, MAX_TRIES, hinted
from webhook.admission.misses import MAX_NEAR_PRODUCTS
from webhook.admission.pod import read_pod
from webhook.admission.request import parse_request
from webhook.admission.verdict import Verdict
from webhook.serving import review
from webhook.sources.snapshot import build_index

TEAM_A_POD = pod("big", "team-a", annotations={"gpupool.io/gpu-count": "2", "gpupool.io/min-memory": "40Gi"})
NEAREST_FOR_TEAM_A = (
    "no GPU pool matches the Pod: NVIDIA-A100-SXM4-40GB: class high not in medium (namespace default); "
    "NVIDIA-H100-80GB-HBM3: class high not in medium (namespace default); Tesla-T4: 16Gi as sold "
    "(15Gi reported) < min-memory 40Gi"
)


def placed_now(result: Verdict) -> bool:
    return result.allowed and result.placement is not None and result.placement.has_capacity


def team_a_finished() -> list[dict[str, Any]]:
    """The demo cluster once team-a's Pods have finished: its GPU quota, class quotas and GPU memory have
    room (the quota controller counts 0 in use)."""
    objects = copy.deepcopy(list(_demo_objects()))
    for obj in objects:
        if obj["metadata"].get("namespace") != "team-a":
            continue
        if obj["kind"] == "Pod":
            obj.setdefault("status", {})["phase"] = "Succeeded"
        elif obj["kind"] == "ResourceQuota":
            obj["status"]["used"] = dict.fromkeys(obj["status"].get("used", {}), "0")
    return objects


# --- what a denial names ------------------------------------------------------------------------------------


def test_a_class_the_namespace_allows_that_fits_is_named_with_its_annotation() -> None:
    """2 x 40Gi in team-a, whose default class is medium: no medium GPU has 40Gi, the A100s of class high
    have room and team-a may use high, so the denial says so and names the annotation (and the fallback,
    which gets the same class); the named value does place the Pod."""
    policy_, index = demo_policy(), build_index(team_a_finished(), demo_policy(), "demo, team-a finished")
    result = evaluate(TEAM_A_POD, "team-a", policy_, index)
    assert (result.allowed, result.reason) == (False, "no-match")
    assert result.message == (
        f"{NEAREST_FOR_TEAM_A}. class high fits 2 x 40Gi and team-a allows it: set gpupool.io/gpu-class: high "
        "(or gpupool.io/fallback: true)"
    )
    for key, value in named_fixes(result.message):
        fixed = evaluate(with_annotation(TEAM_A_POD, key, value), "team-a", policy_, index)
        assert placed_now(fixed) and fixed.placement is not None
        assert str(fixed.placement.pool) == "nvidia/high/NVIDIA-A100-SXM4-40GB"


def test_the_class_the_namespace_allows_is_named_with_the_quota_that_stops_it_now() -> None:
    """The demo cluster as it is (issue 21, finding 7): team-a holds 70Gi of its 100Gi GPU memory, so
    class high would take it over: the denial still says that team-a may ask for high, and with which
    annotation, then what stops it now; it names no value to set (the Pod would be denied again)."""
    result = evaluate(TEAM_A_POD, "team-a", demo_policy(), shared_demo_index())
    assert (result.allowed, result.reason) == (False, "no-match")
    assert result.message == (
        f"{NEAREST_FOR_TEAM_A}. class high fits 2 x 40Gi and team-a allows it with gpupool.io/gpu-class: high, "
        "but not now: GPU memory quota in namespace team-a exceeded: used 70Gi + requested 80Gi > hard 100Gi"
    )
    assert named_fixes(result.message) == []
    fixed = evaluate(
        with_annotation(TEAM_A_POD, *stopped_fixes(result.message)[0]), "team-a", demo_policy(), shared_demo_index()
    )
    assert (fixed.allowed, fixed.reason) == (False, "memory-quota")
    assert result.message.endswith(fixed.message)


def test_a_value_a_quota_could_never_allow_is_not_named() -> None:
    """team-a's class quota for high cut to 1: 2 GPUs of class high are over its hard limit whatever
    team-a holds, so high is not offered, not even as stopped for now."""
    text = (EXAMPLES / "policy.yaml").read_text("utf-8").replace("classQuota: {high: 4,", "classQuota: {high: 1,", 1)
    assert "{high: 1," in text
    result = evaluate(TEAM_A_POD, "team-a", policy(text), shared_demo_index())
    assert (result.allowed, result.message) == (False, NEAREST_FOR_TEAM_A)


def test_a_resource_quota_that_stops_the_class_now_is_quoted() -> None:
    """team-a's Pods finished, but the quota controller still counts 3 of its 4 GPUs: class high fits
    and every policy quota has room; its ResourceQuota is what stops the Pod now, and the denial says so."""
    objects = team_a_finished()
    for obj in objects:
        if obj["kind"] == "ResourceQuota" and obj["metadata"].get("namespace") == "team-a":
            obj["status"]["used"] = {"requests.nvidia.com/gpu": "3"}
    result = evaluate(TEAM_A_POD, "team-a", demo_policy(), build_index(objects, demo_policy(), "demo, quota counted"))
    [(key, value)] = stopped_fixes(result.message)
    assert (key, value, named_fixes(result.message)) == ("gpupool.io/gpu-class", "high", [])
    fixed = evaluate(
        with_annotation(TEAM_A_POD, key, value), "team-a", demo_policy(), build_index(objects, demo_policy(), "again")
    )
    assert (fixed.allowed, fixed.reason) == (False, "quota")
    assert result.message.endswith(f"but not now: {fixed.message}")


def test_a_queued_namespace_is_told_the_value_that_queues_the_pod() -> None:
    """team-a queuing its Pods (policy `placement: queue`): a queued Pod is held only to its quotas' hard
    limits, and 2 x 40Gi of class high is within them, so the denial names the value, and it queues."""
    text = (EXAMPLES / "policy.yaml").read_text("utf-8")
    queued = policy(text.replace("    memoryQuota: 100Gi\n", "    memoryQuota: 100Gi\n    placement: queue\n", 1))
    index = shared_demo_index()
    result = evaluate(TEAM_A_POD, "team-a", queued, index)
    assert (result.allowed, result.reason) == (False, "no-match")
    assert result.message == (
        f"{NEAREST_FOR_TEAM_A}. class high fits 2 x 40Gi and team-a allows it: set gpupool.io/gpu-class: high "
        "(or gpupool.io/fallback: true)"
    )
    for key, value in named_fixes(result.message):
        fixed = evaluate(with_annotation(TEAM_A_POD, key, value), "team-a", queued, index)
        assert (fixed.allowed, fixed.outcome, fixed.placement) == (True, "mutated", None)
        assert any("queued" in w for w in fixed.warnings)


def test_no_class_is_named_that_the_namespace_does_not_allow() -> None:
    """students may use low and medium: 40Gi fits only class high (in ml-train, which may use every
    class, the same Pod is placed there), which is not theirs to name."""
    obj = pod("big", "students", annotations={"gpupool.io/min-memory": "40Gi", "gpupool.io/device": "gpu"})
    result = evaluate(obj, "students", demo_policy(), shared_demo_index())
    assert not result.allowed and named_fixes(result.message) == []
    elsewhere = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert elsewhere.placement is not None and elsewhere.placement.pool.gpu_class == "high"


def test_the_class_hint_sample() -> None:
    """examples/pods/class-hint.yaml: 40Gi in class medium in ml-train, told to ask for high."""
    _, result = sample_verdict("class-hint.yaml")
    assert result.message == (
        "no GPU pool matches the Pod: NVIDIA-A100-SXM4-40GB: class high not in medium (annotation); "
        "NVIDIA-H100-80GB-HBM3: class high not in medium (annotation); Tesla-T4: 16Gi as sold "
        "(15Gi reported) < min-memory 40Gi. "
        "class high fits 1 x 40Gi and ml-train allows it: set gpupool.io/gpu-class: high (or gpupool.io/fallback: "
        "true)"
    )


def test_another_product_of_the_same_family_with_room_is_named() -> None:
    """`H20` on a fleet whose H100 has room: the H100 is the nearest and fits, so the denial names the
    product value that gets it; the A100, T4 and RTX 4090, which fit too, are not named."""
    result = evaluate(pod(annotations={"gpupool.io/gpu-product": "H20"}), "ml", policy(), index_of(fleet()))
    assert result.message == (
        "no GPU pool matches the Pod: NVIDIA-H100-80GB-HBM3: product NVIDIA-H100-80GB-HBM3 does not match "
        "gpupool.io/gpu-product H20. NVIDIA-H100-80GB-HBM3 fits 1 GPU: set gpupool.io/gpu-product: H100-80GB-HBM3"
    )


def test_a_product_unrelated_to_the_one_asked_for_is_never_named() -> None:
    """`A100` in class medium: the A100 lacks only its class, so class high is named; the T4s and L4s
    lack only their product and have room, but share neither a token nor a family with A100: not named."""
    obj = pod(annotations={"gpupool.io/gpu-product": "A100", "gpupool.io/gpu-class": "medium"})
    result = evaluate(obj, "ml", policy(), index_of(fleet()))
    assert named_fixes(result.message) == [("gpupool.io/gpu-class", "high"), ("gpupool.io/fallback", "true")]


def test_a_device_kind_that_fits_is_named() -> None:
    """18Gi where the only whole GPUs are 16 GB T4s (the MIG node's GPUs are all cut) and a 3g.20gb MIG
    instance is free: `device: mig`."""
    objects = [gpu_node("t4-a"), mig_mixed_node("mixed-a", whole=0, instances={"3g.20gb": (2, 20096)})]
    result = evaluate(pod(annotations={"gpupool.io/min-memory": "18Gi"}), "ml", policy(), index_of(objects))
    assert result.message == (
        "no GPU pool matches the Pod: NVIDIA-A100-SXM4-40GB: no node has 1 GPUs (the largest has 0); Tesla-T4: "
        "16Gi as sold (15Gi reported) < min-memory 18Gi. NVIDIA-A100-SXM4-40GB-MIG-3g.20gb fits 1 x 18Gi: set "
        "gpupool.io/device: mig"
    )


def test_a_class_with_room_is_named_not_the_nearer_one_that_is_full() -> None:
    """Classes low < medium < high < top: class medium with 40Gi, the high A100 full, the top H100 free.
    `gpu-class: high` would only wait, so it is not named; `top` is, and the fallback, which gets there."""
    pol = policy("classes: [low, medium, high, top]")
    objects = [
        gpu_node("t4-a"),
        gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 1, memory_mib=40960, gpu_class="high"),
        pod("busy", gpus=1, node="a100-a", phase="Running"),
        gpu_node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class="top"),
    ]
    obj = pod(annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/min-memory": "40Gi"})
    result = evaluate(obj, "ml", pol, index_of(objects, pol))
    assert result.message.endswith(
        "; NVIDIA-H100-80GB-HBM3: class top not in medium (annotation). class top fits 1 x 40Gi and ml allows it: "
        "set gpupool.io/gpu-class: top (or gpupool.io/fallback: true)"
    ), result.message


def test_a_fallback_beyond_the_classes_tried_is_named_on_its_own() -> None:
    """Three full classes above medium, then one with room: the classes tried stop at MAX_TRIES, the
    fallback (tried second) reaches the free one and is named alone."""
    pol = policy("classes: [low, medium, high, high2, high3, top]")
    objects = [gpu_node("t4-a"), gpu_node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class="top")]
    for i, gpu_class in enumerate(["high", "high2", "high3"]):
        objects += [
            gpu_node(f"a100-{i}", "NVIDIA-A100-SXM4-40GB", 1, memory_mib=40960, gpu_class=gpu_class),
            pod(f"busy-{i}", gpus=1, node=f"a100-{i}", phase="Running"),
        ]
    obj = pod(annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/min-memory": "40Gi"})
    result = evaluate(obj, "ml", pol, index_of(objects, pol))
    assert MAX_TRIES == 4
    assert result.message.endswith(
        ". class top fits 1 x 40Gi and ml allows it as a fallback: set gpupool.io/fallback: true"
    ), result.message


def test_a_capacity_denial_names_the_class_with_room() -> None:
    """onNoCapacity: deny, class medium full: high has room and is named first (more capable), then low;
    the capacity denial stays as it was."""
    pol = policy("defaults: {onNoCapacity: deny}")
    objects = [
        *fleet(),
        *(pod(f"x{i}", gpus=4, node=n, phase="Running") for i, n in enumerate(["t4-a", "t4-b", "l4-a"])),
    ]
    result = evaluate(pod(annotations={"gpupool.io/gpu-class": "medium"}), "ml", pol, index_of(objects, pol))
    assert result.reason == "no-capacity"
    assert result.message == (
        "no capacity: no pool that matches has 1 free nvidia.com/gpu on one node (best match "
        "nvidia/medium/Tesla-T4, at most 0 free on one node); policy onNoCapacity is deny. class high fits 1 GPU "
        "and ml allows it: set gpupool.io/gpu-class: high (or gpupool.io/fallback: true); or class low fits 1 GPU "
        "and ml allows it: set gpupool.io/gpu-class: low"
    )


def test_a_long_list_of_products_is_not_searched_for_a_fix() -> None:
    """A list of more than MAX_NEAR_PRODUCTS products (what a hostile Pod sends to make every search a
    plan over all of them) gets no fix named; one of at most that many does."""
    listed = ["A100", *(f"X{i}" for i in range(MAX_NEAR_PRODUCTS))]
    short, long = ",".join(listed[:MAX_NEAR_PRODUCTS]), ",".join(listed)
    for products, fixes in ((short, [("gpupool.io/gpu-class", "high")]), (long, [])):
        obj = pod(annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-product": products})
        result = evaluate(obj, "ml", policy(), index_of(fleet()))
        assert (result.reason, named_fixes(result.message)[:1]) == ("no-match", fixes), result.message


def test_a_long_denial_is_cut_so_that_the_hint_stays_whole() -> None:
    """Whatever a denial quotes of the Pod, the hint at its end is never cut off by the server's bound."""
    objects = [*fleet()]
    obj = pod(annotations={"gpupool.io/gpu-product": "H20"})
    pol, index = policy(), index_of(objects)
    view = read_pod(obj, "ml")
    req = parse_request(view.shape, pol)
    plain = evaluate(obj, "ml", pol, index)
    long = choose(req, view, index, pol, ADMIT)._replace(denial="x" * 5000)
    message = hinted(long, req, view, index, pol)
    assert len(message) <= MAX_MESSAGE_CHARS < review.MAX_MESSAGE_CHARS
    assert message.endswith(plain.message[plain.message.index(". ") :])


# --- every value named places the Pod now, and a class that would is named -------------------------------


@st.composite
def fixable_pod_st(draw: st.DrawFn) -> dict[str, Any]:
    """A GPU Pod whose one annotation may stand between it and a pool: a class, a device, a product."""
    choices = {
        "gpu-class": [None, "low", "medium", "medium", "high", "medium,high"],
        "min-memory": [None, "16Gi", "20Gi", "24Gi", "40Gi", "40Gi", "80G"],
        "gpu-product": [None, None, None, None, "H20", "A100", "T4", "L4", "H100", "RTX-4090", "A100-80GB"],
        "device": [None, None, None, "gpu", "mig", "shared"],
        "gpu-count": [None, None, "2", "4"],
        "fallback": [None, None, None, "false"],
        "min-compute-capability": [None, None, None, None, "8.0", "9.0"],
    }
    keys = draw(st.lists(st.sampled_from(sorted(choices)), min_size=1, max_size=3, unique=True))
    annotations = {f"gpupool.io/{k}": v for k in keys if (v := draw(st.sampled_from(choices[k])))}
    obj = pod("job", annotations=annotations or {"gpupool.io/gpu-count": "1"})
    tolerations = draw(st.sampled_from([None, [TAINTS[0]], [TAINTS[1]]]))
    if tolerations is not None:
        obj["spec"]["tolerations"] = copy.deepcopy(tolerations)
    return obj


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=fixable_pod_st(), namespace=TWIN_NAMESPACES, edits=st.lists(NODE_EDITS, max_size=12))
def test_every_value_a_denial_names_places_the_pod_now(
    obj: dict[str, Any], namespace: str, edits: list[NodeEdit]
) -> None:
    """On generated fleets: every annotation value a denial names, set on the Pod, gets it placed now on a
    node with room, in a class its namespace allows (so no rule or quota was loosened); and when setting
    one of the namespace's classes would place it in that class, the denial names a fix."""
    policy_, objects = twin_policy(), edited_fleet(edits)
    index = build_index(objects, policy_, "generated")
    result = evaluate(obj, namespace, policy_, index)
    if result.allowed:
        event("allowed")
        return
    fixes = named_fixes(result.message)
    event(f"{result.reason}: {len(fixes)} named")
    allowed = policy_.namespace(namespace).allowed_classes or policy_.classes
    for key, value in fixes:
        fixed = evaluate(with_annotation(obj, key, value), namespace, policy_, index)
        assert placed_now(fixed), (key, value, fixed.message)
        assert fixed.placement is not None and fixed.placement.pool.gpu_class in allowed
    # A value named as stopped by a quota now is one that admission denies for that quota, and only then.
    stopped = stopped_fixes(result.message)
    assert len(stopped) <= 1 and not (stopped and fixes), result.message
    for key, value in stopped:
        event("a value stopped by a quota named")
        fixed = evaluate(with_annotation(obj, key, value), namespace, policy_, index)
        assert (fixed.allowed, fixed.reason) in ((False, "quota"), (False, "class-quota"), (False, "memory-quota"))
        assert fixed.message.startswith(result.message.split("but not now: ", 1)[1]), (result.message, fixed.message)
    assert not (stopped and result.reason in ("quota", "class-quota", "memory-quota")), result.message
    if result.reason in HINTED and len(allowed) - 1 <= MAX_TRIES and not fixes:
        for gpu_class in allowed:
            fixed = evaluate(with_annotation(obj, "gpupool.io/gpu-class", gpu_class), namespace, policy_, index)
            placement = fixed.placement
            assert not (placed_now(fixed) and placement and placement.pool.gpu_class == gpu_class), (
                f"gpu-class {gpu_class} places the Pod, the denial names no fix: {result.message}"
            )
