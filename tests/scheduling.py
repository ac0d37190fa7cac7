"""Where kube-scheduler may put a Pod, worked out from the raw objects alone, for tests.

Written from Kubernetes' own rules, independently of gpupool's code (which the tests check against
it): the nodeSelector (every label equal), the required node affinity (terms ORed, requirements in a term
ANDed, a term with none matches nothing; In, NotIn, Exists, DoesNotExist, Gt, Lt; matchFields on
metadata.name), NoSchedule and NoExecute taints against the tolerations, and extended resources within
the node's allocatable. Readiness and cordons are left to the caller.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_INT = re.compile(r"^[+-]?[0-9]+$")


def _requirement(req: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = req["key"], req["operator"], req.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels or not _INT.match(labels[key]) or len(values) != 1 or not _INT.match(values[0]):
            return False
        return int(labels[key]) > int(values[0]) if op == "Gt" else int(labels[key]) < int(values[0])
    raise AssertionError(f"unknown operator {op}")


def _term(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = node["metadata"].get("labels") or {}
    name = {"metadata.name": node["metadata"]["name"]}
    return all(_requirement(r, labels) for r in expressions) and all(_requirement(r, name) for r in fields)


def selects(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """The Pod's nodeSelector and required node affinity allow the node."""
    spec = pod["spec"]
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(_term(t, node) for t in required.get("nodeSelectorTerms") or [])


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return toleration.get("operator", "Equal") == "Equal" and toleration.get("value", "") == taint.get("value", "")


def tolerated(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Every NoSchedule and NoExecute taint of the node is tolerated by the Pod."""
    tolerations = pod["spec"].get("tolerations") or []
    taints = (node.get("spec") or {}).get("taints") or []
    return all(
        any(_tolerates(t, taint) for t in tolerations)
        for taint in taints
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def offers(node: Mapping[str, Any], resource: str, count: int) -> bool:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return resource in allocatable and int(str(allocatable[resource])) >= count


def reachable(pod: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> set[str]:
    """The names of the nodes the Pod's own constraints (nodeSelector, required node affinity) allow."""
    return {n["metadata"]["name"] for n in nodes if selects(pod, n)}
