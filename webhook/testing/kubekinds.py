"""kube-apiserver's validation by kind: which rules a create and an update of each kind the simulator
serves run (webhook.testing.kubewrite asks), and the rules of Leases (pkg/apis/coordination/validation)
and Events (ValidateEventCreate) themselves; Pods' and metadata's are in webhook.testing.kubevalidate.
Each function returns the field errors kube-apiserver would, in its order; an empty list: valid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.testing.kubefield import (
    FieldError,
    dns1123_subdomain_problems,
    forbidden,
    invalid,
    not_supported,
    qualified_name_problems,
    required,
)
from webhook.testing.kuberesources import Resource
from webhook.testing.kubevalidate import (
    as_dict,
    validate_meta,
    validate_meta_update,
    validate_pod_create,
    validate_pod_update,
)

Obj = dict[str, Any]


def create_errors(res: Resource, obj: Obj) -> list[FieldError]:
    kind, meta = res.kind.kind, obj["metadata"]
    rules: dict[str, Callable[[], list[FieldError]]] = {
        "Pod": lambda: validate_pod_create(obj),
        "Lease": lambda: validate_meta(meta, namespaced=True) + validate_lease_spec(obj.get("spec") or {}),
        "Event": lambda: validate_event(obj, strict=res.to_view is not None),
    }
    return rules.get(kind, lambda: validate_meta(meta, namespaced=res.kind.namespaced))()


def update_errors(res: Resource, new: Obj, old: Obj) -> list[FieldError]:
    kind, meta, old_meta = res.kind.kind, new["metadata"], old["metadata"]
    rules: dict[str, Callable[[], list[FieldError]]] = {
        "Pod": lambda: validate_pod_update(new, old),
        "Lease": lambda: validate_meta_update(meta, old_meta) + validate_lease_spec(new.get("spec") or {}),
        "Event": lambda: validate_event(new, strict=False) + validate_meta_update(meta, old_meta),
    }
    return rules.get(kind, lambda: validate_meta_update(meta, old_meta))()


# -- Leases and Events ---------------------------------------------------------------------------


def validate_lease_spec(spec: Obj) -> list[FieldError]:
    """ValidateLeaseSpec."""
    errors: list[FieldError] = []
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    if duration is not None and duration <= 0:
        errors.append(invalid("spec.leaseDurationSeconds", duration, "must be greater than 0"))
    if transitions is not None and transitions < 0:
        errors.append(invalid("spec.leaseTransitions", transitions, "must be greater than or equal to 0"))
    strategy = spec.get("strategy")
    if strategy is not None:
        if "/" not in strategy and strategy != "OldestEmulationVersion":
            errors.append(not_supported("spec.strategy.strategy", strategy, ("OldestEmulationVersion",)))
        elif "/" in strategy:
            errors += [invalid("spec.strategy.strategy", strategy, msg) for msg in qualified_name_problems(strategy)]
    if spec.get("preferredHolder") and not strategy:
        errors.append(forbidden("spec.preferredHolder", "may only be specified if `strategy` is defined"))
    return errors


def validate_event(event: Obj, *, strict: bool) -> list[FieldError]:
    """ValidateEventCreate: the legacy rules for every Event; `strict` (events.k8s.io/v1) adds
    ValidateObjectMeta and the rules of the new API (eventTime, type, no deprecated fields)."""
    meta = as_dict(event.get("metadata"))
    namespace = meta.get("namespace") or ""
    involved = as_dict(event.get("involvedObject"))
    errors: list[FieldError] = []
    involved_namespace = involved.get("namespace") or ""
    mismatch = invalid("involvedObject.namespace", involved_namespace, "does not match event.namespace")
    if not event.get("eventTime"):
        # An old-style Event: its namespace is its object's (an object without one: "" or default).
        allowed = ("", "default") if not involved_namespace else (involved_namespace,)
        if namespace not in allowed:
            errors.append(mismatch)
    else:
        if not involved_namespace and namespace not in ("default", "kube-system"):
            errors.append(mismatch)
        controller = event.get("reportingComponent") or ""
        if not controller:
            errors.append(required("reportingController"))
        errors += [invalid("reportingController", controller, msg) for msg in qualified_name_problems(controller)]
        for field, limit in (("reportingInstance", 128), ("action", 128), ("reason", 128)):
            text = event.get(field) or ""
            if not text:
                errors.append(required(field))
            if len(text) > limit:
                errors.append(invalid(field, "", f"can have at most {limit} characters"))
        if len(event.get("message") or "") > 1024:
            errors.append(invalid("message", "", "can have at most 1024 characters"))
    errors += [invalid("namespace", namespace, msg) for msg in dns1123_subdomain_problems(namespace)]
    if not strict:
        return errors
    errors += validate_meta(meta, namespaced=True)
    series = event.get("series")
    if isinstance(series, dict):
        if (series.get("count") or 0) < 2:
            errors.append(invalid("series.count", "", "should be at least 2"))
        if not series.get("lastObservedTime"):
            errors.append(required("series.lastObservedTime"))
    if not event.get("eventTime"):
        errors.append(required("eventTime"))
    if event.get("type") not in ("Normal", "Warning"):
        errors.append(invalid("type", "", f"has invalid value: {event.get('type') or ''}"))
    for field, core in (("firstTimestamp", "firstTimestamp"), ("lastTimestamp", "lastTimestamp"), ("count", "count")):
        if event.get(core):
            errors.append(invalid(field, "", "needs to be unset"))
    if any(as_dict(event.get("source")).get(k) for k in ("component", "host")):
        errors.append(invalid("source", "", "needs to be unset"))
    return errors
