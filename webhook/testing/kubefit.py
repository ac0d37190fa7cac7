"""Whether a Pod fits a node, as kube-scheduler's filter plugins decide it; and the view of the cluster
(nodes, what bound Pods hold on them) that the churn and the scheduler stand-in keep from the store.

`why_unfit(pod, node, bound)` is the one predicate, on raw Kubernetes JSON: None when the Pod fits, or
kube-scheduler's reason when it does not, checked in the default profile's order:

- NodeUnschedulable: a cordoned node (`spec.unschedulable`) unless the Pod tolerates
  `node.kubernetes.io/unschedulable:NoSchedule` — "node(s) were unschedulable";
- TaintToleration: every NoSchedule and NoExecute taint tolerated (ToleratesTaint: an empty effect
  matches all, an empty key with Exists matches all keys, Exists any value, Equal the same value). A node
  whose Ready condition is not True counts as carrying the taint the node lifecycle controller gives it
  (`node.kubernetes.io/not-ready`, or `unreachable` when Unknown or missing), NoSchedule — "node(s) had
  untolerated taint {key: value}";
- NodeAffinity: every nodeSelector label, and one of the required node-affinity terms (ORed; a term's
  expressions and fields ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt; NotIn and DoesNotExist match a
  missing label; a term with no requirement matches nothing) — "node(s) didn't match Pod's node
  affinity/selector";
- NodeResourcesFit: one more Pod within allocatable `pods`, and every resource the Pod requests (cpu,
  memory, ephemeral-storage, extended resources such as nvidia.com/gpu or nvidia.com/mig-1g.5gb) within
  allocatable minus what the node's bound, non-terminated Pods request — "Too many pods",
  "Insufficient <resource>".

A Pod's request is kube-scheduler's (resourcehelper.PodRequests): the containers' requests summed (a
request defaults to the limit, as the API defaults it), sidecars (init containers with restartPolicy
Always) added, the largest ordinary init container's need (with the sidecars started before it) taken
when larger, plus the overhead; pod-level `spec.resources.requests` replace the sum for the resources they
name. Quantities are Kubernetes quantities (`500m`, `1Gi`, `2e3`): cpu in millicores, the rest rounded up
to whole units, as Quantity.MilliValue and Value do.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from webhook.testing.kubestore import Event, Expired, Store, kind_of

Obj = dict[str, Any]
_NODES, _PODS = kind_of("nodes"), kind_of("pods")
TERMINAL = ("Succeeded", "Failed")
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT, UNREACHABLE_TAINT = "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"
PODS = "pods"  # the allocatable count of Pods, and each Pod's request of one
# The resources most Pods request: a free-capacity index of them would hold nearly every node.
_COMMON = frozenset(("cpu", "memory", "ephemeral-storage", PODS))
_NOTHING: Mapping[str, int] = {}

# -- quantities ----------------------------------------------------------------------------------------

_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")
_FACTORS = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"),
    "E": Decimal("1e18"), "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_MAX_QUANTITY_CHARS = 64


def quantity(value: Any, resource: str) -> int:
    """A quantity in the unit the scheduler counts `resource` in: millicores for cpu, rounded up to a
    whole unit for everything else. 0 for what is not a quantity (validation would have refused it)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        return _parse_quantity(repr(value), resource == "cpu")
    if isinstance(value, str) and len(value) <= _MAX_QUANTITY_CHARS:
        return _parse_quantity(value, resource == "cpu")
    return 0


@functools.lru_cache(maxsize=4096)  # a cluster's Pods use few distinct quantities: "500m", "1Gi", "1"
def _parse_quantity(text: str, milli: bool) -> int:
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return 0
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number) * (Decimal(f"1{suffix}") if suffix[:1] in ("e", "E") else _FACTORS[suffix])
    except (InvalidOperation, KeyError):
        return 0
    if milli:
        amount *= 1000
    return int(amount.to_integral_value(rounding="ROUND_CEILING"))


# -- what a Pod asks for, what a node offers -----------------------------------------------------------


def _requests(container: Mapping[str, Any]) -> Counter[str]:
    out: Counter[str] = Counter()
    _add_requests(out, container)
    return out


def _add_requests(total: dict[str, int], container: Mapping[str, Any]) -> None:
    """Add a container's requests (each defaulting to its limit) to `total`."""
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for name, value in requests.items():
        total[name] = total.get(name, 0) + quantity(value, name)
    for name, value in limits.items():
        if name not in requests:
            total[name] = total.get(name, 0) + quantity(value, name)


def _maximum(a: Counter[str], b: Counter[str]) -> Counter[str]:
    return Counter({k: max(a[k], b[k]) for k in {*a, *b}})


def pod_requests(spec: Mapping[str, Any]) -> Counter[str]:
    """resourcehelper.PodRequests (see the module's docstring), plus one of `pods`."""
    total: Counter[str] = Counter()
    for container in spec.get("containers") or []:
        _add_requests(total, container)
    if not spec.get("initContainers") and not spec.get("overhead") and not spec.get("resources"):
        fast = {name: n for name, n in total.items() if n > 0}  # the common case, spared the rest
        fast[PODS] = 1
        return Counter(fast)
    sidecars: Counter[str] = Counter()
    init_peak: Counter[str] = Counter()
    for container in spec.get("initContainers") or []:
        need = _requests(container)
        if container.get("restartPolicy") == "Always":
            sidecars.update(need)
            init_peak = _maximum(init_peak, sidecars)
        else:
            init_peak = _maximum(init_peak, sidecars + need)
    total.update(sidecars)
    total = _maximum(total, init_peak)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name, value in pod_level.items():
        total[name] = quantity(value, name)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] += quantity(value, name)
    total[PODS] = 1
    return +total  # drop the zeros: a zero request is never checked


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeFit:
    """What of a node the filters read: labels, name, taints (with the lifecycle controller's), whether
    it is cordoned, allocatable resources."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: Mapping[str, int]

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeFit:
        meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
        taints = [
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in spec.get("taints") or []
            if isinstance(t, Mapping)
        ]
        ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready != "True":
            key = NOT_READY_TAINT if ready == "False" else UNREACHABLE_TAINT
            if not any(t.key == key and t.effect == "NoSchedule" for t in taints):
                taints.append(Taint(key, "", "NoSchedule"))
        allocatable = {k: quantity(v, k) for k, v in (status.get("allocatable") or {}).items()}
        return cls(
            name=str(meta.get("name") or ""),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            taints=tuple(t for t in taints if t.effect in ("NoSchedule", "NoExecute")),
            unschedulable=bool(spec.get("unschedulable")),
            allocatable=allocatable,
        )


@dataclass(frozen=True, slots=True)
class PodNeed:
    """What of a Pod the filters read: its requests, tolerations, nodeSelector and required terms."""

    requests: Mapping[str, int]
    tolerations: tuple[Mapping[str, Any], ...]
    node_selector: Mapping[str, str]
    terms: tuple[Mapping[str, Any], ...] | None  # None: no required node affinity

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodNeed:
        spec = pod.get("spec") or {}
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        terms = None if not isinstance(affinity, Mapping) else tuple(affinity.get("nodeSelectorTerms") or ())
        return cls(
            requests=pod_requests(spec),
            tolerations=tuple(t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)),
            node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            terms=terms,
        )


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """v1.Toleration.ToleratesTaint."""
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.effect:
        return False
    if key and key != taint.key:
        return False
    operator = toleration.get("operator") or ""
    if operator in ("", "Equal"):
        return (toleration.get("value") or "") == taint.value
    return operator == "Exists"


def _requirement(req: Mapping[str, Any], value: str | None) -> bool:
    """One NodeSelectorRequirement against a label's value (None: the node lacks the label)."""
    operator, values = req.get("operator"), req.get("values") or []
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term(term: Mapping[str, Any], node: NodeFit) -> bool:
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False  # a term with no requirement matches no node
    return all(_requirement(r, node.labels.get(str(r.get("key")))) for r in exprs) and all(
        _requirement(r, node.name if r.get("key") == "metadata.name" else None) for r in fields
    )


def matches_node_affinity(need: PodNeed, node: NodeFit) -> bool:
    """The NodeAffinity filter: the nodeSelector, and one required term when there are any."""
    if any(node.labels.get(k) != v for k, v in need.node_selector.items()):
        return False
    return need.terms is None or any(_term(t, node) for t in need.terms if isinstance(t, Mapping))


def unfit_reason(need: PodNeed, node: NodeFit, used: Mapping[str, int]) -> str | None:
    """The filters in kube-scheduler's order; None when the Pod fits on the node beside `used`."""
    if node.unschedulable and not any(
        tolerates(t, Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")) for t in need.tolerations
    ):
        return "node(s) were unschedulable"
    for taint in node.taints:
        if not any(tolerates(t, taint) for t in need.tolerations):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    if not matches_node_affinity(need, node):
        return "node(s) didn't match Pod's node affinity/selector"
    if used.get(PODS, 0) + 1 > node.allocatable.get(PODS, 0):
        return "Too many pods"
    for name, amount in need.requests.items():
        if name != PODS and amount > node.allocatable.get(name, 0) - used.get(name, 0):
            return f"Insufficient {name}"
    return None


def why_unfit(pod: Mapping[str, Any], node: Mapping[str, Any], bound: Iterable[Mapping[str, Any]] = ()) -> str | None:
    """The predicate on raw JSON: None when `pod` fits on `node` beside the Pods in `bound` (those of
    them that are bound to it and not terminated count), else kube-scheduler's reason."""
    fit = NodeFit.of(node)
    used: Counter[str] = Counter()
    for other in bound:
        spec, status = other.get("spec") or {}, other.get("status") or {}
        if spec.get("nodeName") == fit.name and status.get("phase") not in TERMINAL:
            used.update(pod_requests(spec))
    return unfit_reason(PodNeed.of(pod), fit, used)


# -- the cluster as the store says it is -------------------------------------------------------------


@dataclass(slots=True)
class Placed:
    """A Pod as the view tracks it: where it is bound, what it requests, its phase."""

    node: str
    requests: Counter[str]
    phase: str

    @property
    def holds(self) -> bool:
        return bool(self.node) and self.phase not in TERMINAL


@dataclass
class ClusterView:
    """Nodes and what bound, non-terminated Pods hold on each, kept from the store's event log (its own
    writes and everyone else's). `follow()` catches up and returns the Pod events it saw (key, object or
    None for a deletion) for the caller to react to; on falling behind the history it re-reads all."""

    store: Store
    nodes: dict[str, NodeFit] = field(default_factory=dict)
    used: dict[str, Counter[str]] = field(default_factory=dict)
    pods: dict[str, Placed] = field(default_factory=dict)
    by_label: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    # extended resource -> the nodes with some of it free: a saturated fleet's few candidates, found fast
    with_free: dict[str, set[str]] = field(default_factory=dict)
    position: int = 0
    node_writes: int = 0  # node events applied: a caller sees that nodes changed

    def resync(self) -> Iterator[tuple[str, Obj]]:
        """Read everything anew; yields every Pod as (key, object), one at a time (150,000 decoded Pods
        would take gigabytes), having accounted for it. Iterate it whole, under the store's lock."""
        with self.store.changed:
            nodes, pods = self.store.snapshot(_NODES), self.store.snapshot(_PODS)
            self.position = max(nodes.rv, pods.rv)
        self.nodes.clear()
        self.used.clear()
        self.pods.clear()
        self.by_label.clear()
        self.with_free.clear()
        for name, body in zip(nodes.keys, nodes.bodies, strict=True):
            self.set_node(name, orjson.loads(body))
        for key, body in zip(pods.keys, pods.bodies, strict=True):
            pod = orjson.loads(body)
            self.set_pod(key, pod)
            yield key, pod

    def follow(self) -> list[tuple[str, Obj | None]] | None:
        """Apply the writes made since the last look; their Pod events, or None after a resync."""
        seen: list[tuple[str, Obj | None]] = []
        while True:
            try:
                events, reached = self.store.events_after(self.position, 10_000)
            except Expired:
                for _ in self.resync():
                    pass
                return None
            for event in events:
                pod = self.apply(event)
                if event.kind is _PODS:
                    seen.append((event.key, pod))
            self.position = reached
            if not events:
                return seen

    def apply(self, event: Event, obj: Obj | None = None) -> Obj | None:
        """Account for one write (`obj`: the written object when the caller has it decoded already)."""
        self.position = max(self.position, event.rv)
        if event.kind is _NODES:
            self.node_writes += 1
            if event.type == "DELETED":
                self.drop_node(event.key)
            else:
                self.set_node(event.key, obj if obj is not None else orjson.loads(event.body))
            return None
        if event.kind is not _PODS:
            return None
        if event.type == "DELETED":
            self.drop_pod(event.key)
            return None
        pod = obj if obj is not None else orjson.loads(event.body)
        self.set_pod(event.key, pod)
        return pod

    def set_node(self, name: str, node: Mapping[str, Any]) -> None:
        old = self.nodes.get(name)
        fit = NodeFit.of(node)
        if old is not None:
            for pair in old.labels.items():
                if fit.labels.get(pair[0]) != pair[1]:
                    self.by_label.get(pair, set()).discard(name)
        for pair in fit.labels.items():
            self.by_label.setdefault(pair, set()).add(name)
        self.nodes[name] = fit
        self.used.setdefault(name, Counter())
        if old is not None:
            for resource in old.allocatable.keys() - fit.allocatable.keys():
                self.with_free.get(resource, set()).discard(name)
        self._refresh_free(name)

    def drop_node(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        if old is not None:
            for pair in old.labels.items():
                self.by_label.get(pair, set()).discard(name)
            for resource in old.allocatable:
                self.with_free.get(resource, set()).discard(name)

    def _refresh_free(self, name: str, resources: Iterable[str] | None = None) -> None:
        fit = self.nodes.get(name)
        if fit is None:
            return
        used = self.used.get(name, _NOTHING)
        for resource in fit.allocatable if resources is None else resources:
            if resource in _COMMON:
                continue
            nodes = self.with_free.setdefault(resource, set())
            if fit.allocatable.get(resource, 0) > used.get(resource, 0):
                nodes.add(name)
            else:
                nodes.discard(name)

    def set_pod(self, key: str, pod: Mapping[str, Any]) -> Placed:
        self.drop_pod(key)
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        placed = Placed(str(spec.get("nodeName") or ""), pod_requests(spec), str(status.get("phase") or "Pending"))
        self.pods[key] = placed
        if placed.holds:
            used = self.used.setdefault(placed.node, Counter())
            for name, amount in placed.requests.items():
                used[name] += amount
            self._refresh_free(placed.node, placed.requests)
        return placed

    def drop_pod(self, key: str) -> None:
        old = self.pods.pop(key, None)
        if old is not None and old.holds:
            used = self.used.setdefault(old.node, Counter())
            for name, amount in old.requests.items():
                used[name] -= amount
            self._refresh_free(old.node, old.requests)

    def candidates(self, need: PodNeed) -> list[str]:
        """The nodes that could fit: those with the rarest of the nodeSelector's labels and some of each
        extended resource the Pod requests free, by name; with neither, all (in the order the view learnt
        them: by name, then as they came). Only a superset: `unfit` decides."""
        sets = [self.by_label.get(pair, set()) for pair in need.node_selector.items()]
        sets += [self.with_free.get(r, set()) for r, n in need.requests.items() if n > 0 and r not in _COMMON]
        if not sets:
            return list(self.nodes)
        sets.sort(key=len)
        smallest = sets[0]
        return sorted(n for n in smallest if all(n in other for other in sets[1:]))

    def unfit(self, need: PodNeed, node: str) -> str | None:
        fit = self.nodes.get(node)
        return "node(s) not found" if fit is None else unfit_reason(need, fit, self.used.get(node, _NOTHING))
