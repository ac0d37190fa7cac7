"""The leader's MIG re-cuts (docs/mig.md): plan for the Pods that wait, ask mig-manager, follow each change.

With the policy's `migReshaping`, each pass of the queue's leader (webhook.queue.runner) calls `step` after
deciding its releases, at most every PLAN_SECONDS:

1. **Follow** every change gpupool asked for (webhook.mig.follow, from the node's own annotations, so a new
   leader after failover carries on): under way, nothing is released to the node (webhook.pools.nodes
   counts it not usable); ended (done, failed, stuck, superseded), the outcome is written on the node
   (`gpupool.io/mig-reshape-outcome`), which lets the node serve again (the queue releases into the new
   layout's pools), an Event is posted on the node and, when it did not end done, on the Pods that waited
   for it, and `gpupool_mig_reshapes_total{outcome}` counts it. A change written stuck that the node
   shows done since (mig-manager or GFD slower than `timeoutSeconds`) is written done then, told and
   counted; until then, or until someone labels another layout, the planner leaves the node alone
   (webhook.mig.follow.stuck_hold).
2. **Plan** (webhook.mig.planner) on the Pods that wait for capacity and accept MIG instances, the free
   instances and the MIG nodes, as the index shows them after this pass's releases.
3. **Fence, then ask.** For each change, the node is first counted as being re-cut in the index (the
   label and the asked annotation the PATCH will write, applied to the node as the index holds it, kept
   until the watch shows the node written), so no later pass releases to it; then the node is read and,
   if it is still as planned, PATCHed with the resourceVersion read: `nvidia.com/mig.config` and
   `gpupool.io/mig-reshape-asked: "<layout>@<time>"` together. A conflict (409) or a node no longer as
   planned undoes the fence: the next plan decides again.

4. **Drain by not filling.** The nodes the plan drains (webhook.mig.planner, step 4: they would be re-cut
   for the Pods that wait but run GPU Pods, or have not been idle for `idleSeconds`) are kept from new
   Pods in the index (`PoolIndex.exclude_nodes`): no release counts their room, and every release into
   their pools leaves them out by hostname, so their Pods finish, none takes their place, and a later plan
   re-cuts them. A node stays drained until a plan no longer drains it (it was re-cut, or the demand for
   it went), and none is without `migReshaping`. The nodes chosen for a re-cut are kept the same way from
   their fence until the change has ended, so no Pod released into one of their pools for room elsewhere
   is bound there meanwhile.

Only the leader's process runs it; a node is idle for the planner when no Pod holds its GPUs, none
released to one of its pools waits to be bound, and it has been so for `idleSeconds` since this leader
first looked (a new leader waits that long before its first re-cut).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from webhook.admission.recut import is_mig
from webhook.admission.request import GpuRequest
from webhook.domain.model import NodeInfo
from webhook.domain.policy import Policy
from webhook.domain.policy_model import MigReshaping
from webhook.mig.config import MigConfig, MigConfigError, parse_config
from webhook.mig.follow import (
    ASKED_ANNOTATION,
    DONE,
    FAILED,
    IN_FLIGHT,
    OUTCOME_ANNOTATION,
    STUCK,
    SUPERSEDED,
    Asked,
    asked_of,
    asked_text,
    done_late,
    recorded,
    shows_named,
    status,
    under_way,
)
from webhook.mig.layouts import Layouts
from webhook.mig.planner import (
    CONFIG_LABEL,
    STATE_LABEL,
    Change,
    Plan,
)
from webhook.pools.index import PoolIndex
from webhook.queue.release import Wait
from webhook.queue.reshape_inputs import (
    RequestOf,
    annotation_path,
    ask_patch,
    busy_of,
    demand_of,
    not_as_planned,
    recut_plan,
)
from webhook.sources.eventqueue import Event
from webhook.sources.outcomes import Conflict, Released, ReleaseResult

log = logging.getLogger("gpupool.mig")

PLAN_SECONDS = 2.0  # the planner runs at most this often (passes may follow each other within milliseconds)
CONFIG_SECONDS = 30.0  # mig-parted's ConfigMap is read again at most this often
FENCE_SECONDS = 60.0  # a fence the watch never shows (the node written since by someone else) is dropped then
DRAINS = "mig-drains"  # the index's name for the nodes the re-cuts keep from new Pods (PoolIndex.exclude_nodes)
EVENT_NAMESPACE = "default"  # where Events on nodes (cluster-scoped) are created, as kubelet's are


class NodeApi(Protocol):
    """Node reads and writes (webhook.sources.writes.NodeLabeler)."""

    def read(self, name: str) -> dict[str, Any] | None: ...

    def patch(self, name: str, patch: list[dict[str, Any]]) -> ReleaseResult: ...


class ConfigSource(Protocol):
    """mig-parted's config text (webhook.sources.writes.ConfigMapText); raises OSError when unreadable."""

    def read(self, namespace: str, name: str) -> str: ...


class Events(Protocol):
    def record(self, event: Event) -> None: ...


class ReshapeMetrics(Protocol):
    def mig_reshaped(self, outcome: str) -> None: ...


class Inventory(Protocol):
    def read(self) -> AbstractContextManager[PoolIndex]: ...


@dataclass(frozen=True, slots=True)
class _Ended:
    node: NodeInfo
    outcome: str
    asked: Asked


class Reshaper:
    """The leader's MIG re-cuts (see the module's docstring). `waits_for` tells, for the queue's views,
    which node's re-cut a waiting Pod waits for."""

    def __init__(
        self,
        nodes: NodeApi,
        config: ConfigSource,
        events: Events,
        metrics: ReshapeMetrics,
        *,
        wall: Callable[[], float] = time.time,
        plan_seconds: float = PLAN_SECONDS,
    ) -> None:
        self._nodes, self._config, self._events, self._metrics = nodes, config, events, metrics
        self._wall = wall
        self._plan_seconds = plan_seconds
        self._started = wall()
        self._planned_at = float("-inf")
        self._fenced: dict[str, NodeInfo] = {}  # node -> what the index counts until the watch shows the write
        self._before: dict[str, NodeInfo] = {}  # node -> as the index held it before its fence
        self._ended: dict[str, tuple[Asked, str]] = {}  # (change, outcome) written, until the watch shows it
        self._for: dict[str, tuple[tuple[str, str], ...]] = {}  # node -> (Pod, uid) its change was for (this leader's)
        self._busy_at: dict[str, float] = {}  # node -> when this leader last saw a Pod hold its GPUs
        self._read: tuple[float, tuple[str, str], str] | None = None  # when, which ConfigMap, its text
        self._layouts: tuple[str, tuple[str, ...], Layouts] | None = None
        self._uids: dict[str, str] = {}  # "namespace/name" -> uid, of the Pods the last plan was for
        self._fenced_at: dict[str, float] = {}
        self.problem = ""  # why no plan can be made (the ConfigMap unreadable or invalid), "" when one can
        self.waits_for: dict[str, str] = {}  # "namespace/name" -> the node whose re-cut the Pod waits for
        self.draining: dict[str, str] = {}  # node -> the layout it is drained for (kept from new Pods)
        self.active = False  # the last step had MIG demand waiting or a change under way: passes must go on

    def fence(self, index: PoolIndex) -> None:
        """Keep counting nodes being re-cut as such until the watch shows gpupool's write (under the lock)."""
        for name, ours in list(self._fenced.items()):
            current = index.capacity.node(name)
            if current is None or self._wall() - self._fenced_at.get(name, 0.0) > FENCE_SECONDS:
                del self._fenced[name]
                self._before.pop(name, None)
            elif current is ours:
                continue
            elif asked_of(current.annotations) == asked_of(ours.annotations) and under_way(current.annotations):
                del self._fenced[name]  # the watch shows the write
                self._before.pop(name, None)
            else:  # an older version of the node (or one the write never reached): fenced again
                self._before[name] = current
                index.upsert_node(replace(current, labels=ours.labels, annotations=ours.annotations))
                self._fenced[name] = index.capacity.node(name) or ours

    def step(self, policy: Policy, requests: RequestOf, waits: Iterable[Wait], inventory: Inventory) -> None:
        """Follow, plan and ask, as the module's docstring says; a no-op without `migReshaping`."""
        settings = policy.mig_reshaping
        if settings is None:
            self.waits_for, self.active = {}, False
            if self.draining:
                self.draining = {}
                with inventory.read() as index:
                    index.exclude_nodes(DRAINS, ())
            return
        now = self._wall()
        demand = demand_of(waits, requests)
        if now - self._planned_at < self._plan_seconds:
            # Not planned now: MIG demand that came meanwhile keeps the passes going until it is.
            self.active = self.active or bool(demand)
            return
        self._planned_at = now
        layouts = self._layouts_of(settings, now)
        with inventory.read() as index:
            self.fence(index)
            mig_nodes = [n for n in index.capacity.gpu_nodes() if is_mig(n)]
            ended, changing = self._follow(mig_nodes, layouts, settings, now)
            # A change that ended in this step still counts as under way until its outcome is written (the
            # node serves again only then): one done will offer its layout, so Pods wait for it rather than
            # have it re-cut again; one that did not end done is left alone.
            changing.update((e.node.name, e.asked.layout) for e in ended if e.outcome == DONE)
            left = {e.node.name for e in ended if e.outcome != DONE}
            mig_nodes = [n for n in mig_nodes if n.name not in left]
            # Before planning, a node whose change has ended serves again: its instances count as free.
            index.exclude_nodes(DRAINS, set(changing) | set(self._fenced) | set(self.draining))
            result = Plan()
            if layouts is not None and (demand or changing):
                result = self._plan(
                    index=index,
                    nodes=mig_nodes,
                    demand=demand,
                    layouts=layouts,
                    settings=settings,
                    changing=changing,
                    now=now,
                )
            for change in result.changes:
                node = index.capacity.node(change.node)
                if node is not None:
                    self._fence_one(index, node, change.to_layout, now)
            self.draining = dict(result.draining)
            # Kept from every release: the nodes drained, and those chosen for a re-cut until it has ended
            # (out of their pools' room already, but kube-scheduler could still bind a Pod released into a
            # pool of theirs for room on another node there, before mig-manager pauses the device plugin).
            chosen = {c.node for c in result.changes} | set(changing) | set(self._fenced)
            index.exclude_nodes(DRAINS, chosen | set(self.draining))
        self.active = bool(demand or changing or ended or self._fenced or self.draining)
        for e in ended:
            self._end(e, now)
        written = {e.node.name for e in ended if e.node.name in self._ended}
        if written:  # their outcome written, they serve again (from the watch's next sight of them)
            with inventory.read() as index:
                index.exclude_nodes(DRAINS, index.excluded_by(DRAINS) - written)
        for change in result.changes:
            self._ask(change, now, inventory)
        self.waits_for = dict(result.waits)

    # --- following --------------------------------------------------------------------------------

    def _follow(
        self, nodes: list[NodeInfo], layouts: Layouts | None, settings: MigReshaping, now: float
    ) -> tuple[list[_Ended], dict[str, str]]:
        """Changes that ended since the last look, and the layouts of those under way (node -> layout)."""
        ended: list[_Ended] = []
        changing: dict[str, str] = {}
        for node in nodes:
            asked = asked_of(node.annotations)
            written = self._ended.get(node.name)
            if written is not None and written[0] == asked and written[1] != recorded(node.annotations):
                continue  # written already: the watch will show it
            if asked is None or OUTCOME_ANNOTATION in node.annotations:
                self._ended.pop(node.name, None)
                if (
                    asked is not None
                    and layouts is not None
                    and done_late(node.annotations, node.labels, node.allocatable, layouts)
                ):
                    ended.append(_Ended(node, DONE, asked))  # written stuck, done since: it is done after all
                continue
            shown = layouts is not None and shows_named(asked.layout, node.labels, node.allocatable, layouts)
            outcome = status(
                asked,
                label=node.labels.get(CONFIG_LABEL, ""),
                state=node.labels.get(STATE_LABEL, ""),
                shown=shown,
                now=now,
                timeout_seconds=settings.timeout_seconds,
            )
            if outcome == IN_FLIGHT:
                changing[node.name] = asked.layout
            elif node.name not in self._fenced:  # a fence not shown yet is this leader's own, still in flight
                ended.append(_Ended(node, outcome, asked))
        return ended, changing

    def _end(self, e: _Ended, now: float) -> None:
        """Write the outcome on the node (which lets it serve again), tell and count it."""
        name = e.node.name
        value = asked_text(e.outcome, now)
        result = self._nodes.patch(name, [{"op": "add", "path": annotation_path(OUTCOME_ANNOTATION), "value": value}])
        if not isinstance(result, Released):
            log.warning("could not write the outcome %s of the re-cut of %s: %s", e.outcome, name, result)
            return
        self._ended[name] = (e.asked, e.outcome)
        self._metrics.mig_reshaped(e.outcome)
        pods = self._for.pop(name, ())
        layout = e.asked.layout
        uid = str((result.obj.get("metadata") or {}).get("uid", ""))
        if e.outcome == DONE:
            message = f"gpupool re-cut {name} to {layout}" + (f" for {len(pods)} waiting Pods" if pods else "")
            self._events.record(Event(EVENT_NAMESPACE, name, uid, "MigReshaped", message, involved="Node"))
            return
        why = {
            FAILED: f"mig-manager reports {STATE_LABEL}=failed; gpupool leaves the node alone until an admin clears it",
            STUCK: f"not done {now - e.asked.at:.0f}s after it was asked (timeoutSeconds); gpupool leaves it alone",
            SUPERSEDED: f"{CONFIG_LABEL} was changed by someone else; gpupool leaves the node to them",
        }.get(e.outcome, e.outcome)
        message = f"gpupool's re-cut of {name} to {layout} {e.outcome}: {why}"
        self._events.record(Event(EVENT_NAMESPACE, name, uid, "MigReshapeFailed", message, "Warning", "Node"))
        for pod, pod_uid in pods:
            namespace, _, pod_name = pod.partition("/")
            self._events.record(Event(namespace, pod_name, pod_uid, "MigReshapeFailed", message, "Warning"))

    # --- planning ---------------------------------------------------------------------------------

    def _plan(  # noqa: PLR0913 (the planner's inputs, by keyword)
        self,
        *,
        index: PoolIndex,
        nodes: list[NodeInfo],
        demand: list[tuple[str, str, GpuRequest]],
        layouts: Layouts,
        settings: MigReshaping,
        changing: Mapping[str, str],
        now: float,
    ) -> Plan:
        busy = busy_of(index, nodes)
        for name in busy:
            self._busy_at[name] = now
        self._uids = {pod: uid for pod, uid, _ in demand}
        return recut_plan(
            index,
            nodes,
            demand,
            layouts,
            settings,
            busy=busy,
            changing=changing,
            idle_since=lambda name: self._busy_at.get(name, self._started),
            now=now,
            draining=self.draining,
        )

    def _layouts_of(self, settings: MigReshaping, now: float) -> Layouts | None:
        """The layouts gpupool may choose, from mig-parted's ConfigMap read at most every CONFIG_SECONDS."""
        where = settings.config_map
        if self._read is None or self._read[1] != where or now - self._read[0] >= CONFIG_SECONDS:
            try:
                text = self._config.read(*where)
            except OSError as exc:
                self._problem(f"mig-parted's config cannot be read: {exc}")
                self._read, self._layouts = (now, where, ""), None
                return None
            self._read = (now, where, text)
        text = self._read[2]
        if not text:
            return None
        if self._layouts is None or self._layouts[0] != text or self._layouts[1] != settings.configs:
            try:
                config: MigConfig = parse_config(text)
            except MigConfigError as exc:
                self._problem(f"mig-parted's config {where[0]}/{where[1]} is not valid: {exc}")
                self._layouts = None
                self._read = (now, where, "")
                return None
            self._layouts = (text, settings.configs, Layouts.choosable(config, settings.configs))
        self.problem = ""
        return self._layouts[2]

    def _problem(self, text: str) -> None:
        if text != self.problem:
            log.warning("MIG re-cutting is off until this is fixed: %s", text)
        self.problem = text

    # --- asking -----------------------------------------------------------------------------------

    def _fence_one(self, index: PoolIndex, node: NodeInfo, layout: str, now: float) -> None:
        """Count the node as being re-cut to `layout` (the PATCH to come, applied to it) from now on."""
        annotations = {k: v for k, v in node.annotations.items() if k != OUTCOME_ANNOTATION}
        annotations[ASKED_ANNOTATION] = asked_text(layout, now)
        index.upsert_node(replace(node, labels={**node.labels, CONFIG_LABEL: layout}, annotations=annotations))
        self._before[node.name] = node
        self._fenced_at[node.name] = now
        self._fenced[node.name] = index.capacity.node(node.name) or node

    def _ask(self, change: Change, now: float, inventory: Inventory) -> None:
        """Read the node; if it is still as planned, PATCH the label and the asked annotation, conditional
        on the resourceVersion read. Anything else undoes the fence (the next plan decides again)."""
        name = change.node
        try:
            obj = self._nodes.read(name)
        except OSError as exc:
            log.warning("re-cut of %s not asked: %s", name, exc)
            self._undo(name, inventory, "error")
            return
        why = "it is gone" if obj is None else not_as_planned(obj, change)
        if obj is None or why:
            log.info("re-cut of %s to %s not asked: %s", name, change.to_layout, why)
            self._undo(name, inventory, "conflict")
            return
        result = self._nodes.patch(name, ask_patch(obj, change.to_layout, asked_text(change.to_layout, now)))
        if isinstance(result, Released):
            self._for[name] = tuple((p, self._uids.get(p, "")) for p in change.pods)
            self._metrics.mig_reshaped("asked")
            log.info("asked mig-manager to re-cut %s from %s to %s for %d Pods", name, change.from_layout or "-",
                     change.to_layout, len(change.pods))  # fmt: skip
            message = (
                f"gpupool asked mig-manager to re-cut {name} from {change.from_layout or 'no layout'} to "
                f"{change.to_layout} ({change.yields}) for {_count(change.pods)} waiting Pods"
            )
            uid = str((result.obj.get("metadata") or {}).get("uid", ""))
            self._events.record(Event(EVENT_NAMESPACE, name, uid, "MigReshaping", message, involved="Node"))
            for pod, pod_uid in self._for[name]:
                namespace, _, pod_name = pod.partition("/")
                told = f"waits for gpupool's re-cut of node {name} to {change.to_layout} ({change.yields})"
                self._events.record(Event(namespace, pod_name, pod_uid, "WaitsForMigReshape", told))
            return
        log.info("re-cut of %s not asked: %s", name, result)
        self._undo(name, inventory, "conflict" if isinstance(result, Conflict) else "error")

    def _undo(self, name: str, inventory: Inventory, outcome: str) -> None:
        """The change was not asked: the node counts as it was again (unless the watch showed it since)."""
        self._metrics.mig_reshaped(outcome)
        self._planned_at = float("-inf")  # plan again at the next pass
        fenced = self._fenced.pop(name, None)
        before = self._before.pop(name, None)
        if fenced is None or before is None:
            return
        with inventory.read() as index:
            if index.capacity.node(name) is fenced:
                index.upsert_node(before)


def _count(pods: tuple[str, ...]) -> str:
    return str(len(pods))
