"""The planner: which opted-in, idle nodes to re-cut to which named layout, for the Pods that wait.

A pure function of plain values (`plan`), so the leader, `gpupool explain`, the tests and the bench run
the same rules:

1. **Free instances first.** Waiting Pods, in queue order, take the free MIG instances that fit them
   (the smallest fitting, on a node their constraints allow), as the queue's next release would. What
   they take is never planned for, and a node whose instances a Pod takes is not re-cut.
2. **Changes under way next.** A node gpupool is re-cutting already (its layout is changing) will
   offer its new layout's instances: Pods that fit there wait for it, and no second change is made for
   them. This is what keeps a burst of demand from re-cutting more nodes than it needs.
3. **Then new changes**, at most `max_in_flight` under way at once (those in step 2 included), each on
   a node that: the admin labelled `gpupool.io/mig-reshape=true`; runs no GPU Pod and has none released
   to it; has had none for `idle_seconds`; whose last change gpupool asked for is `idle_seconds` old or
   more; whose `nvidia.com/mig.config.state` is not `pending`, `rebooting` or `failed` (a failed node
   waits for an admin); whose last change, written `stuck`, does not hold it (webhook.mig.follow:
   its label still names the layout asked, which it does not show); whose GPU model and count gpupool
   knows. Each round takes the (node, layout) that serves the most waiting GPU memory (a Pod counts the
   memory of the smallest profile that fits it on that model), then the most Pods, then wastes the least
   (the layout's memory left idle), then by name; and stops when no change serves anyone. Greedy by what
   each change adds, so few nodes serve the most memory.
4. **Then drains** (unless `drain` is off). Within what `max_in_flight` leaves (and at most
   MAX_DRAINS), the nodes that would be chosen in step 3 if they were idle (they qualify but for running
   a GPU Pod, or for not having been idle for `idle_seconds`), for the Pods still unserved, chosen in
   the same way, a node drained at the last plan (`draining`) first, then of nodes alike the one whose
   Pods hold the fewest devices (`in_use`, the soonest idle): the leader keeps them from new Pods (drain
   by not filling: their Pods finish and none takes their place), so that they become idle, and a later
   plan re-cuts them. Nothing is evicted.

The output says, for each change, the node, its layout now and the one chosen, and which Pods it is
for; and for each waiting Pod whether free instances serve it or it waits for the re-cut of a node.
Nodes skipped say why (`Plan.skipped`), for `gpupool explain` and Events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from webhook.domain.memory import meets_memory, sold_mib
from webhook.domain.policy_model import MigReshaping
from webhook.mig.geometry import GpuModel
from webhook.mig.layouts import Layouts, Yield

RESHAPE_LABEL = "gpupool.io/mig-reshape"  # the admin's opt-in, `true`
CONFIG_LABEL = "nvidia.com/mig.config"  # the layout mig-manager applies
STATE_LABEL = "nvidia.com/mig.config.state"  # mig-manager's report
HANDS_OFF_STATES = ("pending", "rebooting", "failed")
MAX_DEMAND = 5000  # waiting Pods planned for, first in queue order: a plan's cost stays bounded
# Nodes drained at once (step 4), whatever maxInFlight allows: each is named in every release into its pool
# (`kubernetes.io/hostname NotIn`), far below the 256 values gpupool reads of one requirement.
MAX_DRAINS = 32


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting Pod as the planner sees it: the memory one instance must have, how many it needs on one
    node, and where its own constraints let it go (None: anywhere)."""

    pod: str  # namespace/name
    memory_mib: int
    count: int = 1
    models: frozenset[str] | None = None  # GPU models (webhook.mig.geometry names) it may use
    nodes: frozenset[str] | None = None
    # The one MIG profile it may get ("" any): the device resource admission fixed (nvidia.com/mig-3g.40gb).
    profile: str = ""


@dataclass(frozen=True, slots=True)
class Free:
    """Free instances of one profile on one node (what the pool index says is free now)."""

    node: str
    model: str  # GPU model name; "" when gpupool knows no geometry of it
    profile: str
    memory_mib: int
    count: int


@dataclass(frozen=True, slots=True)
class Candidate:
    """A MIG node as its labels and Pods show it."""

    name: str
    product: str  # nvidia.com/gpu.product
    gpus: int  # nvidia.com/gpu.count
    opted_in: bool  # gpupool.io/mig-reshape=true
    layout: str  # nvidia.com/mig.config now
    state: str  # nvidia.com/mig.config.state
    busy: bool  # a Pod using its GPUs runs there, or was released to it and is not bound yet
    idle_since: float | None = None  # when it last stopped being busy; None: not since anyone looked
    changed_at: float | None = None  # when gpupool last asked for a change of it; None: never
    changing: str = ""  # the layout a change gpupool asked for will leave, while it is under way
    held: str = ""  # why its last change, written stuck, holds it (webhook.mig.follow.stuck_hold); "" when not
    draining: bool = False  # the last plan drained it (step 4)
    in_use: int = 0  # devices its Pods hold now: of nodes alike, the one with fewest is drained first


@dataclass(frozen=True, slots=True)
class Change:
    node: str
    from_layout: str
    to_layout: str
    pods: tuple[str, ...]  # the waiting Pods it is for, in queue order
    memory_mib: int  # their GPU memory
    yields: str  # what the layout leaves there ("2 x 3g.40gb")


@dataclass(frozen=True, slots=True)
class Plan:
    changes: tuple[Change, ...] = ()
    waits: Mapping[str, str] = field(default_factory=dict)  # Pod -> node whose re-cut it waits for
    served_by_free: frozenset[str] = frozenset()
    skipped: Mapping[str, str] = field(default_factory=dict)  # node -> why it is not re-cut now
    draining: Mapping[str, str] = field(default_factory=dict)  # node -> the layout it is drained for (step 4)


@dataclass(slots=True)
class _Slot:
    """Instances of one profile a node offers (or will), as assignment uses them up."""

    profile: str
    memory_mib: int
    count: int


def plan(
    demand: Sequence[Waiting],
    free: Iterable[Free],
    candidates: Iterable[Candidate],
    *,
    layouts: Layouts,
    settings: MigReshaping,
    now: float,
) -> Plan:
    """The changes to make now, and what each waiting Pod waits for (see the module's docstring)."""
    waiting = list(demand[:MAX_DEMAND])
    nodes = sorted(candidates, key=lambda c: c.name)
    models = {c.name: layouts.catalog.model_of(c.product) for c in nodes}
    # 1. free instances
    slots_by_node: dict[str, list[_Slot]] = {}
    model_of_node: dict[str, str] = {}
    for f in free:
        if f.count > 0:
            slots_by_node.setdefault(f.node, []).append(_Slot(f.profile, f.memory_mib, f.count))
            model_of_node[f.node] = f.model
    claimed: set[str] = set()
    served: set[str] = set()
    for pod in waiting:
        node = _take(pod, slots_by_node, model_of_node)
        if node is not None:
            served.add(pod.pod)
            claimed.add(node)
    unserved = [p for p in waiting if p.pod not in served]
    # 2. changes under way
    waits: dict[str, str] = {}
    in_flight = 0
    for c in nodes:
        if not c.changing:
            continue
        in_flight += 1
        coming = layouts.on(c.product, c.gpus).get(c.changing)
        if isinstance(coming, Yield):
            for pod in _assign(unserved, c.name, coming):
                waits[pod.pod] = c.name
    unserved = [p for p in unserved if p.pod not in waits]
    # 3. new changes
    skipped: dict[str, str] = {}
    eligible: list[_Eligible] = []
    drainable: list[_Eligible] = []
    for c in nodes:
        model = models[c.name]
        why = _why_not(c, model, claimed, settings, now)
        not_idle = bool(why) and not _why_not(c, model, claimed, settings, now, idle=False)
        usable = {} if why and not not_idle else layouts.usable(c.product, c.gpus)
        usable = {n: y for n, y in usable.items() if n != c.layout}
        if not why and not usable:
            why = "no layout gpupool may choose applies to its GPUs"
        not_idle = not_idle and bool(usable)
        if why:
            skipped[c.name] = why
        if model is not None and (not why or not_idle):
            (drainable if why else eligible).append((c, model, usable))
    changes: list[Change] = []
    budget = settings.max_in_flight - in_flight
    for c, name, chosen, pods in _rounds(unserved, eligible, budget):
        changes.append(
            Change(c.name, c.layout, name, tuple(p.pod for p in pods), _memory(chosen, pods), chosen.describe())
        )
        waits.update((p.pod, c.name) for p in pods)
    unserved = [p for p in unserved if p.pod not in waits]
    budget -= len(changes)
    left = [e for e in eligible if e[0].name not in {ch.node for ch in changes}]
    if budget <= 0 and unserved and left:
        for c, _, _ in left:
            skipped.setdefault(c.name, f"{settings.max_in_flight} changes are under way already (maxInFlight)")
    # 4. drains: the nodes drained last time first, so a drain is not moved from node to node
    draining: dict[str, str] = {}
    drainable.sort(key=lambda e: (e[0].in_use, e[0].name))
    if not settings.drain:
        drainable = []
    again = [e for e in drainable if e[0].draining]
    for group in (again, [e for e in drainable if not e[0].draining]):
        for c, name, _, pods in _rounds(unserved, group, min(budget, MAX_DRAINS) - len(draining)):
            draining[c.name] = name
            waits.update((p.pod, c.name) for p in pods)
            skipped[c.name] += f"; kept from new Pods until it is idle, for a re-cut to {name}"
        unserved = [p for p in unserved if p.pod not in waits]
    return Plan(tuple(changes), waits, frozenset(served), skipped, draining)


_Eligible = tuple[Candidate, GpuModel, dict[str, Yield]]


def _rounds(
    unserved: list[Waiting], eligible: list[_Eligible], budget: int
) -> list[tuple[Candidate, str, Yield, list[Waiting]]]:
    """Greedy rounds of `_best`: at most `budget` (node, layout, Pods it serves), each node once, each Pod
    once, until none serves anyone."""
    out: list[tuple[Candidate, str, Yield, list[Waiting]]] = []
    while len(out) < budget and unserved and eligible:
        best = _best(unserved, eligible)
        if best is None:
            break
        out.append(best)
        taken = {p.pod for p in best[3]}
        unserved = [p for p in unserved if p.pod not in taken]
        eligible = [e for e in eligible if e[0].name != best[0].name]
    return out


def _memory(chosen: Yield, pods: list[Waiting]) -> int:
    return sum(_need(chosen.model, p) for p in pods)


def _why_not(
    c: Candidate, model: GpuModel | None, claimed: set[str], s: MigReshaping, now: float, *, idle: bool = True
) -> str:
    """Why gpupool may not re-cut the node now ("" when it may); with `idle` False, whether it is idle is
    not asked (step 4: it may be drained)."""
    if not c.opted_in:
        return f"not opted in ({RESHAPE_LABEL}=true)"
    if c.changing:
        return f"its change to {c.changing} is under way"
    if c.state in HANDS_OFF_STATES:
        return f"{STATE_LABEL}={c.state}" + (": an admin must clear it" if c.state == "failed" else "")
    if c.held:
        return c.held
    if idle and c.busy:
        return "a Pod uses its GPUs, or was released to it"
    if c.name in claimed:
        return "a waiting Pod takes its free instances"
    if idle and c.idle_since is not None and now - c.idle_since < s.idle_seconds:
        return f"idle for {max(now - c.idle_since, 0):.0f}s, less than idleSeconds {s.idle_seconds:g}"
    if c.changed_at is not None and now - c.changed_at < s.idle_seconds:
        return f"gpupool changed it {max(now - c.changed_at, 0):.0f}s ago, less than idleSeconds {s.idle_seconds:g}"
    if model is None:
        return "gpupool knows no MIG geometry of its GPU model"
    return ""


def _best(
    unserved: list[Waiting], eligible: list[tuple[Candidate, GpuModel, dict[str, Yield]]]
) -> tuple[Candidate, str, Yield, list[Waiting]] | None:
    """The (node, layout) that serves the most waiting memory now. Nodes of one kind that the same Pods
    may use give the same answer, so one of them (the first in `eligible`'s order) is tried per kind."""
    restricted: dict[str, list[str]] = {}
    names = {c.name for c, _, _ in eligible}
    for p in unserved:
        if p.nodes is not None:
            for n in p.nodes & names:
                restricted.setdefault(n, []).append(p.pod)
    seen: set[tuple[str, int, str, tuple[str, ...]]] = set()
    best: tuple[tuple[int, int, int, int, str], tuple[Candidate, str, Yield, list[Waiting]]] | None = None
    for order, (c, model, usable) in enumerate(eligible):
        kind = (model.name, c.gpus, c.layout, tuple(restricted.get(c.name, ())))
        if kind in seen:
            continue
        seen.add(kind)
        for name, chosen in sorted(usable.items()):
            pods = _assign(unserved, c.name, chosen)
            if not pods:
                continue
            memory = sum(_need(model, p) for p in pods)
            key = (-memory, -len(pods), chosen.memory_mib - memory, order, name)
            if best is None or key < best[0]:
                best = (key, (c, name, chosen, pods))
    return None if best is None else best[1]


def _assign(pods: Iterable[Waiting], node: str, chosen: Yield) -> list[Waiting]:
    """The Pods (in queue order) that `chosen`'s instances on `node` would take, each the smallest
    instance that fits it."""
    slots = {node: [_Slot(p.name, p.memory_mib, n) for p, n in chosen.instances]}
    model_of = {node: chosen.model.name}
    return [p for p in pods if _take(p, slots, model_of) is not None]


def _take(pod: Waiting, slots_by_node: dict[str, list[_Slot]], model_of_node: Mapping[str, str]) -> str | None:
    """Give the Pod the smallest fitting instances of one profile on one node it may use (taking them
    from `slots_by_node`); the node, or None when none fits."""
    best: tuple[int, str, _Slot] | None = None
    for node, slots in slots_by_node.items():
        if pod.nodes is not None and node not in pod.nodes:
            continue
        if pod.models is not None and model_of_node.get(node, "") not in pod.models:
            continue
        for slot in slots:
            if pod.profile and slot.profile != pod.profile:
                continue
            if slot.count >= pod.count and meets_memory(pod.memory_mib, sold_mib(slot.profile), slot.memory_mib):
                key = (slot.memory_mib, node, slot)
                if best is None or key[:2] < best[:2]:
                    best = key
    if best is None:
        return None
    best[2].count -= pod.count
    return best[1]


def _need(model: GpuModel, pod: Waiting) -> int:
    """The GPU memory the Pod is served on `model`: its smallest fitting profile's, times its count."""
    profile = model.profiles.get(pod.profile) if pod.profile else model.smallest_fitting(pod.memory_mib)
    return (profile.memory_mib if profile else pod.memory_mib) * pod.count
