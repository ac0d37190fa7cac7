"""The rules of the protocol that do not need a socket: Status bodies, query parameters, discovery.

Messages and codes follow kube-apiserver, so that a client's error handling meets what it would meet
in a cluster: 410 Expired, 504 for a resourceVersion from the future, 400 for contradictory
parameters, and the legacy rule that a resourceVersion with a limit means an exact read.
"""

from __future__ import annotations

from typing import Any

from webhook.testing.kubestore import KINDS, Store, TooLarge

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
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


def status_body(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    """A metav1.Status failure as kube-apiserver writes it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }


class ApiError(Exception):
    """A request the API answers with a Status (before any body was sent)."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason  # None: the usual one for the code


def reject_selectors(query: dict[str, str]) -> None:
    """400 for label and field selectors, which the simulator does not implement."""
    # Silently ignoring a selector would return more than the client asked for.
    for name in ("labelSelector", "fieldSelector"):
        if query.get(name):
            raise ApiError(400, f"kubesim does not support {name}")


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


def resource_list_doc() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": k.plural,
                "singularName": k.kind.lower(),
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "list", "watch"],
            }
            for k in KINDS
        ],
    }
