"""Tests for webhook.admission.fence and its use by the validating call: a release commits only while the
leader its token names holds the queue's Lease in that term (the end-to-end reproduction with two replicas
and a held write is tests/queue/test_fence_e2e.py)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch
import pytest

from tests.builders import fleet, index_of, pod, policy
from webhook.admission.core import Admitter
from webhook.admission.fence import RELEASED_BY, LeaseTerm, judge, parse_token, token
from webhook.admission.patch import with_token
from webhook.admission.pod import read_pod
from webhook.admission.validation import Caller, Trusted, Validator
from webhook.domain.model import QUEUE_GATE
from webhook.sources.snapshot import SnapshotInventory

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
GPUPOOL = Caller("system:serviceaccount:gpupool-system:gpupool-webhook")
ONCALL = Caller("carol", ("system:authenticated", "oncall"))
Obj = dict[str, Any]


def lease(holder: str = "replica-a-7", term: int = 3, renewed: float = 2.0, duration: int = 15) -> LeaseTerm:
    return LeaseTerm(holder, term, NOW - timedelta(seconds=renewed), duration)


def test_the_token_of_the_leader_in_its_term_passes() -> None:
    assert parse_token(token("replica-a-7", 3)) == ("replica-a-7", 3)
    assert judge(token("replica-a-7", 3), lease(), NOW) is None


@pytest.mark.parametrize(
    ("current", "why"),
    [
        (lease(holder="replica-b-9", term=4), "held by replica-b-9 in term 4 now, not by replica-a-7 in term 3"),
        (lease(term=4), "in term 4 now"),  # the same replica took it again after another: a new term
        (lease(holder=""), "held by nobody"),
        (lease(renewed=15.0), "expired"),
        (None, "does not exist"),
    ],
)
def test_a_token_whose_term_is_over_is_refused_saying_why(current: LeaseTerm | None, why: str) -> None:
    found = judge(token("replica-a-7", 3), current, NOW)
    assert found is not None and why in found


@pytest.mark.parametrize("text", ["", "replica-a-7", "replica-a-7/", "/3", "replica-a-7/x", "a/" + "9" * 400])
def test_a_malformed_token_is_refused(text: str) -> None:
    assert judge(text, lease(), NOW) == f"{RELEASED_BY} is not <holder>/<term>"


class Fence:
    def __init__(self, current: LeaseTerm | None) -> None:
        self.current, self.calls = current, 0

    def check(self, text: str) -> str | None:
        self.calls += 1
        return judge(text, self.current, NOW)


def validator(fence: Fence | None) -> Validator:
    pol = policy()
    admitter = Admitter(pol, SnapshotInventory(index_of(fleet(), pol), "test"))
    return Validator(admitter, Trusted.of("gpupool-system", "gpupool-webhook", groups=["oncall"]), fence)


def queued() -> Obj:
    obj = pod("train-0", "ml", annotations={"gpupool.io/gpu-class": "medium"}, gpus=1)
    obj["spec"]["schedulingGates"] = [{"name": QUEUE_GATE}]
    return obj


def released(old: Obj, text: str | None) -> Obj:
    """The release as the leader sends it (a few of its ops), with its token when `text` is given."""
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/metadata/annotations/gpupool.io~1pool", "value": "nvidia/medium/Tesla-T4"},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    if text is not None:
        ops = with_token(ops, read_pod(old, "ml").shape, text)
    return jsonpatch.apply_patch(copy.deepcopy(old), ops)


def test_the_leaders_release_passes_and_one_of_an_ended_term_is_refused() -> None:
    fence = Fence(lease())
    check = validator(fence)
    old = queued()
    assert check.validate_update(
        released(old, token("replica-a-7", 3)), old, namespace="ml", caller=GPUPOOL
    ).verdict.allowed
    late = check.validate_update(released(old, token("replica-a-7", 2)), old, namespace="ml", caller=GPUPOOL).verdict
    assert (late.allowed, late.code, late.reason) == (False, 403, "fenced")
    assert "names a leader whose term is over" in late.message and "in term 3 now" in late.message
    assert fence.calls == 2


def test_a_release_by_hand_carries_no_token_and_is_not_fenced() -> None:
    """An admin acting as gpupool (or a trusted group) in an emergency: no leader decided it."""
    fence = Fence(None)
    old = queued()
    for caller in (GPUPOOL, ONCALL):
        assert validator(fence).validate_update(released(old, None), old, namespace="ml", caller=caller).verdict.allowed
    assert fence.calls == 0


def test_a_tenant_cannot_forge_a_token() -> None:
    """The token is a gpupool.io/ annotation and the gate gpupool's: a tenant's release is refused as ever."""
    fence = Fence(lease())
    old = queued()
    answer = (
        validator(fence)
        .validate_update(released(old, token("replica-a-7", 3)), old, namespace="ml", caller=Caller("alice"))
        .verdict
    )
    assert (answer.allowed, answer.reason) == (False, "guarded")
    assert f"annotation {RELEASED_BY} (added)" in answer.message


def test_a_replica_with_no_lease_to_read_refuses_a_fenced_release() -> None:
    old = queued()
    answer = (
        validator(None)
        .validate_update(released(old, token("replica-a-7", 3)), old, namespace="ml", caller=GPUPOOL)
        .verdict
    )
    assert (answer.allowed, answer.reason) == (False, "fenced")
    assert "no Kubernetes API to read the queue's Lease from" in answer.message


@pytest.mark.parametrize("annotations", [None, {}, {"gpupool.io/gpu-class": "medium"}])
def test_the_token_is_written_whatever_annotations_the_pod_has(annotations: dict[str, str] | None) -> None:
    obj = pod("p", "ml", annotations={"gpupool.io/gpu-class": "medium"})
    if annotations is None:
        del obj["metadata"]["annotations"]
    else:
        obj["metadata"]["annotations"] = annotations
    shape = read_pod(obj, "ml").shape
    pool_op = {"op": "add", "path": "/metadata/annotations/gpupool.io~1pool", "value": "x"}
    whole = {"op": "add", "path": "/metadata/annotations", "value": {"gpupool.io/pool": "x"}}
    ops = [whole] if annotations is None else [pool_op]
    out = jsonpatch.apply_patch(copy.deepcopy(obj), with_token(ops, shape, "r/1"))
    assert out["metadata"]["annotations"][RELEASED_BY] == "r/1"
    assert out["metadata"]["annotations"]["gpupool.io/pool"] == "x"
