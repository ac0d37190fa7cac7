"""The typed decode every write goes through in kube-apiserver, for the fields the simulator's rules read.

kube-apiserver decodes a body into Go structs before anything else: a field of the wrong JSON type is a
400 for a create or update ("cannot be handled as a Pod: json: cannot unmarshal ...") and a 422 on the
`patch` field for a patch. The simulator checks the types of the fields its own rules and its scheduler
read (so no rule ever meets a value of an unexpected type), leaves the rest as it came, and turns
`MicroTime` fields (a Lease's renewTime, an Event's eventTime) into the one form the API stores:
`2006-01-02T15:04:05.000000Z`, parsed as strictly as Go parses RFC3339Micro.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

Obj = dict[str, Any]
# A shape: a Python type, "map" (strings to strings), "quantities" (strings to quantities), a dict of
# field shapes (other fields are not checked) or a one-item list (a list of that shape).
Shape = Any

_META: Shape = {
    "name": str,
    "generateName": str,
    "namespace": str,
    "uid": str,
    "resourceVersion": str,
    "generation": int,
    "labels": "map",
    "annotations": "map",
    "finalizers": [str],
    "ownerReferences": [{"uid": str, "name": str, "kind": str, "apiVersion": str}],
    "deletionTimestamp": str,
    "deletionGracePeriodSeconds": int,
}
_REQUIREMENT: Shape = {"key": str, "operator": str, "values": [str]}
_TERM: Shape = {"matchExpressions": [_REQUIREMENT], "matchFields": [_REQUIREMENT]}
_CONTAINER: Shape = {
    "name": str,
    "image": str,
    "restartPolicy": str,
    "resources": {"limits": "quantities", "requests": "quantities"},
}
_POD: Shape = {
    "metadata": _META,
    "spec": {
        "containers": [_CONTAINER],
        "initContainers": [_CONTAINER],
        "ephemeralContainers": [{"name": str}],
        "nodeName": str,
        "nodeSelector": "map",
        "schedulerName": str,
        "priority": int,
        "priorityClassName": str,
        "activeDeadlineSeconds": int,
        "terminationGracePeriodSeconds": int,
        "overhead": "quantities",
        "resources": {"limits": "quantities", "requests": "quantities"},
        "schedulingGates": [{"name": str}],
        "tolerations": [{"key": str, "operator": str, "value": str, "effect": str, "tolerationSeconds": int}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_TERM]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": int, "preference": _TERM}],
            },
        },
    },
    "status": {"phase": str},
}
_NODE: Shape = {
    "metadata": _META,
    "spec": {"unschedulable": bool, "taints": [{"key": str, "value": str, "effect": str}]},
    "status": {
        "allocatable": "quantities",
        "capacity": "quantities",
        "conditions": [{"type": str, "status": str}],
    },
}
_LEASE: Shape = {
    "metadata": _META,
    "spec": {
        "holderIdentity": str,
        "leaseDurationSeconds": int,
        "acquireTime": str,
        "renewTime": str,
        "leaseTransitions": int,
        "strategy": str,
        "preferredHolder": str,
    },
}
_EVENT: Shape = {
    "metadata": _META,
    "involvedObject": {"namespace": str, "name": str, "kind": str, "uid": str},
    "reason": str,
    "message": str,
    "type": str,
    "action": str,
    "reportingComponent": str,
    "reportingInstance": str,
    "count": int,
    "eventTime": str,
    "series": {"count": int, "lastObservedTime": str},
}
SHAPES: dict[str, Shape] = {
    "Pod": _POD,
    "Node": _NODE,
    "ResourceQuota": {"metadata": _META, "spec": {"hard": "quantities"}},
    "Lease": _LEASE,
    "Event": _EVENT,
}
MICRO_TIMES: dict[str, tuple[tuple[str, ...], ...]] = {
    "Lease": (("spec", "acquireTime"), ("spec", "renewTime")),
    "Event": (("eventTime",), ("series", "lastObservedTime")),
}
_GO_TYPES = {str: "string", int: "int64", bool: "bool", "map": "map[string]string", "quantities": "Quantity"}


def shape_problem(kind: str, obj: Any) -> str | None:
    """The first field of `obj` whose JSON type the Go struct cannot hold, as Go's decoder says it."""
    return _check(SHAPES.get(kind, {"metadata": _META}), obj, kind)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check(shape: Shape, value: Any, path: str) -> str | None:
    if value is None:
        return None  # null is the zero value
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return _mismatch(value, path, "struct")
        for name, inner in shape.items():
            problem = _check(inner, value.get(name), f"{path}.{name}")
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return _mismatch(value, path, "slice")
        for item in value:
            problem = _check(shape[0], item, path)
            if problem:
                return problem
        return None
    if shape in ("map", "quantities"):
        if not isinstance(value, dict):
            return _mismatch(value, path, _GO_TYPES[shape])
        for key, item in value.items():
            number = isinstance(item, int | float) and not isinstance(item, bool)
            if not (isinstance(item, str) or (shape == "quantities" and number)):
                return _mismatch(item, f"{path}[{key}]", "string" if shape == "map" else "Quantity")
        return None
    if shape is int:
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    else:
        ok = isinstance(value, shape) and not (shape is not bool and isinstance(value, bool))
    return None if ok else _mismatch(value, path, _GO_TYPES[shape])


def _mismatch(value: Any, path: str, go_type: str) -> str:
    return f"json: cannot unmarshal {_json_type(value)} into Go struct field {path} of type {go_type}"


# -- MicroTime ---------------------------------------------------------------------------------------

_MICRO = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})(Z|[+-]\d{2}:\d{2})")
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"


def micro_time(text: str) -> str:
    """A MicroTime as kube-apiserver stores and serves it (UTC, six fraction digits, `Z`); ValueError,
    worded as Go's time.Parse words it, for text that is not in that layout (Go requires the six
    digits and an offset)."""
    match = _MICRO.fullmatch(text) if len(text) <= 40 else None
    if match is None:
        raise ValueError(f'parsing time "{text}" as "{RFC3339_MICRO}": cannot parse "{text}" as "{RFC3339_MICRO}"')
    year, month, day, hour, minute, second, micro, zone = match.groups()
    try:
        when = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), int(micro), tzinfo=UTC)
    except ValueError:
        raise ValueError(f'parsing time "{text}": day or month out of range') from None
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        when -= sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def normalize_micro_times(kind: str, obj: Obj) -> None:
    """Rewrite the MicroTime fields of `obj` in place; ValueError for one that does not parse."""
    for path in MICRO_TIMES.get(kind, ()):
        parent: Any = obj
        for step in path[:-1]:
            parent = parent.get(step) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and isinstance(parent.get(path[-1]), str):
            parent[path[-1]] = micro_time(parent[path[-1]])
