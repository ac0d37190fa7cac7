"""What the queue would do now, without doing it: the leader's pass over the waiting Pods, then undone.

For the commands that show the queue (`gpupool queue`) and a Pod's place in it (`gpupool explain`): one
pass of the leader's own `plan` (webhook.queue.release) over the queue as the inventory shows it, in
release order, optionally with more Pods (those a manifest will create) in their places in that order;
every release the pass decides is then taken back with `settle`, as the runner takes back a release it
could not write, and the extra Pods removed, so the index is left counting what it counted before.
`plan` stays the one function that decides; this module only asks it and keeps the answer. With
`migReshaping`, the leader's MIG planner is asked likewise which node's re-cut each Pod that waits for
capacity waits for (`recut_waits`). The charges of Pods that name their node (webhook.pools.charges)
count as the leader's pass counts them, by the same rule (`pending`): a Pod the leader would hold back
for a charged Pod's quota or room is shown waiting for it. Pure, like `plan`: the caller holds the
inventory's lock and reads the charges.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from webhook.admission.recut import is_mig
from webhook.domain.model import PodKey
from webhook.domain.policy import Policy
from webhook.mig.follow import asked_of, under_way
from webhook.pools.charges import Charge, pending
from webhook.pools.index import Inseparable, PoolIndex
from webhook.queue.release import Release, Wait, decide_batch, read_batch, settle
from webhook.queue.reshape_inputs import RequestOf, busy_of, demand_of, recut_plan
from webhook.queue.waiting import Queued, read_queued

INF = float("inf")
STAND_IN = "<explained>"  # added to a name some Pod already has: no Kubernetes name contains '<'


class RecutWait(NamedTuple):
    """The MIG re-cut a waiting Pod waits for: of which node, to which layout, and whether gpupool has
    asked for it already (the node's `gpupool.io/mig-reshape-asked`) or its leader would plan it."""

    node: str
    layout: str
    under_way: bool

    def describe(self) -> str:
        how = "under way" if self.under_way else "which the leader would ask mig-manager for"
        return f"a MIG re-cut of node {self.node} to {self.layout}, {how}"


class Outcome(NamedTuple):
    """One waiting Pod, where it stands, and what the pass would do with it now: a release or a wait."""

    queued: Queued
    position: int  # 1-based, in the whole queue's release order
    release: Release | None  # the pool the leader would release it to at its next pass
    wait: Wait | None  # else what it waits for (code and reason)
    constraints: str  # the release's constraints on the node, in kubectl's words ("" when it waits)
    recut: RecutWait | None = None  # a Pod that waits for capacity: the MIG re-cut it waits for, if any


def preview(  # noqa: PLR0913 (the pass's inputs beyond the queue and the index, by keyword)
    queued: Sequence[Queued],
    index: PoolIndex,
    policy: Policy,
    *,
    extra: Sequence[Queued] = (),
    now: float = INF,
    charges: Iterable[Charge] = (),
    made: float = 0.0,
) -> list[Outcome]:
    """Every Pod of `queued` (and of `extra`, as if they were queued now) in release order, with what one
    pass of `plan` on `index` would do with it, and the MIG re-cut a Pod waits for (`now`, the wall clock,
    for how long ago gpupool changed a node; by default every change is old enough). `charges`: those of
    Pods that name their node, counted as the leader counts them (`pending`) while they have not expired at
    `now`; `made`: the index's clock. The index is left as it was. No key of `extra` may be one of a Pod the
    index or the queue holds (it would stand for that Pod)."""
    order = sorted([*queued, *extra], key=lambda q: q.order)
    for pod in extra:
        index.upsert_pod(pod.info, pod.key)
    try:
        # Every Pod judged in one pass: the leader's batch limit only splits its writes into passes.
        batch = read_batch(order, policy)
        with pending(index, charges, now, made, releases=False):  # as the leader counts them
            decided = decide_batch(batch, index, policy, limit=max(len(order), 1))
            try:
                constraints = {r.queued.key: _constraints(index, r) for r in decided.releases}
                recuts = recut_waits(index, policy, batch.request_of(), decided.waits, now)
            finally:
                for release in reversed(decided.releases):
                    settle(index, release, None)
    finally:
        for pod in extra:
            index.remove_pod(pod.key)
    releases = {r.queued.key: r for r in decided.releases}
    waits = {w.queued.key: w for w in decided.waits}
    return [
        Outcome(q, i, releases.get(q.key), waits.get(q.key), constraints.get(q.key, ""), recuts.get(q.key))
        for i, q in enumerate(order, start=1)
    ]


def recut_waits(
    index: PoolIndex, policy: Policy, requests: RequestOf, waits: Sequence[Wait], now: float
) -> dict[PodKey, RecutWait]:
    """The MIG re-cut each Pod that waits for capacity waits for, as the leader's planner decides it on this
    view (webhook.queue.reshape_inputs): changes gpupool asked for and that are under way (from the nodes'
    annotations), then those it would ask for. The leader's memory of how long a node has been idle is its
    own: here every idle node counts as idle long enough. Empty without `migReshaping` or mig-parted's config."""
    settings, layouts = policy.mig_reshaping, index.mig.layouts
    demand = demand_of(waits, requests) if settings is not None and layouts is not None else []
    if settings is None or layouts is None or not demand:
        return {}
    nodes = [n for n in index.capacity.gpu_nodes() if is_mig(n)]
    changing = {
        n.name: asked.layout
        for n in nodes
        if (asked := asked_of(n.annotations)) is not None and under_way(n.annotations)
    }
    planned = recut_plan(
        index,
        nodes,
        demand,
        layouts,
        settings,
        busy=busy_of(index, nodes),
        changing=changing,
        idle_since=lambda _: None,
        now=now,
    )
    to = {c.node: c.to_layout for c in planned.changes}
    out: dict[PodKey, RecutWait] = {}
    for pod, node in planned.waits.items():
        namespace, _, name = pod.partition("/")
        out[(namespace, name)] = RecutWait(node, changing.get(node) or to.get(node, ""), node in changing)
    return out


def _constraints(index: PoolIndex, release: Release) -> str:
    """What the release adds to send the Pod to its pool's nodes (the pool's constraint: the same the
    release's patch writes), in kubectl's words."""
    constraint = index.capacity.constraint(release.pool)
    return "" if isinstance(constraint, Inseparable) else constraint.text()


def arriving(
    pod: Mapping[str, Any], namespace: str, policy: Policy, now: datetime, taken: Collection[PodKey]
) -> Queued | None:
    """A Pod admission queues now, as the queue will hold it once kube-apiserver has stored it: `pod` with
    admission's patch applied, in `namespace`, created `now`, with its own `spec.priority`. Its key is a
    name no Pod of `taken` has (a stand-in when its own is taken, or not generated yet), so that it can be
    `preview`'s `extra` (add it to `taken` before the next of the same name). None when it does not wait
    behind the gate or requests no GPU."""
    obj = copy.deepcopy(dict(pod))
    meta = obj["metadata"] = dict(obj.get("metadata") or {})
    name = str(meta.get("name") or f"{meta.get('generateName', '')}<generated>")
    while (namespace, name) in taken:
        name += STAND_IN
    meta.update(namespace=namespace, name=name, creationTimestamp=now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return read_queued(obj, policy, 0.0)
