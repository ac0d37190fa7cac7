"""The RFC 6902 patches gpupool answers with: a placement's (`build_patch`), a queued Pod's (`queue_patch`)
and a release's (`release_patch`), each a `PodPatch` (webhook.admission.pieces): every op with what it
adds, which validation reads and the queue applies to its index (`patched_info`).

Built op by op from the Pod's shape (webhook.admission.pod), never by diffing whole documents: missing parents are
added whole (kube-apiserver rejects a Pod whose patch adds below a missing parent, even under
failurePolicy Ignore), the user's lists are appended to, never replaced, and everything already in
place produces no op, so the patch of a patched Pod is empty. The shape is checked when it is read, so
every parent a path names is an object or a list as the op expects.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from webhook.admission.fence import RELEASED_BY
from webhook.admission.pieces import (
    NEW_TERM,
    AnnotationsAdded,
    GateAdded,
    GateRemoved,
    Op,
    Piece,
    PodPatch,
    RequirementsAdded,
    ResourcesAdded,
    SelectorAdded,
    TolerationsAdded,
    VersionPinned,
)
from webhook.admission.pod import ContainerView, PodShape
from webhook.domain.affinity import AFFINITY, NODE_AFFINITY, AffinityView, Entries, PoolConstraint, Requirement
from webhook.domain.model import POOL_ANNOTATION, QUEUE_GATE, Taint, Toleration, Tolerations
from webhook.domain.quantity import parse_count


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


def toleration_for(taint: Taint) -> Toleration:
    """Tolerates the taint whatever its value (the GPU Operator's taint value varies by install)."""
    return Toleration(key=taint.key, operator="Exists", effect=taint.effect)


def _toleration_json(toleration: Toleration) -> dict[str, str]:
    tol = {"key": toleration.key, "operator": toleration.operator}
    if toleration.effect:
        tol["effect"] = toleration.effect
    return tol


def _missing(current: tuple[tuple[str, object], ...] | None, entries: Entries) -> Entries:
    """The entries the Pod's map (None: it has none) lacks or holds another value for."""
    existing = dict(current or ())
    return tuple((k, v) for k, v in entries if existing.get(k) != v)


def _entry_op(parent: str, current: object | None, missing: Entries) -> list[tuple[Entries, Op]]:
    """The ops that add `missing` entries under `parent`, each with the entries it adds: the map whole
    when the Pod has none, else one op per entry."""
    if current is None:
        return [(missing, {"op": "add", "path": parent, "value": dict(missing)})]
    return [(((k, v),), {"op": "add", "path": f"{parent}/{escape(k)}", "value": v}) for k, v in missing]


def build_patch(shape: PodShape, spec: PatchSpec) -> PodPatch:
    """The patch that sends the Pod to the placement's pool: its nodeSelector entries and node-affinity
    requirements, tolerations of its GPU taints, the device limit (when `spec.gpus`), gpupool.io/pool."""
    return PodPatch(tuple(_placement_pieces(shape, spec)))


def _placement_pieces(shape: PodShape, spec: PatchSpec) -> list[Piece]:
    pieces: list[Piece] = []
    missing = _missing(shape.node_selector, spec.constraint.selector)
    if missing:
        for entries, op in _entry_op("/spec/nodeSelector", shape.node_selector, missing):
            pieces.append(SelectorAdded(entries, op))
    if spec.constraint.expressions:
        _affinity_pieces(pieces, shape.affinity, spec.constraint.expressions, dict(shape.node_selector or ()))

    if spec.gpu_taints:
        tolerations = Tolerations(shape.tolerations or ())
        needed = [toleration_for(t) for t in spec.gpu_taints if not tolerations.tolerates(t)]
        if needed and shape.tolerations is not None:
            for t in needed:
                pieces.append(
                    TolerationsAdded((t,), {"op": "add", "path": "/spec/tolerations/-", "value": _toleration_json(t)})
                )
        elif needed:
            op = {"op": "add", "path": "/spec/tolerations", "value": [_toleration_json(t) for t in needed]}
            pieces.append(TolerationsAdded(tuple(needed), op))

    if spec.gpus:
        _limit_pieces(pieces, shape.containers[spec.container_index], spec.container_index, spec.resource, spec.gpus)
    missing = _missing(shape.annotations, ((POOL_ANNOTATION, spec.pool),))
    if missing:
        for entries, op in _entry_op("/metadata/annotations", shape.annotations, missing):
            pieces.append(AnnotationsAdded(entries, op))
    return pieces


_REQUIRED = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"


def _affinity_pieces(
    pieces: list[Piece], affinity: AffinityView, expressions: tuple[Requirement, ...], selector: dict[str, str]
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
        pieces.append(RequirementsAdded(tuple(needed), NEW_TERM, {"op": "add", "path": path, "value": value}))
        return
    for i, (term, listed) in enumerate(zip(affinity.required, affinity.listed, strict=True)):
        if not term:
            continue  # a term with no requirement matches no node; requirements would make it match
        missing = [r for r in needed if r not in term.expressions]
        if not missing:
            continue
        base = f"{_REQUIRED}/nodeSelectorTerms/{i}/matchExpressions"
        if listed:
            for r in missing:
                pieces.append(RequirementsAdded((r,), i, {"op": "add", "path": f"{base}/-", "value": r.as_json()}))
        else:
            pieces.append(
                RequirementsAdded(
                    tuple(missing), i, {"op": "add", "path": base, "value": [r.as_json() for r in missing]}
                )
            )


def _limit_pieces(pieces: list[Piece], container: ContainerView, index: int, resource: str, count: int) -> None:
    """`limits[resource] = count` on the container, and requests kept equal where it sets requests."""
    base = f"/spec/containers/{index}/resources"
    value = str(count)
    if not container.has_resources:
        op = {"op": "add", "path": base, "value": {"limits": {resource: value}}}
        pieces.append(ResourcesAdded(index, container.name, "limits", ((resource, value),), op))
        return
    limits = dict(container.limits or ())
    if container.limits is None or resource not in limits or parse_count(limits[resource]) != count:
        missing = _missing(container.limits, ((resource, value),))
        for entries, op in _entry_op(f"{base}/limits", container.limits, missing) if missing else ():
            pieces.append(ResourcesAdded(index, container.name, "limits", entries, op))
    # Requests stay equal to limits where the container sets requests; absent, they default to limits.
    if container.requests is not None and resource not in dict(container.requests):
        op = {"op": "add", "path": f"{base}/requests/{escape(resource)}", "value": value}
        pieces.append(ResourcesAdded(index, container.name, "requests", ((resource, value),), op))


def queue_patch(shape: PodShape, container_index: int, resource: str, count: int) -> PodPatch:
    """The patch that queues a Pod at admission: the limit on the device resource fixed now (Kubernetes
    allows no change to resources later) and gpupool's scheduling gate, nothing that pins a pool. A Pod
    that has them already gets no op."""
    pieces: list[Piece] = []
    if count:
        _limit_pieces(pieces, shape.containers[container_index], container_index, resource, count)
    if shape.gates is None:
        pieces.append(
            GateAdded(QUEUE_GATE, {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": QUEUE_GATE}]})
        )
    elif QUEUE_GATE not in shape.gates:
        pieces.append(
            GateAdded(QUEUE_GATE, {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": QUEUE_GATE}})
        )
    return PodPatch(tuple(pieces))


def release_patch(shape: PodShape, spec: PatchSpec, resource_version: str) -> PodPatch:
    """The one PATCH that releases a queued Pod to a pool: what admission would add for the pool (the
    nodeSelector entries and node-affinity requirements of webhook.domain.affinity, tolerations,
    gpupool.io/pool; only additions, as Kubernetes allows for a gated Pod), gpupool's gate removed, and
    the resourceVersion it was decided on, which kube-apiserver takes as a precondition (409 when the Pod
    changed since)."""
    version = {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version}
    pieces: list[Piece] = [VersionPinned(resource_version, version)]
    pieces.extend(_placement_pieces(shape, spec._replace(gpus=0)))
    gates = shape.gates or ()
    if QUEUE_GATE in gates:
        pieces.append(
            GateRemoved(QUEUE_GATE, {"op": "remove", "path": f"/spec/schedulingGates/{gates.index(QUEUE_GATE)}"})
        )
    return PodPatch(tuple(pieces))


def with_token(ops: list[Op], shape: PodShape, token: str) -> list[Op]:
    """A release's ops with the queue's fencing token (webhook.admission.fence) added as the annotation
    gpupool.io/released-by: into the annotations the release adds whole when the Pod has none, else as an
    op of its own (an `add` that replaces a value the Pod came with)."""
    out: list[Op] = []
    placed = False
    for op in ops:
        whole = op.get("path") == "/metadata/annotations" and isinstance(op.get("value"), dict)
        out.append({**op, "value": {**op["value"], RELEASED_BY: token}} if whole else op)
        placed = placed or whole
    if not placed:
        if shape.annotations is None:
            out.append({"op": "add", "path": "/metadata/annotations", "value": {RELEASED_BY: token}})
        else:
            out.append({"op": "add", "path": f"/metadata/annotations/{escape(RELEASED_BY)}", "value": token})
    return out
