"""Label and field selectors on lists and watches, as kube-apiserver filters them.

`labelSelector`: apimachinery's labels.Parse syntax: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`,
`k` and `!k`, comma-separated, all ANDed. `fieldSelector`: `f=v`, `f==v`, `f!=v` over the fields each
resource lets clients select by (an Event's `involvedObject.name`, a Pod's `spec.nodeName` and
`status.phase`, ...); any other field is 400, as kube-apiserver answers. A watch with a selector sends
an object entering the selection as ADDED and one leaving it as DELETED, as the watch cache does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.testing.kubeproto import ApiError

Obj = Mapping[str, Any]
_MAX_SELECTOR = 4096
_META_FIELDS = ("metadata.name", "metadata.namespace")
# The fields each kind may be selected by (its registry's ToSelectableFields).
SELECTABLE: dict[str, tuple[str, ...]] = {
    "Pod": (
        *_META_FIELDS,
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "Node": ("metadata.name", "spec.unschedulable"),
    "Event": (
        *_META_FIELDS,
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
}
_DEFAULTS = {"spec.hostNetwork": "false", "spec.unschedulable": "false"}
# One requirement, stripped: each alternative starts with its own characters, so matching is linear.
_REQUIREMENT = re.compile(
    r"(!?)\s*([A-Za-z0-9._/-]+)"  # negation, key
    r"(?:\s*(==|=|!=)\s*([A-Za-z0-9._/-]*)|\s+(in|notin)\s*\(([^)]*)\))?"  # an operator and its value(s)
)


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector: `matches(obj)` on a decoded object."""

    tests: tuple[Callable[[Obj], bool], ...]

    def matches(self, obj: Obj) -> bool:
        return all(test(obj) for test in self.tests)


def _split(text: str) -> list[str]:
    """Split at the commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str) -> Selector | None:
    """None for an empty selector; 400 for one labels.Parse refuses."""
    if not text.strip():
        return None
    if len(text) > _MAX_SELECTOR:
        raise ApiError(400, "unable to parse requirement: the label selector is too long")
    tests = []
    for part in _split(text):
        match = _REQUIREMENT.fullmatch(part.strip())
        if match is None:
            raise ApiError(
                400, f"unable to parse requirement: found '{part.strip()}', expected: a label selector requirement"
            )
        negated, key, op, value, set_op, values = match.groups()
        if negated and (op or set_op):
            raise ApiError(400, f"unable to parse requirement: found '{part.strip()}', expected: identifier")
        tests.append(_label_test(key, "!" if negated else op or set_op or "exists", value or "", values))
    return Selector(tuple(tests))


def _label_test(key: str, op: str, value: str, values: str | None) -> Callable[[Obj], bool]:
    def labels(obj: Obj) -> Mapping[str, Any]:
        return (obj.get("metadata") or {}).get("labels") or {}

    wanted = {v.strip() for v in (values or "").split(",") if v.strip()}
    if op in ("=", "=="):
        return lambda obj: labels(obj).get(key) == value
    if op == "!=":
        return lambda obj: labels(obj).get(key) != value
    if op == "in":
        return lambda obj: labels(obj).get(key) in wanted
    if op == "notin":
        return lambda obj: labels(obj).get(key) not in wanted
    if op == "!":
        return lambda obj: key not in labels(obj)
    return lambda obj: key in labels(obj)


def parse_field_selector(text: str, kind: str) -> Selector | None:
    """None for an empty selector; 400 for a field the kind is not selected by, or bad syntax."""
    if not text.strip():
        return None
    if len(text) > _MAX_SELECTOR:
        raise ApiError(400, "invalid field selector: too long")
    allowed = SELECTABLE.get(kind, _META_FIELDS)
    tests = []
    for part in _split(text):
        match = re.fullmatch(r"([A-Za-z0-9._]+)\s*(==|=|!=)(.*)", part.strip())
        if match is None:
            raise ApiError(400, f"invalid selector: '{text}'; can't understand '{part.strip()}'")
        field, op, value = match.group(1), match.group(2), match.group(3).strip()
        if field not in allowed:
            raise ApiError(400, f'"{field}" is not a known field selector: only "{", ".join(allowed)}"')
        tests.append(_field_test(field, op, value))
    return Selector(tuple(tests))


def _field_value(obj: Obj, field: str) -> str:
    value: Any = obj
    for step in field.split("."):
        value = value.get(step) if isinstance(value, Mapping) else None
    if value is None:
        return _DEFAULTS.get(field, "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):  # an Event's `source` selects by its component
        return str(value.get("component") or "")
    return str(value)


def _field_test(field: str, op: str, value: str) -> Callable[[Obj], bool]:
    if op == "!=":
        return lambda obj: _field_value(obj, field) != value
    return lambda obj: _field_value(obj, field) == value


def selector_of(query: Mapping[str, str], kind: str) -> Selector | None:
    """The request's label and field selectors as one (None: no selection)."""
    label = parse_label_selector(query.get("labelSelector", ""))
    fields = parse_field_selector(query.get("fieldSelector", ""), kind)
    tests = (label.tests if label else ()) + (fields.tests if fields else ())
    return Selector(tests) if tests else None
