"""Kubernetes RBAC, written from its rules (not from gpupool's code), as the oracle for which requests the
rendered manifests let gpupool's ServiceAccount make: a request's attributes read from its method and URL
as kube-apiserver's RequestInfo reads them, and the RBAC authorizer's answer for them.

- A ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding grants its Role's (or a
  ClusterRole's) rules in its own namespace only, so never on cluster-scoped objects.
- A rule matches when its apiGroups, resources and verbs name the request's (or `*`), and, when it has
  resourceNames, the request names one of them (so never a list, a watch or a create).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Request:
    verb: str
    group: str
    resource: str  # "pods", or "pods/status" for a subresource
    namespace: str | None
    name: str | None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource} {self.name or '(all)'}{where}"


def request_of(method: str, url: str) -> Request:
    """The RBAC attributes of one API request (`/api/v1/...` or `/apis/<group>/<version>/...`, with its query)."""
    split = urlsplit(url)
    parts = [p for p in split.path.split("/") if p]
    query = {k: v[-1] for k, v in parse_qs(split.query).items()}
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"]:
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"not a resource request: {method} {url}")
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in ("1", "true") else "list")
    else:
        verb = _VERBS[method]
    return Request(verb, group, resource, namespace, name)


def _names(values: Iterable[str], value: str) -> bool:
    return "*" in values or value in values


def _matches(rule: Mapping[str, Any], request: Request) -> bool:
    if not (
        _names(rule.get("apiGroups", []), request.group)
        and _names(rule.get("resources", []), request.resource)
        and _names(rule.get("verbs", []), request.verb)
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or (request.name is not None and request.name in names)


def _binds(binding: Mapping[str, Any], namespace: str, account: str) -> bool:
    """Whether the binding names the ServiceAccount, or a group every ServiceAccount (of its namespace) is in."""
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
    for subject in binding.get("subjects") or []:
        if subject["kind"] == "ServiceAccount" and (subject["namespace"], subject["name"]) == (namespace, account):
            return True
        if subject["kind"] == "Group" and subject["name"] in groups:
            return True
    return False


def allowed(objects: Iterable[Mapping[str, Any]], namespace: str, account: str, request: Request) -> bool:
    """Whether RBAC, as `objects` (rendered manifests) configure it, lets ServiceAccount `namespace/account`
    make `request`."""
    objects = list(objects)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding") or not _binds(binding, namespace, account):
            continue
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        if binding["kind"] == "RoleBinding" and request.namespace != where:
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else None, ref["name"]))
        if role is not None and any(_matches(rule, request) for rule in role.get("rules") or []):
            return True
    return False
