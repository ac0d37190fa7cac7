"""The policy version travels with the Pod: what gpupool's mutating call writes (gpupool.io/policy), and
which policy the validating call checks the stored Pod against.

A policy ConfigMap change reaches each replica's volume at its own time (60-90 s), so the mutating and
the validating call of one CREATE may be answered under two policies: one replica queues a namespace,
the other places it now, or audits it. The mutating call therefore writes the version (`Policy.digest`)
it applied on every Pod it places in a pool or queues (`stamped`; a value the Pod came with is
replaced, so a tenant cannot choose it), and the validating call checks the Pod by that version
(`policies_for`):

- the replica's own version, or a Pod with no version (admitted by a gpupool that wrote none, or
  answered unchanged: audited, bypassing placement): the current policy, then each previous version
  this replica used within the last `PREVIOUS_SECONDS` (at most `PREVIOUS_VERSIONS`, with the same
  pools): allowed when one of them allows it;
- a previous version this replica knows (same pools): that one;
- a version this replica does not know (not loaded yet, or written by no gpupool): only what does not
  depend on what that version says about the namespace. A Pod carrying gpupool's gate is checked as
  the current policy queues it (a gated Pod holds nothing; the queue's leader decides its release by
  its own policy); any other Pod as the current policy places it now, under `enforce`. A Pod answered
  unchanged (audited) is never accepted this way: a version no replica knows must not let an ungated,
  unplaced GPU Pod in.
"""

from __future__ import annotations

from dataclasses import replace

from webhook.admission.patch import escape
from webhook.admission.pieces import AnnotationsAdded, Piece, PodPatch
from webhook.admission.pod import PodShape
from webhook.admission.request import POLICY
from webhook.admission.verdict import Verdict
from webhook.domain.model import PREFIX
from webhook.domain.policy import PlacementMode, Policy

STAMP = PREFIX + POLICY
PREVIOUS_VERSIONS = 4  # previous policies a replica keeps to validate Pods their mutating calls answered
# How long a replaced policy may still be the one a Pod's mutating call applied: a ConfigMap change takes
# 60-90 s to reach every replica, and the two calls of one CREATE are seconds apart.
PREVIOUS_SECONDS = 300.0


def stamped(result: Verdict, shape: PodShape, policy: Policy) -> Verdict:
    """The mutating answer with the policy's version written on the Pod, for a Pod placed in a pool or
    queued; other answers (refused, unchanged, bypassing placement) as they are."""
    placed = result.placement is not None and not result.placement.node
    if not (result.allowed and (placed or result.queued) and policy.digest):
        return result
    if dict(shape.annotations or ()).get(STAMP) == policy.digest:
        return result
    entry = (STAMP, policy.digest)
    pieces: list[Piece] = list(result.changes.pieces)
    for i, piece in enumerate(pieces):
        if isinstance(piece, AnnotationsAdded) and piece.op["path"] == "/metadata/annotations":
            entries = (*piece.entries, entry)  # the annotations the patch adds whole: one more
            pieces[i] = AnnotationsAdded(entries, {**piece.op, "value": dict(entries)})
            break
    else:
        if shape.annotations is None:
            op = {"op": "add", "path": "/metadata/annotations", "value": dict([entry])}
        else:  # an `add` of an existing key replaces its value (RFC 6902)
            op = {"op": "add", "path": f"/metadata/annotations/{escape(STAMP)}", "value": policy.digest}
        pieces.append(AnnotationsAdded((entry,), op))
    return replace(result, changes=PodPatch(tuple(pieces)), outcome="mutated")


def policies_for(
    version: str | None, gated: bool, namespace: str, current: Policy, previous: tuple[Policy, ...]
) -> tuple[Policy, ...]:
    """The policies the validating call checks a stored Pod against, in order (see the module docstring),
    from the version the Pod carries (None: none) and whether it carries gpupool's gate; `previous`: the
    versions this replica used before, newest first, with the current one's pools."""
    if version is None or version == current.digest:
        return (current, *previous)
    known = [p for p in previous if p.digest == version]
    if known:
        return (known[0],)
    return (with_mode(current, namespace, "queue" if gated else "now"),)


def with_mode(policy: Policy, namespace: str, placement: PlacementMode) -> Policy:
    """`policy` with `namespace` placed by `placement`, enforced."""
    rule = replace(policy.namespace(namespace), placement=placement, enforcement="enforce")
    return replace(policy, namespaces={**policy.namespaces, namespace: rule}, digest="")
