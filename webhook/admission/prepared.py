"""A Pod prepared for placement: what the Pod alone decides, before any pool is read.

`prepare` reads the raw Pod once into a checked view (webhook.admission.pod) and answers, without the
inventory, for a Pod gpupool refuses as malformed or leaves alone; otherwise its validated request
(webhook.admission.request), remembered per Pod shape in the shape memo (webhook.pools.memo) across
calls with one policy. `prepare_view` does the same for a Pod read already (the queue keeps the views of
the Pods it holds). What the pools decide is webhook.admission.core's `place`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from webhook.admission import verdict
from webhook.admission.bound import single_named_node
from webhook.admission.pod import PodError, PodShape, PodView, read_pod, shape_bytes
from webhook.admission.request import (
    REQUEST_WEIGHT,
    GpuRequest,
    RequestError,
    all_containers,
    parse_request,
    requested_resources,
    visible_devices_problem,
    wants_gpus,
)
from webhook.admission.verdict import Verdict
from webhook.domain.model import QUEUE_GATE
from webhook.domain.policy import Policy
from webhook.pools.memo import NO_MEMO, Memo, held_bytes


class Prepared(NamedTuple):
    """A Pod that is gpupool's business, with its validated request: all that is known before the pools
    are read. (A NamedTuple: one is built per admission, and it is cheaper to build than a frozen
    dataclass.)"""

    pod: PodView
    request: GpuRequest
    node: str  # the one node a Pod that bypasses placement names (nodeName, or a DaemonSet's); "" for none
    # The GPUs its reservation holds: the request's for a Pod gpupool places; for one that bypasses
    # placement, its own request of the first resource it requests (the one its placement names).
    devices: int

    @property
    def bypasses(self) -> bool:
        """Placed by someone else: it names its node, or its controller is a DaemonSet (webhook.admission.bound)."""
        return bool(self.pod.node_name or self.pod.daemonset)


def prepare(pod: Any, namespace: str, policy: Policy, shapes: Memo = NO_MEMO) -> Prepared | Verdict:
    """What the Pod alone decides, without the inventory: the verdict for a Pod gpupool refuses as
    malformed or leaves alone, else its request. The raw Pod is read here, once."""
    try:
        view = read_pod(pod, namespace)
    except PodError as exc:
        return verdict.deny(str(exc), code=verdict.CODE_INVALID, reason="invalid")
    if view.mirror:  # the kubelet's copy of a static Pod: already running, nothing to decide
        return verdict.allow("mirror Pod: created by the kubelet, not placed by gpupool")
    if QUEUE_GATE in (view.shape.gates or ()) and policy.placement(view.namespace) != "queue":
        # Only a Pod being created: one the queue holds already (gated under an earlier policy) is released
        # by the rules in use (prepare_view), never stranded behind the gate.
        return verdict.deny(
            f"spec.schedulingGates: {QUEUE_GATE} is gpupool's own gate, for namespaces whose policy queues their "
            f"Pods; namespace {view.namespace} places them at admission: remove the gate",
            code=verdict.CODE_INVALID,
            reason="invalid",
        )
    req = shapes.get(view.shape, lambda: _request(view.shape, policy), size=lambda r: _weight(r, view.shape))
    if isinstance(req, Verdict):
        return req
    # A DaemonSet's Pod is placed by the DaemonSet controller's node affinity; pinning it to a pool could
    # only strand it, but like a Pod that names its node it is checked on the nodes it can reach.
    bypasses = bool(view.node_name or view.daemonset)
    node = view.node_name or (single_named_node(view.shape.requirements) if view.daemonset else "")
    devices = (req.own_requests[0][1] if req.own_requests else 0) if bypasses else req.pod_total
    return Prepared(view, req, node, devices)


def prepare_view(view: PodView, policy: Policy, shapes: Memo = NO_MEMO) -> Prepared | Verdict:
    """`prepare` for a Pod already read (the queue keeps the views of the Pods it holds)."""
    req = shapes.get(view.shape, lambda: _request(view.shape, policy), size=lambda r: _weight(r, view.shape))
    if isinstance(req, Verdict):
        return req
    return Prepared(view, req, "", req.pod_total)


def _weight(value: GpuRequest | Verdict, shape: PodShape) -> int:
    """What a memo entry of a shape and what it decides holds: a request mirrors the shape; a verdict is
    a message (bounded by the core) beside it."""
    if isinstance(value, GpuRequest):
        return REQUEST_WEIGHT * value.shape_bytes
    return shape_bytes(shape) + held_bytes(value)


def _request(shape: PodShape, policy: Policy) -> GpuRequest | Verdict:
    """What the Pod's shape alone decides: not gpupool's business, against the rules, malformed, or this
    request."""
    if not wants_gpus(shape, policy):
        return verdict.allow("no gpupool.io/ annotation and no GPU resource")
    problem = visible_devices_problem(all_containers(shape), shape.namespace, policy)
    if problem:
        return verdict.deny(problem, reason="visible-devices")
    if not shape.annotations and not requested_resources(shape, policy):
        return verdict.allow("no gpupool.io/ annotation and no GPU resource")
    try:
        return parse_request(shape, policy)
    except RequestError as exc:
        return verdict.deny(str(exc), code=verdict.CODE_INVALID, reason="invalid")
