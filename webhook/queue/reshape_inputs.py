"""What the leader's MIG re-cuts (webhook.queue.reshape) read and write, as plain functions: the planner's
inputs from the pool index and the queue's waits (which Pods wait, which instances are free, which nodes
are busy), and the PATCH that asks mig-manager for a layout. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.admission.recut import PRODUCT_LABEL, candidate_of, waiting_of
from webhook.admission.request import GpuRequest
from webhook.domain.model import NodeInfo
from webhook.domain.policy_model import MigReshaping
from webhook.mig.follow import ASKED_ANNOTATION, OUTCOME_ANNOTATION, asked_of, under_way
from webhook.mig.layouts import Layouts
from webhook.mig.planner import (
    CONFIG_LABEL,
    HANDS_OFF_STATES,
    MAX_DEMAND,
    RESHAPE_LABEL,
    STATE_LABEL,
    Change,
    Free,
    Plan,
    plan,
)
from webhook.pools.index import PoolIndex
from webhook.pools.nodes import NodeFacts
from webhook.queue.lines import Waits
from webhook.queue.release import Wait
from webhook.queue.waiting import Queued

TERMINAL = ("Succeeded", "Failed")


def ask_patch(obj: Mapping[str, Any], layout: str, asked: str) -> list[dict[str, Any]]:
    """The JSON Patch that asks mig-manager for `layout`: the label and gpupool's asked annotation (an
    outcome of an earlier change removed), conditional on the node's resourceVersion as read."""
    meta = obj.get("metadata") or {}
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": str(meta.get("resourceVersion", ""))},
        {"op": "add", "path": "/metadata/labels/" + _escape(CONFIG_LABEL), "value": layout},
    ]
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ASKED_ANNOTATION: asked}})
        return ops
    ops.append({"op": "add", "path": annotation_path(ASKED_ANNOTATION), "value": asked})
    if OUTCOME_ANNOTATION in annotations:
        ops.append({"op": "remove", "path": annotation_path(OUTCOME_ANNOTATION)})
    return ops


def not_as_planned(obj: Mapping[str, Any], change: Change) -> str:
    """Why the node read is no longer the one the change was planned on ("" when it is)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if labels.get(RESHAPE_LABEL) != "true":
        return f"{RESHAPE_LABEL} is no longer true"
    if labels.get(CONFIG_LABEL, "") != change.from_layout:
        return f"{CONFIG_LABEL} is {labels.get(CONFIG_LABEL, '')!r} now, not {change.from_layout!r}"
    if labels.get(STATE_LABEL, "") in HANDS_OFF_STATES:
        return f"{STATE_LABEL}={labels.get(STATE_LABEL)}"
    if under_way(annotations):
        return "a change gpupool asked for is under way"
    return ""


RequestOf = Callable[[Queued], GpuRequest | None]  # a waiting Pod's request, as its pass read it (Batch.request_of)


def demand_of(waits: Iterable[Wait], request_of: RequestOf) -> list[tuple[str, str, GpuRequest]]:
    """The Pods ("namespace/name", uid, request) that wait for capacity and accept MIG instances, in queue
    order, the first MAX_DEMAND (what the planner plans for). Of a pass's Waits, only the runs of such Pods
    are read (webhook.queue.lines: a run's Pods share its Wait and their shape's request)."""

    def wanted(w: Wait) -> bool:
        req = request_of(w.queued)
        return w.code == "capacity" and req is not None and "mig" in req.devices

    out = []
    for w in waits.where(wanted) if isinstance(waits, Waits) else filter(wanted, waits):
        req = request_of(w.queued)
        if req is not None:  # (wanted: it has one)
            out.append((f"{w.queued.key[0]}/{w.queued.key[1]}", w.queued.uid, req))
        if len(out) >= MAX_DEMAND:
            break
    return out


def recut_plan(  # noqa: PLR0913 (the planner's inputs, by keyword)
    index: PoolIndex,
    nodes: list[NodeInfo],
    demand: list[tuple[str, str, GpuRequest]],
    layouts: Layouts,
    settings: MigReshaping,
    *,
    busy: set[str],
    changing: Mapping[str, str],
    idle_since: Callable[[str], float | None],
    now: float,
    draining: Collection[str] = (),
) -> Plan:
    """The planner (webhook.mig.planner) on the index: the waiting Pods, the free instances and the MIG
    nodes (`busy` ones, those `changing` to a layout, each idle since `idle_since(name)`, those `draining`
    since the last plan), for the leader
    (webhook.queue.reshape) and for what the queue's views say a Pod waits for (webhook.queue.preview)."""
    candidates = [
        replace(
            candidate_of(n, layouts),
            busy=n.name in busy,
            idle_since=idle_since(n.name),
            changed_at=asked.at if (asked := asked_of(n.annotations)) is not None else None,
            changing=changing.get(n.name, ""),
            draining=n.name in draining,
            in_use=sum((index.usage.used_on(n.name) or {}).values()),
        )
        for n in nodes
    ]
    waiting = [waiting_of(pod, req, nodes) for pod, _, req in demand]
    return plan(waiting, list(free_of(index, nodes, layouts)), candidates, layouts=layouts, settings=settings, now=now)


def free_of(index: PoolIndex, nodes: list[NodeInfo], layouts: Layouts) -> Iterable[Free]:
    for node in nodes:
        model = layouts.catalog.model_of(node.labels.get(PRODUCT_LABEL, ""))
        for resource in node.allocatable:
            facts = index.capacity.node_facts(node.name, resource)
            if isinstance(facts, NodeFacts) and facts.kind == "mig" and facts.usable:
                free = index.capacity.node_free(facts)
                if free > 0:
                    yield Free(node.name, model.name if model else "", facts.profile, facts.offered_mib, free)


def busy_of(index: PoolIndex, nodes: list[NodeInfo]) -> set[str]:
    """The MIG nodes a Pod holds GPUs of, or that a Pod released (or admitted) and not bound yet may land
    on: one pinned to a pool of theirs, or to no pool, asking a resource they offer, and whose node
    affinity lets it go there (a release that excludes a drained node leaves it idle)."""
    labels = {n.name: n.labels for n in nodes}
    pools: dict[str, set[str]] = {}
    offers: dict[str, set[str]] = {}
    for node in nodes:
        for resource in node.allocatable:
            offers.setdefault(resource, set()).add(node.name)
            facts = index.capacity.node_facts(node.name, resource)
            if isinstance(facts, NodeFacts):
                pools.setdefault(str(facts.pool), set()).add(node.name)
    busy = {n.name for n in nodes if any((index.usage.used_on(n.name) or {}).values())}
    for key in index.usage.pod_keys():
        pod = index.usage.pod_info(key)  # the unbound ones
        if pod is None or pod.queued or pod.phase in TERMINAL or not any(pod.gpu_requests.values()):
            continue
        if pod.node:
            busy.add(pod.node)
            continue
        reach: set[str] = set()
        if pod.pool:
            reach = pools.get(pod.pool, set())
        else:
            for resource, n in pod.gpu_requests.items():
                if n:
                    reach |= offers.get(resource, set())
        busy |= {name for name in reach if pod.requirements.matches(name, labels[name])}
    return busy


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def annotation_path(key: str) -> str:
    return "/metadata/annotations/" + _escape(key)
