"""Admission of a Pod whose namespace queues (policy `placement: queue`): judged now, placed later.

Everything that can be judged at admission is judged here, by any replica: the annotations, the class
policy, the escape rules (all of webhook.admission.core's `prepare`), whether some pool could ever hold
the Pod, whether its request is within every quota's hard limit, and for a gang (`gpupool.io/group-size`)
whether the whole gang could ever be released together (webhook.admission.gang). What depends on what
is free now is left to the queue's leader (webhook.queue), which releases the Pod to the best pool that
has room and keeps every quota exact.

The answer adds the limit on the device resource (fixed now: Kubernetes allows no change to resources
later; the resource of the best pool the Pod could ever use) and the scheduling gate `gpupool.io/queue`,
and nothing that pins a pool. A queued Pod holds nothing: no reservation, no capacity, no quota, until it
is released (webhook.pools.claims).

A Pod no current MIG layout can serve, but one gpupool may choose on an opted-in node could (policy
`migReshaping`, webhook.admission.recut), is queued for that re-cut, with the resource it will offer.
"""

from __future__ import annotations

from webhook.admission import verdict
from webhook.admission.choice import Choice
from webhook.admission.gang import gang_problem
from webhook.admission.hints import hinted
from webhook.admission.patch import queue_patch
from webhook.admission.pod import PodView
from webhook.admission.recut import recut_for, recut_note, recut_pool, recut_words
from webhook.admission.request import GpuRequest
from webhook.admission.verdict import Reason, Verdict
from webhook.domain.devices import NOUNS
from webhook.domain.policy import Policy
from webhook.mig.hint import Recut
from webhook.pools.index import PoolIndex
from webhook.pools.memo import NO_MEMO, Memo
from webhook.pools.quotas.checks import hard_limit_problem


def queue_verdict(
    view: PodView, req: GpuRequest, choice: Choice, policy: Policy, index: PoolIndex, *, shapes: Memo = NO_MEMO
) -> Verdict:
    """The verdict for a Pod the policy sends to the queue, from its choice in QUEUE mode
    (webhook.admission.choice): only the quotas' hard limits count here. A Pod no pool could ever hold is
    told the annotation value that would queue it, if one would (webhook.admission.hints)."""
    decision = choice.decision
    if not decision.candidates:
        recut = recut_for(req, index, policy)
        if recut is not None:
            return _waits_for_recut(view, req, recut, index, policy, reasons=choice.explain())
        message = hinted(choice, req, view, index, policy, shapes=shapes)
        note = recut_note(req, index, policy)
        message = f"{message}. {note}" if note else message
        return verdict.deny(message, reasons=choice.explain(), reason=choice.reason)
    best = choice.chosen  # the ranking's first within every hard limit: its device resource is fixed now
    if best is None:
        return verdict.deny(f"{choice.denial}; the Pod could never be released from the queue", reason=choice.reason)
    gang = gang_problem(req, view.group, decision.candidates, index, policy)
    if gang is not None:  # its members go all at once or not at all: judged whole, not one by one
        reason: Reason = "quota" if gang.code == "quota" else "no-capacity"
        return verdict.deny(f"{gang.message}; its Pods could never be released from the queue", reason=reason)
    patch = queue_patch(view.shape, req.container_index, best.resource, req.count)
    noun = "GPUs" if best.kind == "gpu" else f"{NOUNS[best.kind]}s"
    # The command first: the API answer's warnings are cut at 120 characters (webhook.serving.review), and a
    # namespace name may take 63 of them.
    waits = (
        f"gpupool: queued (see kubectl gpupool queue -n {req.namespace}): waits for {req.pod_total} free {noun} "
        f"({best.resource}) on one node of its pools"
    )
    return verdict.queue(
        resource=best.resource,
        patch=patch,
        message=f"queued for {req.pod_total} x {best.resource}",
        warnings=(waits,),
        reasons=choice.explain(),
    )


def _waits_for_recut(
    view: PodView, req: GpuRequest, recut: Recut, index: PoolIndex, policy: Policy, *, reasons: tuple[str, ...]
) -> Verdict:
    """A Pod no current layout can serve, queued for the MIG re-cut that could (webhook.admission.recut):
    its device resource is the one the re-cut will offer, within the hard limits of the pool it will be
    in; the queue's leader plans the re-cut (webhook.queue.reshape) and releases the Pod into it."""
    pool, resource = recut_pool(req, recut, index, policy)
    problem, reason = hard_limit_problem(req, pool, index, policy, resource=resource, memory_mib=recut.memory_mib)
    if problem:
        return verdict.deny(f"{problem}; the Pod could never be released from the queue", reason=reason)
    patch = queue_patch(view.shape, req.container_index, resource, req.count)
    waits = (
        f"gpupool: queued (see kubectl gpupool queue -n {req.namespace}): waits for a MIG re-cut to "
        f"{recut.layout} ({resource}), such as of node {recut.node}"
    )
    return verdict.queue(
        resource=resource,
        patch=patch,
        message=f"queued for {req.pod_total} x {resource}, which a MIG re-cut of {recut.node} to {recut.layout} offers",
        warnings=(waits,),
        reasons=(*reasons, f"no current layout serves it; {recut_words(recut)} would"),
    )
