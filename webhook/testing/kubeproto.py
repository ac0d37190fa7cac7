"""The rules of the protocol that do not need a socket: Status bodies, query parameters, discovery.

Messages and codes follow kube-apiserver, so that a client's error handling meets what it would meet
in a cluster: 410 Expired, 504 for a resourceVersion from the future, 400 for contradictory
parameters, and the legacy rule that a resourceVersion with a limit means an exact read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from webhook.testing.kubefield import FieldError, aggregate
from webhook.testing.kubestore import Store, TooLarge

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter."
)


OPTIMISTIC_LOCK = "the object has been modified; please apply your changes to the latest version and try again"


def status_body(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A metav1.Status failure as kube-apiserver writes it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
    }
    if details:
        body["details"] = details
    body["code"] = code
    return body


class ApiError(Exception):
    """A request the API answers with a Status (before any body was sent)."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason  # None: the usual one for the code
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_body(self.code, self.message, self.reason, self.details)


# The errors of apimachinery's api/errors, built as kube-apiserver builds them. `resource` is the
# qualified resource (`pods`, `leases.coordination.k8s.io`): the plural and, outside core, the group.


def _details(resource: str, name: str) -> dict[str, Any]:
    plural, _, group = resource.partition(".")
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = plural
    return details


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, f'{resource} "{name}" not found', "NotFound", _details(resource, name))


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(409, f'{resource} "{name}" already exists', "AlreadyExists", _details(resource, name))


def conflict(resource: str, name: str, why: str = OPTIMISTIC_LOCK) -> ApiError:
    """409 Conflict: a resourceVersion (or uid) precondition that no longer holds."""
    return ApiError(
        409, f'Operation cannot be fulfilled on {resource} "{name}": {why}', "Conflict", _details(resource, name)
    )


def invalid(kind: str, group: str, name: str, errors: Sequence[FieldError]) -> ApiError:
    """422 Invalid, one cause per field error; `kind` is the object's kind (`Pod`) or, where
    kube-apiserver uses the resource instead, the resource (`leases`)."""
    qualified = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [{"reason": e.type, "message": e.body(), "field": e.field} for e in errors]
    return ApiError(422, f'{qualified} "{name}" is invalid: {aggregate(errors)}', "Invalid", details)


def unprocessable() -> ApiError:
    """NewGenericServerResponse(422): what a JSON Patch that cannot be applied gets (its own error is
    not part of the answer, exactly as kube-apiserver drops it)."""
    return ApiError(422, "the server rejected our request due to an error in our request", "Invalid", {})


def unsupported_media_type(accepted: Sequence[str]) -> ApiError:
    accepted_text = ", ".join(accepted)
    return ApiError(
        415, f"the body of the request was in an unknown format - accepted media types include: {accepted_text}"
    )


def int_param(query: dict[str, str], name: str) -> int:
    """A non-negative integer parameter (0 when absent); 400 otherwise."""
    text = query.get(name, "")
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"invalid {name}: {text!r}") from None
    if value < 0:
        raise ApiError(400, f"invalid {name}: {text!r}")
    return value


def parse_rv(text: str) -> int:
    """A resourceVersion as the number it is here (real ones are opaque strings); 400 otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f'invalid resource version "{text}"') from None
    if value < 1:
        raise ApiError(400, f'invalid resource version "{text}"')
    return value


def list_rv(store: Store, query: dict[str, str], limit: int) -> int | None:
    """The revision a list without a continue token is served at (None: the newest), following the
    API's rules for resourceVersion and resourceVersionMatch."""
    text = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    if match not in ("", "Exact", "NotOlderThan"):
        raise ApiError(400, f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"')
    if not text:
        if match:
            raise ApiError(400, "resourceVersionMatch is forbidden unless resourceVersion is provided")
        return None
    if text == "0":
        if match == "Exact":
            raise ApiError(400, 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
        return None
    wanted = parse_rv(text)
    # Legacy rule: a resourceVersion with a limit and no match is an exact read.
    if match == "Exact" or (not match and limit > 0):
        return wanted
    if wanted > store.rv:
        raise TooLarge(f"Too large resource version: {wanted}, current: {store.rv}")
    return None


def version_doc() -> dict[str, Any]:
    return {
        "major": "1",
        "minor": "31",
        "gitVersion": "v1.31.0-kubesim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.22.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions_doc(port: int) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{port}"}],
    }
