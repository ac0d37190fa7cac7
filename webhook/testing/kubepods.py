"""What kube-apiserver does to a Pod that is written, before it validates it.

On create (pkg/registry/core/pod/strategy.go PrepareForCreate, the v1 defaulting, and the default
admission plugins that matter to a scheduler): `metadata.generation` 1; the status replaced by
`{phase: Pending, qosClass}` plus, for a gated Pod, the `PodScheduled=False/SchedulingGated` condition;
each container's requests defaulted from its limits; `spec.priority` 0 and `preemptionPolicy` when no
priority is given (the Priority plugin; PriorityClasses are not served, so a given priority is kept);
`schedulerName`, `restartPolicy`, `dnsPolicy` and `terminationGracePeriodSeconds` defaulted; and the
DefaultTolerationSeconds plugin's `not-ready`/`unreachable` NoExecute tolerations (300 s) unless the Pod
tolerates those taints already.

On update (PrepareForUpdate and the same plugins): the status stays what it was (the main resource
cannot change it), `generation` goes up when the spec changes, the priority stays the old one, and the
DefaultTolerationSeconds tolerations are added again if the new spec lacks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.testing.kubefield import objects_in

Obj = dict[str, Any]
NOT_READY, UNREACHABLE = "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"
DEFAULT_TOLERATION_SECONDS = 300
SCHEDULING_GATED = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "SchedulingGated",
    "message": "Scheduling is blocked due to non-empty scheduling gates",
}


def apply_defaults(pod: Obj) -> None:
    """What kube-apiserver adds to a new Pod's spec (defaulting and admission), in place. Idempotent; the
    simulator's Python API applies it to the Pods it is given, so they look as a cluster's Pods do."""
    spec = pod.setdefault("spec", {})
    if not isinstance(spec, dict):
        return  # validation refuses it
    _default_spec(spec)
    if spec.get("priority") is None and not spec.get("priorityClassName"):
        spec["priority"] = 0
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    _add_default_tolerations(spec)


def has_defaults(pod: Mapping[str, Any]) -> bool:
    """Whether `apply_defaults` would leave the Pod as it is (a quick check, so that loading a cluster
    whose Pods have them already copies nothing)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return True
    if any(
        spec.get(key) is None
        for key in ("schedulerName", "restartPolicy", "dnsPolicy", "terminationGracePeriodSeconds")
    ):
        return False
    if spec.get("priority") is None and not spec.get("priorityClassName"):
        return False
    tolerations = spec.get("tolerations")
    if not isinstance(tolerations, list) or len(tolerations) < 2:
        return False
    keys = {t.get("key") for t in tolerations if isinstance(t, Mapping) and t.get("effect") in (None, "", "NoExecute")}
    if not ({NOT_READY, UNREACHABLE} <= keys or None in keys or "" in keys):
        return False
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            limits = resources.get("limits") if isinstance(resources, Mapping) else None
            if isinstance(limits, Mapping) and limits:
                requests = resources.get("requests") if isinstance(resources, Mapping) else None
                if not isinstance(requests, Mapping) or any(name not in requests for name in limits):
                    return False
    return True


def prepare_create(pod: Obj) -> None:
    """Defaults, admission and PrepareForCreate of a new Pod, in place (the result is then validated)."""
    apply_defaults(pod)
    spec = pod["spec"]
    if not isinstance(spec, dict):
        return
    pod.setdefault("metadata", {})["generation"] = 1
    status: Obj = {"phase": "Pending", "qosClass": qos_class(spec)}
    if spec.get("schedulingGates"):
        status["conditions"] = [dict(SCHEDULING_GATED)]
    pod["status"] = status


def prepare_update(new: Obj, old: Obj) -> None:
    """What an update keeps of the old Pod (status, priority) and adds to the new one, in place."""
    spec, old_spec = new.get("spec"), old.get("spec") or {}
    if isinstance(spec, dict):
        _default_spec(spec)
        for key in ("priority", "preemptionPolicy"):
            if old_spec.get(key) is not None:
                spec[key] = old_spec[key]
        _add_default_tolerations(spec)
    if "status" in old:
        new["status"] = old["status"]
    else:
        new.pop("status", None)
    generation = (old.get("metadata") or {}).get("generation")
    meta = new.get("metadata")
    if isinstance(meta, dict):
        if generation is None:
            meta.pop("generation", None)
        else:
            meta["generation"] = generation + (0 if semantic(spec) == semantic(old_spec) else 1)


def _default_spec(spec: Obj) -> None:
    for key, value in (
        ("schedulerName", "default-scheduler"),
        ("restartPolicy", "Always"),
        ("dnsPolicy", "ClusterFirst"),
        ("terminationGracePeriodSeconds", 30),
    ):
        if spec.get(key) is None:
            spec[key] = value
    for field in ("containers", "initContainers"):
        for _, container in objects_in(spec.get(field)):
            resources = container.get("resources")
            if isinstance(resources, dict) and isinstance(resources.get("limits"), dict):
                requests = resources.get("requests")
                if not isinstance(requests, dict):
                    requests = resources["requests"] = {}
                for name, value in resources["limits"].items():
                    requests.setdefault(name, value)


def _add_default_tolerations(spec: Obj) -> None:
    """DefaultTolerationSeconds: a toleration of any key (or of the taint's), for NoExecute or any effect,
    counts as tolerating it already."""
    tolerations = spec.get("tolerations")
    if tolerations is None:
        tolerations = []
    if not isinstance(tolerations, list):
        return
    for key in (NOT_READY, UNREACHABLE):
        if not any(
            t.get("key") in (None, "", key) and t.get("effect") in (None, "", "NoExecute")
            for _, t in objects_in(tolerations)
        ):
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
                }
            )
    spec["tolerations"] = tolerations


def qos_class(spec: Obj) -> str:
    """GetPodQOS: Guaranteed when every container sets cpu and memory limits equal to its requests,
    BestEffort when none sets any cpu or memory, Burstable otherwise."""
    containers = [c for field in ("containers", "initContainers") for _, c in objects_in(spec.get(field))]
    requests: list[Obj] = []
    limits: list[Obj] = []
    for container in containers:
        resources = container.get("resources")
        resources = resources if isinstance(resources, dict) else {}
        requests.append(_cpu_memory(resources.get("requests")))
        limits.append(_cpu_memory(resources.get("limits")))
    if not any(requests) and not any(limits):
        return "BestEffort"
    guaranteed = all(len(lim) == 2 and lim == {**lim, **req} for req, lim in zip(requests, limits, strict=True))
    return "Guaranteed" if guaranteed and containers else "Burstable"


def _cpu_memory(resources: Any) -> Obj:
    if not isinstance(resources, dict):
        return {}
    return {k: str(v) for k, v in resources.items() if k in ("cpu", "memory")}


def semantic(value: Any) -> Any:
    """A value as apimachinery's semantic equality compares it: null, empty lists and empty maps are all
    "unset" (Go's nil slices and maps equal empty ones)."""
    if isinstance(value, dict):
        kept = {k: semantic(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None} or None
    if isinstance(value, list):
        return [semantic(v) for v in value] or None
    return value
