"""The policy as gpupool reads it: classes, products, vendors, namespace rules and defaults, as frozen
values with the questions admission asks of them. Read from its file by webhook.domain.policy_build."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from webhook.domain.devices import GPU, MIG, SHARED
from webhook.domain.errors import ConfigError
from webhook.domain.model import Taint
from webhook.domain.products import Tokens, matches

OnNoCapacity = Literal["warn", "deny"]  # admit with a warning that the Pod will wait, or refuse
OnStale = Literal["warn", "deny"]  # answer from the last view with a warning, or refuse until re-synced
PlacementMode = Literal["now", "queue"]  # when a Pod gets its pool: at admission, or when the queue releases it
PLACEMENTS: tuple[PlacementMode, ...] = ("now", "queue")
# enforce: gpupool's answers stand; audit: every Pod is allowed unchanged and told what they would have been
Enforcement = Literal["enforce", "audit"]
ENFORCEMENTS: tuple[Enforcement, ...] = ("enforce", "audit")


class PolicyError(ConfigError):
    """The policy is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class TaintRule:
    """A GPU taint gpupool tolerates on the Pod's behalf. Empty value/effect match any."""

    key: str
    value: str = ""
    effect: str = ""

    def matches(self, taint: Taint) -> bool:
        return (
            taint.key == self.key
            and (not self.value or taint.value == self.value)
            and (not self.effect or taint.effect == self.effect)
        )


@dataclass(frozen=True, slots=True)
class VendorPolicy:
    name: str
    resource: str
    product_label: str
    product_prefixes: tuple[str, ...] = ()
    memory_label: str = ""
    memory_unit_mib: int = 1
    driver_label: str = ""
    legacy_driver_labels: tuple[str, ...] = ()
    taints: tuple[TaintRule, ...] = ()
    # Resources of partitions of its devices: nvidia.com/mig-<profile>, huawei.com/Ascend910-<template>.
    partition_prefixes: tuple[str, ...] = ()
    compute_labels: tuple[str, ...] = ()  # compute capability: (major, minor) labels; () for none
    cuda_label: str = ""  # the CUDA version the node's driver supports, dotted
    legacy_cuda_labels: tuple[str, ...] = ()  # or (major, minor) labels
    other_resources: tuple[str, ...] = ()  # more resources of whole devices: huawei.com/Ascend310P
    # A device resource with this suffix carries its shared replicas (GFD's renameByDefault: .shared).
    shared_suffix: str = ""
    # The resources of its whole devices, its GPU resource first; and every resource it owns by name
    # (partitions are owned by prefix): those and their renamed shared replicas. Filled in by __post_init__.
    whole_resources: tuple[str, ...] = field(default=(), init=False)
    resources: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        whole = (self.resource, *self.other_resources)
        renamed = tuple(f"{r}{self.shared_suffix}" for r in whole) if self.shared_suffix else ()
        object.__setattr__(self, "whole_resources", whole)
        object.__setattr__(self, "resources", (*whole, *renamed))

    @property
    def has_cuda(self) -> bool:
        """Does the vendor speak CUDA (its nodes say, or their driver tells, which CUDA they run)?"""
        return bool(self.cuda_label or self.legacy_cuda_labels)

    def gpu_taint(self, taint: Taint) -> bool:
        return any(rule.matches(taint) for rule in self.taints)

    def owns(self, resource: str) -> bool:
        """Is `resource` this vendor's: a resource of its whole devices, of their renamed shared replicas,
        or of one of their partitions (a MIG profile, a virtual NPU)?"""
        return resource in self.resources or bool(self.partition_prefix_of(resource))

    def renamed(self, resource: str) -> str:
        """The device resource whose shared replicas `resource` carries under a name of their own
        (`nvidia.com/gpu` for `nvidia.com/gpu.shared`); "" when it is not such a resource."""
        suffix = self.shared_suffix
        if not suffix or not resource.endswith(suffix):
            return ""
        base = resource[: -len(suffix)]
        return base if base in self.whole_resources or self.partition_prefix_of(base) else ""

    def partition_prefix_of(self, resource: str) -> str:
        """The partition prefix `resource` starts with ("" for none): what is left is its profile."""
        return next((p for p in self.partition_prefixes if resource.startswith(p) and len(resource) > len(p)), "")

    def device_kinds(self, resource: str) -> tuple[str, ...]:
        """The kinds of device a Pod that requests `resource` itself can get: () for a resource of whole
        devices (which carries whole GPUs, single-strategy MIG instances or replicas: the Pod's device
        preference says), only shared replicas on a renamed resource, MIG instances (or virtual NPUs) or
        their replicas on a partition's."""
        if self.renamed(resource):
            return (SHARED,)
        if self.partition_prefix_of(resource):
            return (MIG, SHARED)
        return ()


@dataclass(frozen=True, slots=True)
class ProductRule:
    match: str
    tokens: Tokens
    gpu_class: str = ""
    memory_mib: int = 0
    compute: tuple[int, ...] | None = None  # compute capability (major, minor)


@dataclass(frozen=True, slots=True)
class NamespaceRule:
    allowed_classes: tuple[str, ...] = ()  # empty: every class
    default_class: str = ""
    class_quota: Mapping[str, int] = field(default_factory=dict)
    allow_visible_devices: bool = False  # opt out of the NVIDIA_VISIBLE_DEVICES rule
    memory_quota_mib: int | None = None  # GPU memory the namespace may hold (devices x memory per device)
    device: tuple[str, ...] = ()  # the default of gpupool.io/device here; empty: the policy's defaults.device
    placement: PlacementMode | None = None  # now or queue; None: the policy's defaults.placement
    enforcement: Enforcement | None = None  # enforce or audit; None: the policy's defaults.enforcement

    @property
    def restricted(self) -> bool:
        """Does the rule limit what the namespace may use (classes, per-class or GPU-memory quotas)?"""
        return bool(self.allowed_classes or self.class_quota or self.memory_quota_mib is not None)


@dataclass(frozen=True, slots=True)
class Defaults:
    fallback: bool = False
    on_no_capacity: OnNoCapacity = "warn"
    stale_after_seconds: float = 120.0
    on_stale: OnStale = "warn"
    reservation_seconds: float = 60.0
    reservation_settle_seconds: float = 5.0  # with a current watch, a reservation's Pod shows up by then
    max_reservations_per_namespace: int = 500  # past it, the namespace's oldest reservation is dropped
    # A queued Pod or gang that cannot fit leaves its room to later Pods (backfill) until it has waited this
    # long; then it holds the pool closest to fitting it (webhook.queue.backfill)
    queue_hold_after_seconds: float = 300.0
    check_visible_devices: bool = True  # refuse NVIDIA_VISIBLE_DEVICES in containers without a GPU resource
    # Enforce ResourceQuotas that limit a GPU as `nvidia.com/gpu` or `limits.nvidia.com/gpu` (forms Kubernetes
    # stores but never enforces for extended resources), counting the namespace's Pods itself.
    enforce_all_gpu_quota_forms: bool = True
    device: tuple[str, ...] = (GPU,)  # the default of gpupool.io/device: whole GPUs only
    # now: a Pod is placed at admission; queue: it waits gated until the leader releases it to a pool with room
    placement: PlacementMode = "queue"
    # enforce: answers stand; audit: every Pod is allowed unchanged, with what gpupool would have done
    enforcement: Enforcement = "enforce"


@dataclass(frozen=True, slots=True)
class MigReshaping:
    """`migReshaping`: gpupool may re-cut opted-in, idle MIG nodes through NVIDIA's mig-manager (docs/mig.md)."""

    config_map: tuple[str, str] = ("gpu-operator", "default-mig-parted-config")  # namespace, name
    configs: tuple[str, ...] = ()  # the named layouts gpupool may choose; empty: every MIG-enabled one
    idle_seconds: float = 60.0  # how long a node must have had no GPU Pod, and the least time between its changes
    max_in_flight: int = 2  # changes under way at once, across the fleet
    timeout_seconds: float = 900.0  # a change still pending after this long is given up on (left alone, alerted)
    # busy nodes a re-cut would serve are kept from new Pods until idle (webhook.mig.planner, 4); off by default:
    # measured, it did not pay (docs/performance.md, "Drain by not filling")
    drain: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    classes: tuple[str, ...]
    class_label: str
    default_vendor: str
    defaults: Defaults
    products: tuple[ProductRule, ...]
    vendors: Mapping[str, VendorPolicy]
    namespaces: Mapping[str, NamespaceRule]
    mig_reshaping: MigReshaping | None = None  # None: gpupool never re-cuts a node
    # Every vendor's resources by name (VendorPolicy.resources); filled in by __post_init__.
    gpu_resources: frozenset[str] = frozenset()
    pool_labels: frozenset[str] = frozenset()  # the class label and every product label; likewise
    partition_prefixes: tuple[str, ...] = ()  # every vendor's partitionResourcePrefix; likewise
    # The version of the policy: a digest of its content as merged over the default (webhook.domain.policy_build),
    # so the same policy reads the same on every replica; the mutating call writes it on the Pods it changes.
    digest: str = field(default="", compare=False)
    _vendor_cache: dict[str, VendorPolicy | None] = field(default_factory=dict, compare=False, repr=False)
    # init=False: a policy made by dataclasses.replace (another product table, maybe) starts a cache of its own.
    _product_cache: dict[tuple[str, Tokens], ProductRule | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_resources", frozenset(r for v in self.vendors.values() for r in v.resources))
        object.__setattr__(
            self, "pool_labels", frozenset({self.class_label, *(v.product_label for v in self.vendors.values())})
        )
        prefixes = tuple(p for v in self.vendors.values() for p in v.partition_prefixes)
        object.__setattr__(self, "partition_prefixes", prefixes)

    def pins_pool(self, label: str) -> bool:
        """Is a nodeSelector label one that pins pools: the class label, a vendor's product label, or a MIG
        profile's own product label (`nvidia.com/mig-3g.20gb.product`)? A pool whose selector has another
        value, or lacks it, cannot take the Pod. Admission and the ledger both ask this."""
        return label in self.pool_labels or (
            label.endswith(".product") and any(label.startswith(p) for p in self.partition_prefixes)
        )

    def hold_pins(self, node_selector: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The entries of a nodeSelector that pin pools (`pins_pool`), sorted: which of a pool's node groups
        the GPUs of a Pod not on a node yet are held on. Admission (for its reservation) and the ledger
        (for the Pod once the watch shows it) both ask this."""
        return tuple(sorted((k, v) for k, v in node_selector.items() if self.pins_pool(k)))

    def class_rank(self, gpu_class: str) -> int:
        return self.classes.index(gpu_class)

    def namespace(self, name: str) -> NamespaceRule:
        return self.namespaces.get(name, _ANY_NAMESPACE)

    def vendor_of(self, resource: str) -> VendorPolicy | None:
        """The vendor whose GPU (or GPU partition) `resource` is; None for any other resource. Remembered
        per name (every extended resource of every admitted container is asked about), up to a bound."""
        try:
            return self._vendor_cache[resource]
        except KeyError:
            vendor = next((v for v in self.vendors.values() if v.owns(resource)), None)
            if len(self._vendor_cache) < 4096:
                self._vendor_cache[resource] = vendor
            return vendor

    def product_class(self, product: Tokens) -> str:
        """The class the product table gives, most specific matching entry first; "" when none."""
        rule = self._product_rule("class", product)
        return rule.gpu_class if rule else ""

    def product_memory_mib(self, product: Tokens) -> int:
        rule = self._product_rule("memory", product)
        return rule.memory_mib if rule else 0

    def product_compute(self, product: Tokens) -> tuple[int, ...] | None:
        """The compute capability the product table gives (most specific entry); None when none does."""
        rule = self._product_rule("compute", product)
        return rule.compute if rule else None

    def _product_rule(self, what: str, product: Tokens) -> ProductRule | None:
        """The most specific entry of the product table that gives `what` for the product. Remembered per
        product, up to a bound: every node of a list asks about its product, and a cluster has few."""
        try:
            return self._product_cache[what, product]
        except KeyError:
            pass
        if what == "class":
            rule = _most_specific(r for r in self.products if r.gpu_class and matches(r.tokens, product))
        elif what == "memory":
            rule = _most_specific(r for r in self.products if r.memory_mib and matches(r.tokens, product))
        else:
            rule = _most_specific(r for r in self.products if r.compute and matches(r.tokens, product))
        if len(self._product_cache) < 4096:
            self._product_cache[what, product] = rule
        return rule

    def placement(self, namespace: str) -> PlacementMode:
        """When the namespace's Pods get their pool: at admission (now), or when the queue releases them."""
        return self.namespace(namespace).placement or self.defaults.placement

    def audits(self, namespace: str) -> bool:
        """Is the namespace in audit mode (`enforcement: audit`): its Pods allowed unchanged, each told
        what gpupool would have answered (webhook.admission.audit)?"""
        return (self.namespace(namespace).enforcement or self.defaults.enforcement) == "audit"

    @property
    def queues(self) -> bool:
        """Does any namespace (or the default) send Pods to the queue?"""
        return self.defaults.placement == "queue" or any(r.placement == "queue" for r in self.namespaces.values())

    def device_default(self, namespace: str) -> tuple[str, ...]:
        """The devices a Pod of the namespace gets when it names none: the namespace's, else the policy's."""
        return self.namespace(namespace).device or self.defaults.device


_ANY_NAMESPACE = NamespaceRule()


def _most_specific(rules: Any) -> ProductRule | None:
    best: ProductRule | None = None
    for rule in rules:  # first entry wins among equally specific ones
        if best is None or len(rule.tokens) > len(best.tokens):
            best = rule
    return best
