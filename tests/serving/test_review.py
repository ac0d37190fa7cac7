"""Tests for webhook.serving.review: decoding AdmissionReviews, the per-request-kind rules, the response contract."""

from __future__ import annotations

import base64
from typing import Any

import jsonpatch
import orjson
import pytest

from tests.conftest import admission_review, gpu_pod
from webhook.admission.pieces import NO_PATCH, AnnotationsAdded, PodPatch, SelectorAdded
from webhook.admission.verdict import Placement, allow, deny, place
from webhook.domain.model import PoolKey
from webhook.serving.review import (
    MAX_WARNING_CHARS,
    ReviewError,
    error_body,
    parse_review,
    pod_ref,
    response_body,
    shorten_warning,
    skip_verdict,
    status_body,
)

POOL = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
PATCH = [
    {"op": "add", "path": "/spec/nodeSelector", "value": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
    {"op": "add", "path": "/metadata/annotations/gpupool.io~1pool", "value": str(POOL)},
]
PIECES = PodPatch(  # PATCH, piece by piece, as webhook.admission.patch builds it
    (
        SelectorAdded((("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),), PATCH[0]),
        AnnotationsAdded((("gpupool.io/pool", str(POOL)),), PATCH[1]),
    )
)


def placement() -> Placement:
    return Placement(POOL, "nvidia.com/gpu", 1, 1, (("nvidia.com/gpu.product", POOL.product),), True, False)


def parse(review: dict[str, Any]) -> Any:
    return parse_review(orjson.dumps(review))


def answer(review: dict[str, Any], verdict: Any) -> dict[str, Any]:
    result: dict[str, Any] = orjson.loads(response_body(parse(review), verdict))
    return result


class TestParseReview:
    @pytest.mark.parametrize(
        ("body", "words"),
        [
            pytest.param(b"{not json", "not JSON", id="not-json"),
            pytest.param(b"", "not JSON", id="empty"),
            pytest.param(b"[1, 2]", "not a JSON object", id="array"),
            pytest.param(b'{"kind": "Pod", "apiVersion": "v1"}', "expected kind AdmissionReview", id="not-a-review"),
            pytest.param(
                b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v2", "request": {"uid": "x"}}',
                "apiVersion",
                id="unknown-version",
            ),
            pytest.param(
                b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}', "no request", id="no-request"
            ),
            pytest.param(
                b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}',
                "no uid",
                id="no-uid",
            ),
            pytest.param(
                b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 7}}',
                "no uid",
                id="uid-not-a-string",
            ),
        ],
    )
    def test_malformed_call_is_a_400_review_error(self, body: bytes, words: str) -> None:
        """Anything that is not an AdmissionReview with a request uid is refused as a bad call (400)."""
        with pytest.raises(ReviewError, match=words) as info:
            parse_review(body)
        assert info.value.status == 400

    def test_fields_of_a_pod_create(self) -> None:
        """The fields the rules use are read from request: uid, resource, operation, namespace, dryRun."""
        req = parse(admission_review(gpu_pod(), uid="abc", dry_run=True, namespace="ml"))
        assert (req.uid, req.resource, req.operation, req.namespace, req.dry_run) == (
            "abc",
            "pods",
            "CREATE",
            "ml",
            True,
        )
        assert req.is_pod_create

    def test_v1beta1_is_accepted(self) -> None:
        """admission.k8s.io/v1beta1 reviews are decoded like v1 ones."""
        assert parse(admission_review(gpu_pod(), api_version="admission.k8s.io/v1beta1")).is_pod_create

    def test_an_update_carries_the_old_object_and_who_makes_it(self) -> None:
        """For the validating call's UPDATE check: oldObject, userInfo.username and its groups (strings
        only; anything else in userInfo reads as nobody, never an error)."""
        review = admission_review(gpu_pod(), operation="UPDATE")
        review["request"]["oldObject"] = gpu_pod("before")
        review["request"]["userInfo"] = {"username": "bob", "groups": ["oncall", 7, "system:authenticated"]}
        req = parse(review)
        assert req.is_pod_update and not req.is_pod_create
        assert (req.old_object["metadata"]["name"], req.username, req.groups) == (
            "before",
            "bob",
            ("oncall", "system:authenticated"),
        )
        for odd in ({"username": 5, "groups": "oncall"}, "bob", None):
            review["request"]["userInfo"] = odd
            assert (parse(review).username, parse(review).groups) == ("", ())
        assert not parse(admission_review(gpu_pod(), operation="UPDATE", sub_resource="status")).is_pod_update


class TestSkipVerdict:
    @pytest.mark.parametrize(
        "review",
        [
            pytest.param(admission_review(gpu_pod(), operation="UPDATE"), id="update"),
            pytest.param(admission_review(gpu_pod(), operation="DELETE"), id="delete"),
            pytest.param(admission_review(gpu_pod(), sub_resource="status"), id="status-subresource"),
            pytest.param(admission_review(gpu_pod(), sub_resource="binding"), id="binding-subresource"),
            pytest.param(
                admission_review(gpu_pod(), sub_resource="ephemeralcontainers", operation="CREATE"),
                id="ephemeralcontainers-create",
            ),
            pytest.param(admission_review({"kind": "ConfigMap"}, resource="configmaps"), id="configmap"),
            pytest.param(
                admission_review({"kind": "Deployment"}, resource="deployments", group="apps"), id="deployment"
            ),
        ],
    )
    def test_anything_but_a_pod_create_is_allowed_unchanged(self, review: dict[str, Any]) -> None:
        """Other resources, operations and subresources (ephemeralcontainers but on UPDATE) never reach the
        core and get no patch."""
        verdict = skip_verdict(parse(review))
        assert verdict is not None
        assert (verdict.allowed, verdict.outcome, verdict.patch) == (True, "unchanged", ())

    @pytest.mark.parametrize(
        "obj",
        [
            gpu_pod(),
            gpu_pod(annotations={"kubernetes.io/config.mirror": "abc123"}),
            gpu_pod(node_name="gpu-node-7"),
            gpu_pod(namespace=None),
            None,
        ],
        ids=["gpu-pod", "mirror", "bound", "no-namespace", "no-object"],
    )
    def test_every_pod_create_goes_to_the_core(self, obj: dict[str, Any] | None) -> None:
        """Whatever the Pod (mirror, bound, even missing or without a namespace), a Pod CREATE is the
        core's to answer in the review with its uid: an HTTP error instead would let the Pod through
        unplaced under failurePolicy Ignore."""
        assert skip_verdict(parse(admission_review(obj, namespace=""))) is None

    def test_an_ephemeral_containers_update_goes_to_the_core_with_the_pod_before_it(self) -> None:
        """`kubectl debug` updates pods/ephemeralcontainers, sending the whole Pod and the Pod before: the
        core holds the containers it adds to the NVIDIA_VISIBLE_DEVICES rule."""
        review = admission_review(gpu_pod(), operation="UPDATE", sub_resource="ephemeralcontainers")
        review["request"]["oldObject"] = gpu_pod(name="before")
        request = parse(review)
        assert skip_verdict(request) is None
        assert (request.is_ephemeral_update, request.is_pod_create) == (True, False)
        assert request.old_object["metadata"]["name"] == "before"


class TestPodRef:
    def test_namespace_comes_from_the_request_when_the_object_has_none(self) -> None:
        """At CREATE the object often has no namespace; request.namespace is the one it gets."""
        ref = pod_ref(parse(admission_review(gpu_pod(namespace=None), namespace="team-a")))
        assert ref.namespace == "team-a"

    def test_generate_name_stands_in_for_the_name(self) -> None:
        """A Pod with only generateName (from a Job or ReplicaSet) is named by that prefix."""
        ref = pod_ref(parse(admission_review(gpu_pod(name=None, generate_name="train-"))))
        assert ref.name == "train-"


class TestResponseBody:
    def test_mutation_carries_uid_patch_type_base64_patch_and_audit_pool(self) -> None:
        """Same apiVersion/kind, uid echoed, patchType JSONPatch with a base64 patch, audit annotation."""
        review = admission_review(gpu_pod(), uid="uid-1")
        result = answer(review, place(placement(), PIECES))
        assert (result["apiVersion"], result["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        response = result["response"]
        assert (response["uid"], response["allowed"], response["patchType"]) == ("uid-1", True, "JSONPatch")
        assert orjson.loads(base64.b64decode(response["patch"])) == PATCH
        assert response["auditAnnotations"] == {"pool": "nvidia/high/NVIDIA-A100-SXM4-40GB"}
        assert "status" not in response

    def test_patch_applies_to_the_pod(self) -> None:
        """The decoded patch applies to the Pod that was sent (as kube-apiserver will apply it)."""
        pod = gpu_pod()
        response = answer(admission_review(pod), place(placement(), PIECES))["response"]
        patched = jsonpatch.apply_patch(pod, orjson.loads(base64.b64decode(response["patch"])))
        assert patched["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}

    def test_v1beta1_is_answered_in_v1beta1(self) -> None:
        """kube-apiserver requires the answer in the request's apiVersion."""
        result = answer(admission_review(gpu_pod(), api_version="admission.k8s.io/v1beta1"), allow())
        assert result["apiVersion"] == "admission.k8s.io/v1beta1"

    def test_unchanged_has_no_patch_fields(self) -> None:
        """No patch means neither patch nor patchType (kube-apiserver rejects one without the other)."""
        response = answer(admission_review(gpu_pod()), allow("not a GPU Pod"))["response"]
        assert response == {"uid": response["uid"], "allowed": True}

    def test_placed_without_change_keeps_the_audit_pool_but_has_no_patch(self) -> None:
        """A reinvoked, already placed Pod: no patch, but the audit log still names the pool."""
        response = answer(admission_review(gpu_pod()), place(placement(), NO_PATCH))["response"]
        assert "patch" not in response and "patchType" not in response
        assert response["auditAnnotations"] == {"pool": str(POOL)}

    def test_denial_has_status_code_and_message(self) -> None:
        """A refusal says why with status {code, message} and carries no patch."""
        response = answer(admission_review(gpu_pod()), deny("no pool has 80Gi per GPU", code=403))["response"]
        assert response["allowed"] is False
        assert response["status"] == {"code": 403, "message": "no pool has 80Gi per GPU"}
        assert "patch" not in response

    def test_warnings_are_at_most_120_characters(self) -> None:
        """Every warning fits kubectl's line: long ones are shortened, short ones kept as they are."""
        long = "no free capacity in pool nvidia/high/NVIDIA-A100-SXM4-40GB " * 5
        verdict = place(placement(), PIECES, warnings=("fallback to class high", long))
        warnings = answer(admission_review(gpu_pod()), verdict)["response"]["warnings"]
        assert warnings[0] == "fallback to class high"
        assert len(warnings[1]) <= MAX_WARNING_CHARS and warnings[1].endswith("...")

    def test_error_body_is_a_refusal_with_code_500_and_the_error_id(self) -> None:
        """An internal error still answers: allowed false, code 500, the error id in the message."""
        result = orjson.loads(error_body(parse(admission_review(gpu_pod(), uid="u9")), "deadbeef0001"))
        response = result["response"]
        assert (response["uid"], response["allowed"], response["status"]["code"]) == ("u9", False, 500)
        assert "deadbeef0001" in response["status"]["message"]

    def test_status_body_is_a_kubernetes_status(self) -> None:
        """Malformed calls are answered with a metav1 Status, which kube-apiserver's client decodes."""
        status = orjson.loads(status_body(400, "the body is not JSON", "BadRequest"))
        assert status == {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": "the body is not JSON",
            "reason": "BadRequest",
            "code": 400,
        }


class TestShortenWarning:
    def test_short_text_is_unchanged(self) -> None:
        """A warning within the limit is returned as it is."""
        assert shorten_warning("pool full, admitted anyway") == "pool full, admitted anyway"

    def test_cut_at_a_word_boundary(self) -> None:
        """A long warning is cut between words and marked with an ellipsis."""
        text = "word " * 40
        short = shorten_warning(text, limit=22)
        assert short == "word word word word..."

    def test_a_single_long_token_is_cut_inside(self) -> None:
        """Without a space to cut at, the text is cut at the limit rather than dropped."""
        short = shorten_warning("x" * 300)
        assert short == "x" * (MAX_WARNING_CHARS - 3) + "..."

    def test_newlines_become_spaces(self) -> None:
        """A warning is one line."""
        assert shorten_warning("first line\nsecond  line") == "first line second line"
