"""The memos the server keeps (requests and patches per Pod shape, the index's plans per request) never
change an answer: nearly identical Pods, and Pods one field apart, get through warm memos exactly the
answer a cold index gives.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.admission.demo import (
    demo_policy,
    shared_demo_index,
)
from tests.admission.podgen import (
    _VALUES,
    NAMESPACES,
    NODE_EDITS,
    OWNERS,
    PINS,
    TAINTS,
    WORKLOAD_LABELS,
    NodeEdit,
    annotation_value,
    edited_fleet,
    named_fixes,
    one_field_apart_st,
    pod_st,
    set_identity,
    twin_policy,
    with_annotation,
)
from tests.builders import pod
from webhook.admission.core import evaluate
from webhook.admission.verdict import Verdict
from webhook.domain.policy import Policy
from webhook.pools.memo import Memo
from webhook.sources.snapshot import build_index

_SHAPE_PARTS = (("metadata", "annotations"), ("spec", "containers"), ("spec", "initContainers"),
                ("spec", "nodeSelector"), ("spec", "tolerations"))  # fmt: skip


@st.composite
def near_duplicates_st(draw: st.DrawFn) -> list[tuple[dict[str, Any], str]]:
    """A Pod, then variants of it that each change one thing: take one part (annotations, containers,
    init containers, nodeSelector, tolerations) from another Pod, or change the namespace, the name,
    the init containers' restartPolicy, or keep only other tools' annotations. Pods that agree on
    almost everything gpupool reads, where a key that missed a field would give a wrong answer."""
    obj, namespace = draw(pod_st()), draw(NAMESPACES)
    calls = [(obj, namespace)]
    for _ in range(draw(st.integers(1, 6))):
        variant, other = copy.deepcopy(obj), draw(pod_st())
        part = draw(
            st.sampled_from(
                [*_SHAPE_PARTS, "namespace", "name", "others' annotations", "sidecar", "one annotation",
                 "one annotation", "one toleration", "one pin", "identity", "identity"]
            )
        )  # fmt: skip
        ns = namespace
        if part == "one annotation":  # a single field of the request differs, nothing else
            key = draw(st.sampled_from(sorted(_VALUES)))
            annotations = variant["metadata"].get("annotations") or {}
            variant["metadata"]["annotations"] = annotations
            if draw(st.booleans()) and f"gpupool.io/{key}" in annotations:
                del annotations[f"gpupool.io/{key}"]
            else:
                annotations[f"gpupool.io/{key}"] = draw(annotation_value(key))
        elif part == "one toleration":
            variant["spec"]["tolerations"] = [
                *(variant["spec"].get("tolerations") or []),
                draw(st.sampled_from(TAINTS)),
            ]
        elif part == "one pin":
            selector = variant["spec"].get("nodeSelector") or {}
            label, value = draw(st.sampled_from(PINS))
            variant["spec"]["nodeSelector"] = {**selector, label: value}
        elif part == "namespace":
            ns = draw(NAMESPACES)
        elif part == "name":
            variant["metadata"]["name"] = "job-x7k2p"
        elif part == "identity":  # the same shape, another workload group (or none)
            set_identity(variant["metadata"], draw(st.sampled_from(OWNERS)), draw(st.sampled_from(WORKLOAD_LABELS)))
        elif part == "others' annotations":
            variant["metadata"]["annotations"] = {"example.com/owner": "ana"}
        elif part == "sidecar":
            for init in variant["spec"].get("initContainers", []):
                init["restartPolicy"] = "Never" if init.get("restartPolicy") == "Always" else "Always"
        else:
            outer, field = part
            if field in other[outer]:
                variant[outer][field] = other[outer][field]
            else:
                variant[outer].pop(field, None)
        calls.append((variant, ns))
    return calls


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=near_duplicates_st())
def test_a_shared_shape_memo_never_changes_an_answer(calls: list[tuple[dict[str, Any], str]]) -> None:
    """The server remembers per Pod shape what the shape alone decides (webhook.admission.pod.PodShape).
    Through one memo
    that earlier, nearly identical Pods filled, every answer equals the one computed from scratch."""
    policy, index = demo_policy(), shared_demo_index()
    memo = Memo()
    for obj, namespace in calls:
        plain = evaluate(obj, namespace, policy, index)
        remembered = evaluate(obj, namespace, policy, index, shapes=memo)
        assert remembered == plain
        assert remembered.reasons == plain.reasons


class ColdAnswers:
    """What `evaluate` answers on a fresh index of a fleet, with no memo at all: the oracle the warm memos
    are held to. A fresh index answers a Pod the same whenever it is asked (evaluate only reads it), so
    each (fleet, Pod, namespace) is decided once per module: hypothesis' examples repeat fleets and Pods,
    and building a fresh index for each call was more than half of this module's time."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.fleets: dict[tuple[NodeEdit, ...], list[dict[str, Any]]] = {}
        self.answers: dict[tuple[tuple[NodeEdit, ...], bytes, str], Verdict] = {}

    def fleet(self, edits: list[NodeEdit]) -> list[dict[str, Any]]:
        """`edited_fleet(edits)`, made once per list of edits (building an index never changes it)."""
        key = tuple(edits)
        if key not in self.fleets:
            self.fleets[key] = edited_fleet(edits)
        return self.fleets[key]

    def __call__(self, edits: list[NodeEdit], obj: dict[str, Any], namespace: str) -> Verdict:
        key = (tuple(edits), orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), namespace)
        if key not in self.answers:
            fresh = build_index(self.fleet(edits), self.policy, "generated")
            self.answers[key] = evaluate(obj, namespace, self.policy, fresh)
        return self.answers[key]


COLD = ColdAnswers(twin_policy())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(NODE_EDITS, max_size=12), calls=near_duplicates_st() | one_field_apart_st())
def test_a_warm_memo_answers_as_a_cold_index_does(
    edits: list[NodeEdit], calls: list[tuple[dict[str, Any], str]]
) -> None:
    """The memos the server keeps (the shape memo of requests and patches, and the index's memo of plans
    per request) never change an answer: through one index and one shape memo that nearly identical
    Pods warmed up, every answer equals the one from a fresh index with no memo at all. A key missing a
    field the answer depends on (a toleration, a pool pin, a nodeSelector pin, a sidecar's
    restartPolicy...) makes two such Pods share an answer that only one of them should get. Pods of
    one shape in different workload groups (owner, workload label, gpupool.io/group) get their own
    group's answer, and every quota form (requests., bare, limits., class, GPU memory) is met."""
    policy = COLD.policy
    warm_index, memo = build_index(COLD.fleet(edits), policy, "generated"), Memo()
    for obj, namespace in calls:
        cold = COLD(edits, obj, namespace)
        warm = evaluate(obj, namespace, policy, warm_index, shapes=memo)
        event(f"group {'on a pool' if cold.group and cold.group.pool else 'without a pool' if cold.group else 'none'}")
        event(f"reason {cold.reason or cold.outcome}")
        assert warm == cold
        assert warm.reasons == cold.reasons
        # A denial that names a fix decided the Pod again with that value (its request remembered in the
        # shape memo, its plan in the index's): the Pod that follows the advice meets those memos warm.
        for key, value in named_fixes(cold.message):
            event("a fix named")
            fixed = with_annotation(obj, key, value)
            assert evaluate(fixed, namespace, policy, warm_index, shapes=memo) == COLD(edits, fixed, namespace)


def test_the_shape_memo_remembers_each_shape_once() -> None:
    """The second Pod of a shape (another name, other tools' annotations) adds nothing to the memo: its
    request and patch come from the first. Another shape adds its own request and patch."""
    policy, index, memo = demo_policy(), shared_demo_index(), Memo()
    first = pod("train-1", annotations={"gpupool.io/gpu-class": "low"})
    evaluate(first, "ml-train", policy, index, shapes=memo)
    assert len(memo) == 2  # the request, and the patch for the chosen pool
    replica = pod("train-2", annotations={"gpupool.io/gpu-class": "low", "example.com/run": "7"})
    assert evaluate(replica, "ml-train", policy, index, shapes=memo).placement is not None
    assert len(memo) == 2
    other = pod("infer", annotations={"gpupool.io/gpu-class": "low", "gpupool.io/gpu-count": "2"})
    evaluate(other, "ml-train", policy, index, shapes=memo)
    assert len(memo) == 4


def test_a_shared_shape_memo_tells_a_sidecar_from_an_init_container() -> None:
    """The one field of a shape that only changes the Pod's GPU total: an init container's restartPolicy
    (a sidecar's GPUs add to the main containers', a plain init container's do not)."""
    policy, index, memo = demo_policy(), shared_demo_index(), Memo()
    totals = []
    for restart in ("Always", "Never", "Always"):
        obj = pod(annotations={"gpupool.io/gpu-class": "low"}, gpus=1)
        obj["spec"]["initContainers"] = [
            {"name": "warm", "image": "x", "restartPolicy": restart, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]
        result = evaluate(obj, "ml-train", policy, index, shapes=memo)
        assert result.placement is not None, result.message
        totals.append(result.placement.pod_total)
    assert totals == [2, 1, 2]
