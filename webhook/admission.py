"""Admission of one Pod: annotations -> request -> decision -> quota -> patch, as a Verdict.

`evaluate` is the pure core (no I/O, no clock): the same function answers kube-apiserver through the
Flask app and the user through `gpupool explain`. It is `prepare` (what the Pod alone decides) then
`place` (what the pools decide). `Admitter` binds them to a policy and an inventory, holds the
inventory's lock only for `place`, and records a reservation for each real (not dry-run) placement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from webhook import verdict
from webhook.annotations import GpuRequest, RequestError, parse_request, wants_gpus
from webhook.decision import decide
from webhook.inventory import Inventory
from webhook.memo import NO_MEMO, Memo
from webhook.patch import PatchSpec, build_patch
from webhook.pod import PodError, PodShape, PodView, read_pod
from webhook.policy import Policy
from webhook.pool_index import PoolIndex
from webhook.quotas import check_quotas
from webhook.verdict import Placement, Verdict


def evaluate(
    pod: Any,
    namespace: str,
    policy: Policy,
    index: PoolIndex,
    *,
    explain: bool = True,
    shapes: Memo = NO_MEMO,
) -> Verdict:
    """The verdict for a Pod being created in `namespace`. `explain` adds a line per pool considered
    (for `gpupool explain`; the server does not need them, denial messages carry their own).

    `shapes` remembers, across calls with the same policy, what a Pod's shape alone decides
    (webhook.pod.PodShape): its request, or why it is refused, and its patch for a placement.
    """
    prepared = prepare(pod, namespace, policy, shapes)
    if isinstance(prepared, Verdict):
        return prepared
    return place(prepared, policy, index, explain=explain, shapes=shapes)


class Prepared(NamedTuple):
    """A Pod that is gpupool's business, with its validated request: all that is known before the pools
    are read. (A NamedTuple: one is built per admission, and it is cheaper to build than a frozen
    dataclass.)"""

    pod: PodView
    request: GpuRequest


def prepare(pod: Any, namespace: str, policy: Policy, shapes: Memo = NO_MEMO) -> Prepared | Verdict:
    """What the Pod alone decides, without the inventory: the verdict for a Pod gpupool refuses as
    malformed or leaves alone, else its request. The raw Pod is read here, once."""
    try:
        view = read_pod(pod, namespace)
    except PodError as exc:
        return verdict.deny(str(exc), code=verdict.CODE_INVALID, reason="invalid")
    early = left_alone(view)
    if early is not None:
        return early
    req = shapes.get(view.shape, lambda: _request(view.shape, policy))
    return req if isinstance(req, Verdict) else Prepared(view, req)


def place(
    prepared: Prepared, policy: Policy, index: PoolIndex, *, explain: bool = True, shapes: Memo = NO_MEMO
) -> Verdict:
    """The pool for a prepared Pod, read from the index now, and the patch that pins it there."""
    view, req = prepared
    decision = decide(req, index, policy)
    reasons = decision.explain() if explain else ()
    chosen = decision.chosen
    if chosen is None:
        return verdict.deny(decision.denial, reasons=reasons, reason=decision.denial_reason)
    quota_problem = check_quotas(req, index, chosen.resource)
    if quota_problem:
        return verdict.deny(quota_problem, reasons=reasons, reason="quota")
    placement = Placement(
        pool=chosen.pool,
        resource=chosen.resource,
        count=req.count,
        pod_total=req.pod_total,
        selector=chosen.selector,
        has_capacity=chosen.fits,
        fallback=chosen.fallback,
    )
    spec = PatchSpec(
        chosen.selector, chosen.gpu_taints, req.container_index, chosen.resource, req.count, str(chosen.pool)
    )
    # The key is the patch's whole input, so nothing it reads can be left out of it.
    patch = shapes.get((view.shape, spec), lambda: build_patch(view.shape, spec))
    return verdict.place(placement, patch, warnings=decision.warnings, reasons=reasons)


def left_alone(pod: PodView) -> Verdict | None:
    """Pods gpupool never places, judged on who the Pod is rather than its shape."""
    if pod.mirror:
        return verdict.allow("mirror Pod: created by the kubelet, not placed by gpupool")
    if pod.node_name:
        return verdict.allow(f"already bound to node {pod.node_name}")
    if pod.daemonset:
        # Its node is the DaemonSet controller's choice; pinning it to a pool could only strand it.
        return verdict.allow("DaemonSet Pod: the DaemonSet controller chooses its node")
    return None


def _request(shape: PodShape, policy: Policy) -> GpuRequest | Verdict:
    """What the Pod's shape alone decides: not gpupool's business, malformed, or this request."""
    if not wants_gpus(shape, policy):
        return verdict.allow("no gpupool.io/ annotation and no GPU resource")
    try:
        return parse_request(shape, policy)
    except RequestError as exc:
        return verdict.deny(str(exc), code=verdict.CODE_INVALID, reason="invalid")


class Admitter:
    """The core bound to a policy and an inventory, as the server uses it."""

    def __init__(self, policy: Policy, inventory: Inventory, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.inventory = inventory
        self._clock = clock
        self._shapes = Memo()

    def admit(self, pod: Any, *, namespace: str, dry_run: bool = False) -> Verdict:
        # Only reading the pools and reserving hold the inventory's lock (which the watches need too).
        prepared = prepare(pod, namespace, self.policy, self._shapes)
        if isinstance(prepared, Verdict):
            return prepared
        stale = self.stale_seconds()
        with self.inventory.read() as index:
            index.expire(self._clock())
            result = place(prepared, self.policy, index, explain=False, shapes=self._shapes)
            placement = result.placement
            if placement is not None and stale and self.policy.defaults.on_stale == "deny":
                return verdict.deny(
                    f"the GPU inventory is stale (no contact with the API for {stale:.0f} s); "
                    "policy onStale is deny, so GPU Pods are refused until it re-syncs",
                    code=verdict.CODE_UNAVAILABLE,
                    reasons=result.reasons,
                    reason="stale",
                )
            # A Pod placed on an earlier call (reinvocation) has an empty patch and is not reserved twice.
            if placement is not None and result.patch and not dry_run:
                index.reserve(namespace, placement.pool, placement.selector, placement.pod_total, self._clock())
        if placement is not None and stale:
            note = f"gpupool: placed from a GPU inventory {stale:.0f} s stale; the pool may have changed"
            result = replace(result, warnings=(*result.warnings, note))
        return result

    def stale_seconds(self) -> float:
        """How stale the inventory is beyond the policy's threshold (0 when fresh)."""
        age = self.inventory.age_seconds()
        return age if age > self.policy.defaults.stale_after_seconds else 0.0
