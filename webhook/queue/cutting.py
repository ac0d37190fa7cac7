"""A waiting Pod's long node-affinity lists cut to the values the index's nodes carry (webhook.domain.cut).

The queue keeps each waiting Pod's view (its shape: what the release's request and patch are read from)
and its PodInfo. Past webhook.domain.cut.CUT_AT characters of values, both keep the terms cut, one tuple
for both. The shape's digest (what the leader's parking knows the shape by) is the full shape's, before
the cut, with the cut shape's after it: different Pods stay apart, and a Pod read again after the nodes
gained a value it names is decided afresh, not by its parked answer.
"""

from __future__ import annotations

from dataclasses import replace
from hashlib import blake2b
from typing import TYPE_CHECKING

from webhook.admission.pod import shape_digest
from webhook.domain.cut import FleetLabels, cut_affinity

if TYPE_CHECKING:
    from webhook.queue.waiting import Queued


def cut_queued(queued: Queued, labels: FleetLabels) -> Queued:
    """The Pod as the queue keeps it: cut, with its digest and its `cut` set, when its values are long."""
    view = queued.view
    affinity, cut = cut_affinity(view.shape.affinity, labels)
    if cut is None:
        return queued
    shape = view.shape._replace(affinity=affinity)
    digest = blake2b(shape_digest(view.shape) + repr(shape).encode(), digest_size=16).digest()
    needs = queued.info.requirements._replace(terms=affinity.required)
    return queued._replace(
        view=view._replace(shape=shape), info=replace(queued.info, requirements=needs, cut=cut), digest=digest, cut=cut
    )
