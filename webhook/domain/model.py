"""The domain: what gpupool knows about nodes, Pods and quotas, as frozen values.

These are projections of Kubernetes objects down to the fields a placement decision needs. They are
built from raw JSON by `webhook.pools.kubeobj` (for the snapshot file and the watch cache alike) and never
hold a reference to the raw object, so 150,000 Pods stay small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from webhook.domain.affinity import NO_REQUIREMENTS, NodeRequirements
from webhook.domain.cut import Cut

PREFIX = "gpupool.io/"  # every annotation gpupool reads or writes
POOL_ANNOTATION = f"{PREFIX}pool"  # where gpupool records the pool it placed a Pod in
QUEUE_GATE = f"{PREFIX}queue"  # the scheduling gate a Pod waits behind until the queue releases it


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint. `value` is "" when the taint has none, as Kubernetes treats it."""

    key: str
    value: str
    effect: str


class Toleration(NamedTuple):
    """A Pod toleration, with Kubernetes' defaults filled in (operator Equal, any effect). (A NamedTuple:
    every admitted Pod's tolerations are read into these, and it is several times cheaper to build than
    a frozen dataclass.)"""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' matching rule (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
        if (self.effect and self.effect != taint.effect) or (self.key and self.key != taint.key):
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


class Tolerations:
    """A Pod's tolerations, indexed so that asking about one taint costs the same however many there
    are: a hostile Pod may carry tens of thousands, and a decision asks about every taint of every group
    of nodes. Equal to another when the tolerations are (it stands in for them in memo keys)."""

    __slots__ = ("_any", "_equal", "_equal_any_key", "_exists", "items")

    def __init__(self, items: tuple[Toleration, ...] = ()) -> None:
        self.items = items
        self._any: set[str] = set()  # effects tolerated whatever the key ("" means every effect)
        self._exists: dict[str, set[str]] = {}  # key -> effects
        self._equal: dict[tuple[str, str], set[str]] = {}  # (key, value) -> effects
        self._equal_any_key: dict[str, set[str]] = {}  # value -> effects (Equal with no key)
        for t in items:
            if t.operator == "Exists":
                (self._exists.setdefault(t.key, set()) if t.key else self._any).add(t.effect)
            elif t.operator in ("", "Equal"):
                table = self._equal.setdefault((t.key, t.value), set()) if t.key else None
                (table if table is not None else self._equal_any_key.setdefault(t.value, set())).add(t.effect)

    def tolerates(self, taint: Taint) -> bool:
        """Does any of the tolerations tolerate `taint` (Toleration.tolerates, in O(1))?"""
        for effects in (
            self._any,
            self._exists.get(taint.key),
            self._equal.get((taint.key, taint.value)),
            self._equal_any_key.get(taint.value),
        ):
            if effects and ("" in effects or taint.effect in effects):
                return True
        return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tolerations) and self.items == other.items

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"Tolerations({self.items!r})"


NO_TOLERATIONS = Tolerations()


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as the decision sees it."""

    name: str
    labels: dict[str, str] = field(hash=False, compare=True)
    taints: tuple[Taint, ...] = ()
    allocatable: dict[str, int] = field(default_factory=dict, hash=False)  # extended resources only
    unschedulable: bool = False
    ready: bool = True
    cpu_milli: int | None = None  # allocatable CPU in millicores; None when not known
    memory_bytes: int | None = None  # allocatable memory; None when not known
    # gpupool's own MIG re-cut annotations on it (gpupool.io/mig-reshape-*, webhook.mig.follow), only those.
    annotations: dict[str, str] = field(default_factory=dict, hash=False, compare=True)


PodKey = tuple[str, str]  # (namespace, name)
Selector = tuple[tuple[str, str], ...]  # nodeSelector entries (label, value), sorted


@dataclass(frozen=True, slots=True)
class PodInfo:
    """A Pod as the inventory counts it: where it runs and which GPUs it holds."""

    namespace: str
    name: str
    node: str  # "" while unscheduled
    phase: str
    gpu_requests: dict[str, int] = field(default_factory=dict, hash=False)  # resource -> effective request
    pool: str = ""  # the gpupool.io/pool annotation, "" when absent
    node_selector: dict[str, str] = field(default_factory=dict, hash=False)
    generate_name: str = ""  # what its name was made from, if it was (to find its admission's reservation)
    group: str = ""  # its workload group (webhook.domain.groups), "" when it has none
    # What it needs of a node, read only for a Pod not on a node yet (`could_run`); the defaults ask nothing.
    requirements: NodeRequirements = field(default=NO_REQUIREMENTS, hash=False)
    tolerations: Tolerations | None = field(default=None, hash=False)  # None: read as none
    cpu_milli: int = 0  # its effective CPU request
    memory_bytes: int = 0  # its effective memory request
    gates: tuple[str, ...] = ()  # its scheduling gates: while it has any, the scheduler does not place it
    deleting: bool = False  # metadata.deletionTimestamp is set: it is being deleted (a finalizer may keep it)
    # Its long node-affinity values were cut to the fleet's (webhook.domain.cut): when, on which keys.
    cut: Cut | None = field(default=None, hash=False)

    @property
    def queued(self) -> bool:
        """Waiting in gpupool's queue: it holds nothing until the queue releases it."""
        return QUEUE_GATE in self.gates

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        """Succeeded and Failed Pods hold no devices."""
        return self.phase in ("Succeeded", "Failed")

    @property
    def holds_nothing(self) -> bool:
        """Does the Pod hold (or stand to hold) no devices and no quota? A terminal Pod, and a Pod being
        deleted that is on no node: kube-scheduler places no Pod being deleted and ResourceQuota stops
        charging it, so a finalizer that keeps it stored keeps no room. A Pod being deleted on a node still
        holds its devices until its containers have stopped (the kubelet frees them, not the deletion)."""
        return self.terminal or (self.deleting and not self.node)


@dataclass(frozen=True, slots=True)
class QuotaInfo:
    """A namespace ResourceQuota: its hard limits and the usage the quota controller last recorded."""

    namespace: str
    name: str
    hard: dict[str, int] = field(hash=False)
    used: dict[str, int] = field(default_factory=dict, hash=False)
    scoped: bool = False  # has scopes or a scopeSelector: applies to some Pods only


@dataclass(frozen=True, slots=True, order=True)
class PoolKey:
    """A pool: interchangeable devices of one vendor, class, exact device product and resource."""

    vendor: str
    gpu_class: str
    product: str  # the device's exact product: `NVIDIA-A100-SXM4-40GB-MIG-3g.20gb`, `Tesla-T4-SHARED`
    # "" for the vendor's GPU resource (nvidia.com/gpu: whole GPUs, replicas, single-strategy MIG); the
    # resource itself for partitions of their own (mixed-strategy MIG: nvidia.com/mig-3g.20gb)
    resource: str = ""

    def __str__(self) -> str:
        base = f"{self.vendor}/{self.gpu_class}/{self.product}"
        return f"{base}/{self.resource}" if self.resource else base

    @classmethod
    def parse(cls, text: str) -> PoolKey | None:
        """The inverse of str(); None when `text` is not vendor/class/product[/resource], where a resource
        is `domain/name`."""
        parts = text.split("/", 3)
        if len(parts) < 3 or not all(parts) or (len(parts) == 4 and parts[3].count("/") != 1):
            return None
        if len(parts) == 4 and not all(parts[3].split("/")):
            return None
        return cls(*parts)


# Taints the node lifecycle controller sets for a node's conditions (not-ready, unreachable, pressure,
# cordoned): they come and go with the node's state, not with what the node is.
CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
_BLOCKING = ("NoSchedule", "NoExecute")


def could_run(pod: PodInfo, node: NodeInfo) -> bool:
    """Could the scheduler ever put the Pod on the node, as the node is: its nodeSelector and required
    node affinity match, it tolerates the node's NoSchedule and NoExecute taints (other than the ones that
    follow the node's conditions, which pass), and its GPU, CPU and memory requests are within the node's
    allocatable. Readiness is not asked: a Pod waits out a node's restart, not its labels."""
    if not pod.requirements.matches(node.name, node.labels):
        return False
    if pod.gates:
        return False  # the scheduler places no Pod that still has a gate
    tolerations = pod.tolerations or NO_TOLERATIONS
    for taint in node.taints:
        blocking = taint.effect in _BLOCKING and not taint.key.startswith(CONDITION_TAINT_PREFIX)
        if blocking and not tolerations.tolerates(taint):
            return False
    for resource, n in pod.gpu_requests.items():
        if node.allocatable.get(resource, 0) < n:
            return False
    if node.cpu_milli is not None and pod.cpu_milli > node.cpu_milli:
        return False
    return node.memory_bytes is None or pod.memory_bytes <= node.memory_bytes


def effective_gpus(containers: list[int], inits: list[tuple[int, bool]]) -> int:
    """A Pod's effective request of one resource, as the scheduler computes it: the larger of the
    running containers (plus restartable "sidecar" init containers) and the peak during init.
    `inits` holds (GPUs, is_sidecar) in order."""
    sidecars = init_peak = 0
    for n, sidecar in inits:
        if sidecar:
            sidecars += n
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + n)
    return max(sum(containers) + sidecars, init_peak)
