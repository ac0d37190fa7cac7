"""The resources the simulator serves, by API group: one registry for routing, discovery and conversion.

core/v1 nodes, pods, resourcequotas, events and configmaps; coordination.k8s.io/v1 leases; events.k8s.io/v1
events, which are, as in kube-apiserver, a second view of the core Events (one stored object, two
shapes: `regarding`/`note` there, `involvedObject`/`message` here); gpupool.io/v1alpha1 gpupools, gpupool's
own CustomResource. A request path is turned into a `Target` (resource, namespace, name, and the `status`
subresource of the kinds that have one) by `parse_path`; anything else is 404, as the real API answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.testing.kubeproto import ApiError
from webhook.testing.kubestore import Kind, kind_of

Obj = dict[str, Any]
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
# The patch types kube-apiserver accepts for built-in resources (server-side apply is not simulated).
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)


@dataclass(frozen=True, slots=True)
class Resource:
    """A served endpoint: `/api/v1/…/pods` or `/apis/coordination.k8s.io/v1/…/leases`."""

    group: str  # "" for core
    version: str
    kind: Kind  # what is stored
    to_view: Callable[[Obj], Obj] | None = None  # stored object -> this version's shape
    from_view: Callable[[Obj], Obj] | None = None  # this version's shape -> stored object

    @property
    def plural(self) -> str:
        return self.kind.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The group resource as errors name it: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def event_prefix(self) -> bytes:
        return b'{"kind":"' + self.kind.kind.encode() + b'","apiVersion":"' + self.api_version.encode() + b'",'

    def render(self, stored: bytes) -> bytes:
        """A stored body (`{"metadata":…}`) as this resource serves it: with kind and apiVersion."""
        if self.to_view is None:
            return self.event_prefix + stored[1:]
        return self.event_prefix + orjson.dumps(self.to_view(orjson.loads(stored)))[1:]

    def render_item(self, stored: bytes) -> bytes:
        """A stored body as a list item (lists leave kind and apiVersion out of their items)."""
        return stored if self.to_view is None else orjson.dumps(self.to_view(orjson.loads(stored)))


# -- events.k8s.io/v1 <-> core/v1 Events (pkg/apis/events/v1 conversion) ------------------------------

# events.k8s.io/v1 field -> core/v1 field; the others have one name in both.
_EVENT_FIELDS = {
    "regarding": "involvedObject",
    "note": "message",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
    "reportingController": "reportingComponent",
}
_CORE_FIELDS = {v: k for k, v in _EVENT_FIELDS.items()}


def event_to_events_v1(core: Obj) -> Obj:
    view = {_CORE_FIELDS.get(k, k): v for k, v in core.items() if k not in ("kind", "apiVersion")}
    view.setdefault("eventTime", None)  # a MicroTime without omitempty: null for a core-style Event
    return view


def event_from_events_v1(view: Obj) -> Obj:
    return {_EVENT_FIELDS.get(k, k): v for k, v in view.items() if k not in ("kind", "apiVersion")}


RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", kind_of("nodes")),
    Resource("", "v1", kind_of("pods")),
    Resource("", "v1", kind_of("resourcequotas")),
    Resource("", "v1", kind_of("events")),
    Resource("", "v1", kind_of("configmaps")),
    Resource("coordination.k8s.io", "v1", kind_of("leases")),
    Resource("events.k8s.io", "v1", kind_of("events"), event_to_events_v1, event_from_events_v1),
    Resource("gpupool.io", "v1alpha1", kind_of("gpupools")),
)
# Kinds with a `status` subresource: a write there changes only the status, a write of the object
# itself leaves the status as it was (their registry strategies' PrepareForUpdate).
STATUS_SUBRESOURCE = frozenset(("Node", "ResourceQuota", "GPUPool"))
_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
_GROUPS = sorted({r.group for r in RESOURCES if r.group})


def resource_for(kind: Kind) -> Resource:
    """The resource that serves a stored kind in its own API version."""
    return next(r for r in RESOURCES if r.kind is kind and r.to_view is None)


@dataclass(frozen=True, slots=True)
class Target:
    """What a resource request names: a collection (name None), in a namespace or across all."""

    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None = None  # "status", or None for the object itself


def parse_path(parts: list[str]) -> Target | None:
    """The resource request of a path split at "/", or None when the path is not one (discovery, or
    nothing served). 404 for a namespaced name asked for without its namespace and the reverse."""
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    if rest[:1] == ["namespaces"] and len(rest) in (3, 4, 5):
        namespace, rest = rest[1], rest[2:]
    if len(rest) not in (1, 2, 3):
        return None
    resource = _BY_PATH.get((group, version, rest[0]))
    if resource is None:
        return None
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else None
    namespaced = resource.kind.namespaced
    if (namespace is not None and not namespaced) or (name is not None and namespaced and namespace is None):
        raise ApiError(404, "the server could not find the requested resource")
    if subresource is not None and (subresource != "status" or resource.kind.kind not in STATUS_SUBRESOURCE):
        raise ApiError(404, "the server could not find the requested resource")
    return Target(resource, namespace, name, subresource)


# -- discovery ----------------------------------------------------------------------------------------


def resource_list_doc(group: str, version: str) -> Obj | None:
    """The APIResourceList of /api/v1 or /apis/GROUP/VERSION; None when the group version is not served."""
    served = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not served:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": served[0].api_version,
        "resources": [
            *(
                {
                    "name": r.plural,
                    "singularName": r.kind.kind.lower(),
                    "namespaced": r.kind.namespaced,
                    "kind": r.kind.kind,
                    "verbs": VERBS,
                }
                for r in served
            ),
            *(
                {
                    "name": f"{r.plural}/status",
                    "singularName": "",
                    "namespaced": r.kind.namespaced,
                    "kind": r.kind.kind,
                    "verbs": ["get", "patch", "update"],
                }
                for r in served
                if r.kind.kind in STATUS_SUBRESOURCE
            ),
        ],
    }


def _group_doc(group: str) -> Obj:
    versions = [{"groupVersion": r.api_version, "version": r.version} for r in RESOURCES if r.group == group]
    versions = list({v["groupVersion"]: v for v in versions}.values())
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def group_list_doc() -> Obj:
    """/apis: the named groups and their versions."""
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_doc(g) for g in _GROUPS]}


def group_doc(group: str) -> Obj | None:
    """/apis/GROUP; None when the group is not served."""
    if group not in _GROUPS:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group)}
