"""The domain: what gpupool knows about nodes, Pods and quotas, as frozen values.

These are projections of Kubernetes objects down to the fields a placement decision needs. They are
built from raw JSON by `webhook.kubeobj` (for the snapshot file and the watch cache alike) and never
hold a reference to the raw object, so 150,000 Pods stay small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint. `value` is "" when the taint has none, as Kubernetes treats it."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    """A Pod toleration, with Kubernetes' defaults filled in (operator Equal, any effect)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' matching rule (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as the decision sees it."""

    name: str
    labels: dict[str, str] = field(hash=False, compare=True)
    taints: tuple[Taint, ...] = ()
    allocatable: dict[str, int] = field(default_factory=dict, hash=False)  # extended resources only
    unschedulable: bool = False
    ready: bool = True


PodKey = tuple[str, str]  # (namespace, name)


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

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        """Succeeded and Failed Pods hold no devices."""
        return self.phase in ("Succeeded", "Failed")


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
    """A pool: GPUs of one vendor, class and normalised product."""

    vendor: str
    gpu_class: str
    product: str

    def __str__(self) -> str:
        return f"{self.vendor}/{self.gpu_class}/{self.product}"

    @classmethod
    def parse(cls, text: str) -> PoolKey | None:
        """The inverse of str(); None when `text` is not vendor/class/product."""
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            return None
        return cls(parts[0], parts[1], parts[2])
