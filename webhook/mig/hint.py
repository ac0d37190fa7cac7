"""Whether a layout gpupool may choose could serve a Pod that no current layout can: for admission's
"queued: it waits for a MIG re-cut" and "a layout that would serve it exists" answers
(webhook.admission.recut).

Only what could ever be: the node need not be idle now (the Pod would wait for it), but it must not be
`failed` nor held by a change written `stuck` (both wait for an admin), and the layout must fit the Pod's
memory and count on one node, on a GPU model, a node and a profile the Pod may use. A node the admin did
not opt in is considered only when asked (`opted_in=False`), for a denial that says what opting in would do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from webhook.mig.layouts import Layouts
from webhook.mig.planner import Candidate, Waiting


@dataclass(frozen=True, slots=True)
class Recut:
    node: str
    layout: str
    profile: str  # the instance the Pod would get
    memory_mib: int
    opted_in: bool = True  # the node carries gpupool.io/mig-reshape=true


def recut_could_serve(
    pod: Waiting,
    nodes: Iterable[Candidate],
    layouts: Layouts,
    *,
    opted_in: bool = True,
    accepts: Callable[[Candidate, str], bool] | None = None,
) -> Recut | None:
    """The layout whose smallest instance that fits the Pod is smallest (on an idle node before a busy
    one, then the first node and layout by name) that could serve it once its node is re-cut; None when
    none could. Opted-in nodes only, unless
    `opted_in` is False: then a node not opted in is named when no opted-in one could serve it. `accepts`
    (node, profile) says whether the Pod may use that profile's instances there (its classes)."""
    best: tuple[tuple[bool, bool, int, str, str], Recut] | None = None
    for c in nodes:
        if (opted_in and not c.opted_in) or c.state == "failed" or c.held:
            continue
        if pod.nodes is not None and c.name not in pod.nodes:
            continue
        for name, chosen in layouts.usable(c.product, c.gpus).items():
            if pod.models is not None and chosen.model.name not in pod.models:
                continue
            for profile, count in chosen.instances:
                if pod.profile and profile.name != pod.profile:
                    continue
                fits = count >= pod.count and profile.meets(pod.memory_mib)
                if fits and (accepts is None or accepts(c, profile.name)):
                    key = (not c.opted_in, c.busy, profile.memory_mib, c.name, name)
                    if best is None or key < best[0]:
                        best = (key, Recut(c.name, name, profile.name, profile.memory_mib, c.opted_in))
    return None if best is None else best[1]
