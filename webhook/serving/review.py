"""AdmissionReview in and out: decoding, the per-request-kind rules, and the response, without HTTP.

Two error families are kept apart, as kube-apiserver sees them:
- `ReviewError`: the webhook call itself is malformed (not JSON, no `request`, no `uid`). It becomes an
  HTTP 4xx with a Kubernetes `Status` body, and kube-apiserver applies the webhook's failurePolicy.
- A Verdict with `allowed: false`: the call has a uid to answer and the Pod is refused, including a Pod
  that is itself malformed (code 400); it is an HTTP 200 AdmissionReview whose `response.status`
  carries the code and message shown to the user, whatever the failurePolicy.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from webhook.admission.audit import AUDIT_PREFIX
from webhook.admission.verdict import Verdict, allow
from webhook.domain.quantity import shown
from webhook.pools.kubeobj import as_map

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
EPHEMERAL_CONTAINERS = "ephemeralcontainers"  # the Pod subresource that adds ephemeral containers
AUDIT_POOL_KEY = "pool"  # kube-apiserver prefixes it with the webhook's name: "<webhook>/pool"
MAX_WARNING_CHARS = 120  # longer warnings are cut by kubectl users' terminals and by the API server
MAX_MESSAGE_CHARS = 2048  # a denial's message; the core's are shorter, this only bounds the unforeseen
# Audit mode's warnings (webhook.admission.audit) carry a whole denial's message, so they keep to the
# message's bound: kube-apiserver cuts warnings to 256 characters only past 4 KiB of them in one answer.
_ELLIPSIS = "..."  # ASCII: warnings travel in HTTP Warning headers


class ReviewError(ValueError):
    """The webhook request is malformed; answered with HTTP `status` and a Kubernetes Status body."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class AdmissionRequest(NamedTuple):
    """The fields of `AdmissionReview.request` that gpupool looks at. (This and PodRef are NamedTuples:
    both are built for every call, and a frozen dataclass costs several times more to build.)"""

    api_version: str
    uid: str
    group: str  # of the resource, "" for core
    resource: str  # e.g. "pods"
    sub_resource: str  # e.g. "status", "" for the object itself
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    namespace: str  # request.namespace, "" for cluster-scoped objects
    dry_run: bool
    object: Any  # the Pod as sent (the core checks it), None when absent
    old_object: Any = None  # on an UPDATE, the object before it
    username: str = ""  # request.userInfo: who makes the request (the validating call's UPDATE check)
    groups: tuple[str, ...] = ()

    @property
    def is_pod_create(self) -> bool:
        return self.group == "" and self.resource == "pods" and not self.sub_resource and (self.operation == "CREATE")

    @property
    def is_pod_update(self) -> bool:
        """An UPDATE (or PATCH) of a Pod itself, not of a subresource such as pods/status."""
        return self.group == "" and self.resource == "pods" and not self.sub_resource and (self.operation == "UPDATE")

    @property
    def is_ephemeral_update(self) -> bool:
        """An update of pods/ephemeralcontainers (`kubectl debug`): the object is the whole Pod."""
        return (
            self.group == ""
            and self.resource == "pods"
            and self.sub_resource == EPHEMERAL_CONTAINERS
            and self.operation == "UPDATE"
        )


class PodRef(NamedTuple):
    """What the log line calls the Pod: its name, or its generateName prefix before it has a name."""

    namespace: str
    name: str


def parse_review(body: bytes) -> AdmissionRequest:
    """Decode an AdmissionReview (v1 or v1beta1); ReviewError when it is not one."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ReviewError(f"the body is not JSON: {exc}") from None
    if not isinstance(review, dict):
        raise ReviewError("the body is not a JSON object")
    api_version = review.get("apiVersion")
    if review.get("kind") != "AdmissionReview" or api_version not in API_VERSIONS:
        raise ReviewError(
            f"expected kind AdmissionReview with apiVersion {' or '.join(API_VERSIONS)}, "
            f"got kind {shown(review.get('kind'))}, apiVersion {shown(api_version)}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("the AdmissionReview request has no uid")
    resource = request.get("resource")
    resource = resource if isinstance(resource, dict) else {}
    obj = request.get("object")
    user = request.get("userInfo")
    user = user if isinstance(user, dict) else {}
    groups = user.get("groups")
    return AdmissionRequest(
        api_version=api_version,
        uid=uid,
        group=_text(resource.get("group")),
        resource=_text(resource.get("resource")),
        sub_resource=_text(request.get("subResource")),
        operation=_text(request.get("operation")),
        namespace=_text(request.get("namespace")),
        dry_run=request.get("dryRun") is True,
        object=obj,
        old_object=request.get("oldObject"),
        username=_text(user.get("username")),
        groups=tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else (),
    )


def pod_ref(request: AdmissionRequest) -> PodRef:
    """The Pod's namespace (the object's, else the request's) and name (else its generateName), as the
    log line and metrics name it: read defensively from the raw object, since the core may refuse it."""
    meta = _metadata(request.object)
    name = _text(meta.get("name")) or _text(meta.get("generateName"))
    return PodRef(namespace=_text(meta.get("namespace")) or request.namespace, name=name)


def skip_verdict(request: AdmissionRequest) -> Verdict | None:
    """The answer for a request that is neither a Pod CREATE nor an update of pods/ephemeralcontainers
    (only those are gpupool's business), or None when the core must decide. Whatever is wrong with the
    Pod itself (no object, no namespace, a field of the wrong type) is the core's to answer in the
    review, with the request's uid: an HTTP error would let the Pod through unchecked under
    failurePolicy Ignore."""
    if not (request.is_pod_create or request.is_ephemeral_update):
        sub = f"/{request.sub_resource}" if request.sub_resource else ""
        return allow(f"not a Pod CREATE ({shorten(request.operation, 40)} {shorten(request.resource, 60) or '?'}{sub})")
    return None


def validate_skip_verdict(request: AdmissionRequest) -> Verdict | None:
    """For the validating call: the answer for a request that is neither a Pod CREATE nor an UPDATE of a
    Pod itself (only those are checked), or None when the core must decide."""
    if not (request.is_pod_create or request.is_pod_update):
        sub = f"/{request.sub_resource}" if request.sub_resource else ""
        operation, resource = shorten(request.operation, 40), shorten(request.resource, 60) or "?"
        return allow(f"not a Pod CREATE or UPDATE ({operation} {resource}{sub})")
    return None


def response_body(request: AdmissionRequest, verdict: Verdict) -> bytes:
    """The AdmissionReview answer, in the request's apiVersion."""
    response: dict[str, Any] = {"uid": request.uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "message": shorten(verdict.message, MAX_MESSAGE_CHARS)}
    elif verdict.patch:
        # Only when non-empty: kube-apiserver rejects patchType without a patch and vice versa.
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(verdict.patch)).decode("ascii")
    if verdict.warnings:
        response["warnings"] = [
            shorten_warning(w, MAX_MESSAGE_CHARS if w.startswith(AUDIT_PREFIX) else MAX_WARNING_CHARS)
            for w in verdict.warnings
        ]
    if verdict.placement is not None:
        response["auditAnnotations"] = {AUDIT_POOL_KEY: str(verdict.placement.pool)}
    return orjson.dumps({"apiVersion": request.api_version, "kind": "AdmissionReview", "response": response})


def error_body(request: AdmissionRequest, error_id: str) -> bytes:
    """A well-formed refusal for an unexpected failure: the user sees the id to quote to the admin."""
    message = f"gpupool internal error (error id {error_id}); the webhook log has the details"
    return orjson.dumps(
        {
            "apiVersion": request.api_version,
            "kind": "AdmissionReview",
            "response": {"uid": request.uid, "allowed": False, "status": {"code": 500, "message": message}},
        }
    )


def status_body(code: int, message: str, reason: str) -> bytes:
    """A Kubernetes `Status` (metav1): kube-apiserver's client shows its message in the call's error."""
    return orjson.dumps(
        {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    )


def shorten(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, marked with "..." when cut."""
    return text if len(text) <= limit else text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


def shorten_warning(text: str, limit: int = MAX_WARNING_CHARS) -> str:
    """`text` cut to `limit` characters at a word boundary, marked with "..." when cut."""
    text = " ".join(text[: 4 * limit].split())  # one line; never split megabytes to keep 120 characters
    if len(text) <= limit:
        return text
    room = limit - len(_ELLIPSIS)
    cut = text.rfind(" ", 0, room + 1)
    if cut < room // 2:  # no space in the last half: cut inside the word rather than lose half
        cut = room
    return text[:cut].rstrip(" ,;:") + _ELLIPSIS


def _metadata(obj: Any) -> Mapping[str, Any]:
    return as_map(obj.get("metadata")) if isinstance(obj, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
