"""The RFC 6902 patch that applies a placement to the original Pod.

Built op by op from the Pod's shape (webhook.admission.pod), never by diffing whole documents: missing parents are
added whole (kube-apiserver rejects a Pod whose patch adds below a missing parent, even under
failurePolicy Ignore), the user's lists are appended to, never replaced, and everything already in
place produces no op, so the patch of a patched Pod is empty. The shape is checked when it is read, so
every parent a path names is an object or a list as the op expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.admission.pod import ContainerView, PodShape
from webhook.domain.affinity import AFFINITY, NODE_AFFINITY, AffinityView, PoolConstraint, Requirement
from webhook.domain.model import POOL_ANNOTATION, QUEUE_GATE, Taint, Tolerations
from webhook.domain.quantity import parse_count

Op = dict[str, Any]


class PatchSpec(NamedTuple):
    """Everything of a placement the patch depends on; with the shape, the whole input of build_patch
    (and so the key it is remembered by)."""

    constraint: PoolConstraint  # nodeSelector entries, and requirements for every node-affinity term
    gpu_taints: tuple[Taint, ...]  # to tolerate on the Pod's behalf
    container_index: int
    resource: str
    gpus: int  # for the target container; 0: leave the containers' GPU limits alone
    pool: str


def escape(key: str) -> str:
    """A JSON Pointer reference token (RFC 6901): `nvidia.com/gpu` -> `nvidia.com~1gpu`."""
    return key.replace("~", "~0").replace("/", "~1")


def toleration_for(taint: Taint) -> dict[str, str]:
    """Tolerates the taint whatever its value (the GPU Operator's taint value varies by install)."""
    tol = {"key": taint.key, "operator": "Exists"}
    if taint.effect:
        tol["effect"] = taint.effect
    return tol


def _add_entries(
    ops: list[Op], parent: str, current: tuple[tuple[str, object], ...] | None, entries: Mapping[str, str]
) -> None:
    """Add map entries under `parent`, creating the map when the Pod has none."""
    existing = dict(current or ())
    missing = {k: v for k, v in entries.items() if existing.get(k) != v}
    if not missing:
        return
    if current is None:
        ops.append({"op": "add", "path": parent, "value": dict(missing)})
        return
    ops.extend({"op": "add", "path": f"{parent}/{escape(k)}", "value": v} for k, v in missing.items())


def build_patch(shape: PodShape, spec: PatchSpec) -> list[Op]:
    ops: list[Op] = []
    _add_entries(ops, "/spec/nodeSelector", shape.node_selector, dict(spec.constraint.selector))
    _affinity_ops(ops, shape.affinity, spec.constraint.expressions, dict(shape.node_selector or ()))

    tolerations = Tolerations(shape.tolerations or ())
    needed = [toleration_for(t) for t in spec.gpu_taints if not tolerations.tolerates(t)]
    if needed:
        if shape.tolerations is not None:
            ops.extend({"op": "add", "path": "/spec/tolerations/-", "value": t} for t in needed)
        else:
            ops.append({"op": "add", "path": "/spec/tolerations", "value": needed})

    if spec.gpus:
        _limit_ops(ops, shape.containers[spec.container_index], spec.container_index, spec.resource, spec.gpus)
    _add_entries(ops, "/metadata/annotations", shape.annotations, {POOL_ANNOTATION: spec.pool})
    return ops


_REQUIRED = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"


def _affinity_ops(
    ops: list[Op], affinity: AffinityView, expressions: tuple[Requirement, ...], selector: dict[str, str]
) -> None:
    """The pool's requirements ANDed into every required node-affinity term the Pod has (the scheduler
    ORs terms: one left without them would reach other nodes), or its one term when it has none. Only
    what a term lacks is added, and nothing its nodeSelector already satisfies, so a patched Pod gets no
    op (webhook.domain.affinity.NodeRequirements.within says the same in values)."""
    needed = [r for r in expressions if not (r.key in selector and r.matches(selector))]
    if not needed:
        return
    if affinity.required is None:
        value: Any = {"nodeSelectorTerms": [{"matchExpressions": [r.as_json() for r in needed]}]}
        path = _REQUIRED
        if affinity.level < NODE_AFFINITY:  # the parents the Pod lacks are added whole
            value, path = {"requiredDuringSchedulingIgnoredDuringExecution": value}, "/spec/affinity/nodeAffinity"
        if affinity.level < AFFINITY:
            value, path = {"nodeAffinity": value}, "/spec/affinity"
        ops.append({"op": "add", "path": path, "value": value})
        return
    for i, (term, listed) in enumerate(zip(affinity.required, affinity.listed, strict=True)):
        if not term:
            continue  # a term with no requirement matches no node; requirements would make it match
        missing = [r.as_json() for r in needed if r not in term.expressions]
        base = f"{_REQUIRED}/nodeSelectorTerms/{i}/matchExpressions"
        if not missing:
            continue
        if listed:
            ops.extend({"op": "add", "path": f"{base}/-", "value": r} for r in missing)
        else:
            ops.append({"op": "add", "path": base, "value": missing})


def _limit_ops(ops: list[Op], container: ContainerView, index: int, resource: str, count: int) -> None:
    """`limits[resource] = count` on the container, and requests kept equal where it sets requests."""
    base = f"/spec/containers/{index}/resources"
    value = str(count)
    if not container.has_resources:
        ops.append({"op": "add", "path": base, "value": {"limits": {resource: value}}})
        return
    limits = dict(container.limits or ())
    if container.limits is None or resource not in limits or parse_count(limits[resource]) != count:
        _add_entries(ops, f"{base}/limits", container.limits, {resource: value})
    # Requests stay equal to limits where the container sets requests; absent, they default to limits.
    if container.requests is not None and resource not in dict(container.requests):
        ops.append({"op": "add", "path": f"{base}/requests/{escape(resource)}", "value": value})


def queue_patch(shape: PodShape, container_index: int, resource: str, count: int) -> list[Op]:
    """The patch that queues a Pod at admission: the limit on the device resource fixed now (Kubernetes
    allows no change to resources later) and gpupool's scheduling gate, nothing that pins a pool. A Pod
    that has them already gets no op."""
    ops: list[Op] = []
    if count:
        _limit_ops(ops, shape.containers[container_index], container_index, resource, count)
    if shape.gates is None:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": QUEUE_GATE}]})
    elif QUEUE_GATE not in shape.gates:
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": QUEUE_GATE}})
    return ops


def release_patch(shape: PodShape, spec: PatchSpec, resource_version: str) -> list[Op]:
    """The one PATCH that releases a queued Pod to a pool: what admission would add for the pool (the
    nodeSelector entries and node-affinity requirements of webhook.domain.affinity, tolerations,
    gpupool.io/pool; only additions, as Kubernetes allows for a gated Pod), gpupool's gate removed, and
    the resourceVersion it was decided on, which kube-apiserver takes as a precondition (409 when the Pod
    changed since)."""
    ops: list[Op] = [{"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version}]
    ops.extend(build_patch(shape, spec._replace(gpus=0)))
    gates = shape.gates or ()
    if QUEUE_GATE in gates:
        ops.append({"op": "remove", "path": f"/spec/schedulingGates/{gates.index(QUEUE_GATE)}"})
    return ops
