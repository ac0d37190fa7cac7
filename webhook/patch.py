"""The RFC 6902 patch that applies a placement to the original Pod.

Built op by op against the Pod as it arrived, never by diffing whole documents: missing parents are
added whole (kube-apiserver rejects a Pod whose patch adds below a missing parent, even under
failurePolicy Ignore), the user's lists are appended to, never replaced, and everything already in
place produces no op, so the patch of a patched Pod is empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.kubeobj import POOL_ANNOTATION, as_map
from webhook.model import Taint, Toleration
from webhook.quantity import parse_count

Op = dict[str, Any]


def escape(key: str) -> str:
    """A JSON Pointer reference token (RFC 6901): `nvidia.com/gpu` -> `nvidia.com~1gpu`."""
    return key.replace("~", "~0").replace("/", "~1")


def toleration_for(taint: Taint) -> dict[str, str]:
    """Tolerates the taint whatever its value (the GPU Operator's taint value varies by install)."""
    tol = {"key": taint.key, "operator": "Exists"}
    if taint.effect:
        tol["effect"] = taint.effect
    return tol


def _add_entries(ops: list[Op], parent: str, current: Any, entries: Mapping[str, str]) -> None:
    """Add map entries under `parent`, creating the map when the Pod has none."""
    existing = as_map(current)
    missing = {k: v for k, v in entries.items() if existing.get(k) != v}
    if not missing:
        return
    if not isinstance(current, dict):
        ops.append({"op": "add", "path": parent, "value": dict(missing)})
        return
    ops.extend({"op": "add", "path": f"{parent}/{escape(k)}", "value": v} for k, v in missing.items())


def build_patch(
    pod: Mapping[str, Any],
    *,
    selector: Mapping[str, str],
    gpu_taints: tuple[Taint, ...],
    tolerations: tuple[Toleration, ...],
    container_index: int,
    resource: str,
    count: int,
    pool: str,
) -> list[Op]:
    meta, spec = as_map(pod.get("metadata")), as_map(pod.get("spec"))
    ops: list[Op] = []
    _add_entries(ops, "/spec/nodeSelector", spec.get("nodeSelector"), selector)

    needed = [toleration_for(t) for t in gpu_taints if not any(tol.tolerates(t) for tol in tolerations)]
    if needed:
        if isinstance(spec.get("tolerations"), list):
            ops.extend({"op": "add", "path": "/spec/tolerations/-", "value": t} for t in needed)
        else:
            ops.append({"op": "add", "path": "/spec/tolerations", "value": needed})

    if count:
        _limit_ops(ops, spec, container_index, resource, count)
    _add_entries(ops, "/metadata/annotations", meta.get("annotations"), {POOL_ANNOTATION: pool})
    return ops


def _limit_ops(ops: list[Op], spec: Mapping[str, Any], container_index: int, resource: str, count: int) -> None:
    """`limits[resource] = count` on the container, and requests kept equal where it sets requests."""
    container = as_map(spec["containers"][container_index])
    base = f"/spec/containers/{container_index}/resources"
    value = str(count)
    resources = container.get("resources")
    if not isinstance(resources, dict):
        ops.append({"op": "add", "path": base, "value": {"limits": {resource: value}}})
    else:
        limits = resources.get("limits")
        if not isinstance(limits, dict) or parse_count(limits.get(resource)) != count or resource not in limits:
            _add_entries(ops, f"{base}/limits", limits, {resource: value})
        requests = resources.get("requests")
        # Requests stay equal to limits where the container sets requests; absent, they default to limits.
        if isinstance(requests, dict) and resource not in requests:
            ops.append({"op": "add", "path": f"{base}/requests/{escape(resource)}", "value": value})
