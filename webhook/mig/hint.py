"""Whether a layout gpupool may choose, on an opted-in node, could serve a Pod that no current layout
can: for admission's "queued: it waits for a re-cut" and "a layout that would serve it exists" answers.

Only what could ever be: the node need not be idle now (the Pod would wait for it), but it must be
opted in and not `failed`, and the layout must fit the Pod's memory and count on one node, on a GPU
model and a node the Pod may use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from webhook.mig.layouts import Layouts
from webhook.mig.planner import Candidate, Waiting


@dataclass(frozen=True, slots=True)
class Recut:
    node: str
    layout: str
    profile: str  # the instance the Pod would get
    memory_mib: int


def recut_could_serve(pod: Waiting, nodes: Iterable[Candidate], layouts: Layouts) -> Recut | None:
    """The layout whose smallest instance that fits the Pod is smallest (then the first node and layout
    by name) that could serve it once its node is re-cut; None when none could."""
    best: tuple[tuple[int, str, str], Recut] | None = None
    for c in nodes:
        if not c.opted_in or c.state == "failed" or (pod.nodes is not None and c.name not in pod.nodes):
            continue
        for name, chosen in layouts.usable(c.product, c.gpus).items():
            if pod.models is not None and chosen.model.name not in pod.models:
                continue
            for profile, count in chosen.instances:
                if count >= pod.count and profile.meets(pod.memory_mib):
                    key = (profile.memory_mib, c.name, name)
                    if best is None or key < best[0]:
                        best = (key, Recut(c.name, name, profile.name, profile.memory_mib))
    return None if best is None else best[1]
