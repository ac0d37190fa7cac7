"""The policy file: classes, products, vendors, namespace rules and defaults.

Loaded and validated once at start. A user file is merged over the built-in default
(`default_policy.yaml`, the same file the manifests ship as a ConfigMap): top-level keys replace the
default's, `defaults` merges key by key and `vendors` vendor by vendor, so an admin's ConfigMap only
needs the parts it changes. Every error names the field, the bad value and what is accepted.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from webhook.domain.devices import DEVICE_LIST_HELP, GPU, MIG, SHARED, parse_device_list
from webhook.domain.errors import ConfigError
from webhook.domain.model import Taint
from webhook.domain.products import Tokens, matches, parse_version, tokens
from webhook.domain.quantity import MIB, QuantityError, parse_bytes

OnNoCapacity = Literal["warn", "deny"]  # admit with a warning that the Pod will wait, or refuse
OnStale = Literal["warn", "deny"]  # answer from the last view with a warning, or refuse until re-synced
Placement = Literal["now", "queue"]  # place at admission, or gate the Pod until the queue releases it
PLACEMENTS: tuple[Placement, ...] = ("now", "queue")

_MEMORY_UNITS = {"Mi": 1, "Gi": 1024}


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
    placement: Placement | None = None  # now or queue; None: the policy's defaults.placement

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
    check_visible_devices: bool = True  # refuse NVIDIA_VISIBLE_DEVICES in containers without a GPU resource
    # Enforce ResourceQuotas that limit a GPU as `nvidia.com/gpu` or `limits.nvidia.com/gpu` (forms Kubernetes
    # stores but never enforces for extended resources), counting the namespace's Pods itself.
    enforce_all_gpu_quota_forms: bool = True
    device: tuple[str, ...] = (GPU,)  # the default of gpupool.io/device: whole GPUs only
    # now: a Pod is placed at admission; queue: it waits gated until the leader releases it to a pool with room
    placement: Placement = "now"


@dataclass(frozen=True, slots=True)
class Policy:
    classes: tuple[str, ...]
    class_label: str
    default_vendor: str
    defaults: Defaults
    products: tuple[ProductRule, ...]
    vendors: Mapping[str, VendorPolicy]
    namespaces: Mapping[str, NamespaceRule]
    # Every vendor's resources by name (VendorPolicy.resources); filled in by __post_init__.
    gpu_resources: frozenset[str] = frozenset()
    pool_labels: frozenset[str] = frozenset()  # the class label and every product label; likewise
    partition_prefixes: tuple[str, ...] = ()  # every vendor's partitionResourcePrefix; likewise
    _vendor_cache: dict[str, VendorPolicy | None] = field(default_factory=dict, compare=False, repr=False)

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
        rule = _most_specific(r for r in self.products if r.gpu_class and matches(r.tokens, product))
        return rule.gpu_class if rule else ""

    def product_memory_mib(self, product: Tokens) -> int:
        rule = _most_specific(r for r in self.products if r.memory_mib and matches(r.tokens, product))
        return rule.memory_mib if rule else 0

    def product_compute(self, product: Tokens) -> tuple[int, ...] | None:
        """The compute capability the product table gives (most specific entry); None when none does."""
        rule = _most_specific(r for r in self.products if r.compute and matches(r.tokens, product))
        return rule.compute if rule else None

    def placement(self, namespace: str) -> Placement:
        """When the namespace's Pods get their pool: at admission (now), or when the queue releases them."""
        return self.namespace(namespace).placement or self.defaults.placement

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


# --- loading -----------------------------------------------------------------------------------------


def default_policy_text() -> str:
    return importlib.resources.files("webhook.domain").joinpath("default_policy.yaml").read_text("utf-8")


def load_policy(path: str | None) -> Policy:
    """The policy from `path` merged over the default, or the default itself when path is None."""
    if path is None:
        return load_policy_text(None)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror or exc}") from exc
    return load_policy_text(text, source=path)


def load_policy_text(text: str | None, source: str = "policy") -> Policy:
    """Parse and validate policy YAML (merged over the built-in default)."""
    base = _parse_yaml(default_policy_text(), "built-in default policy")
    if text is not None:
        user = _parse_yaml(text, source)
        base = _merge(base, user)
    try:
        return _build(base)
    except PolicyError as exc:
        raise PolicyError(f"{source}: {exc}") from None


def _parse_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _merge(base: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in user.items():
        if key in ("defaults", "vendors") and isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    return merged


class _Fields:
    """Reads one mapping of the policy, refusing unknown and mistyped fields with their path."""

    def __init__(self, data: Any, path: str, allowed: tuple[str, ...]) -> None:
        if not isinstance(data, dict):
            raise PolicyError(f"{path}: expected a mapping, got {_show(data)}")
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise PolicyError(f"{path}.{unknown[0]}: unknown field; accepted: {', '.join(allowed)}")
        self.data, self.path = data, path

    def text(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or (default is None and not value):
            raise PolicyError(f"{self.path}.{key}: expected a non-empty string, got {_show(value)}")
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise PolicyError(f"{self.path}.{key}: expected a list of strings, got {_show(value)}")
        return tuple(value)

    def text_or_texts(self, key: str) -> tuple[str, ...]:
        """One string or a list of them; () when absent."""
        value = self.data.get(key)
        if value is None:
            return ()
        if isinstance(value, str) and value:
            return (value,)
        return self.texts(key)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise PolicyError(f"{self.path}.{key}: expected true or false, got {_show(value)}")
        return value

    def seconds(self, key: str, default: float) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise PolicyError(f"{self.path}.{key}: expected a positive number of seconds, got {_show(value)}")
        return float(value)

    def count(self, key: str, default: int, *, most: int) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise PolicyError(f"{self.path}.{key}: expected a whole number from 1 to {most}, got {_show(value)}")
        return value

    def devices(self, key: str) -> tuple[str, ...]:
        """A device preference (`[mig, gpu]` or `mig,gpu`); () when absent."""
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, str | list) or len(str(value)) > 64:
            raise PolicyError(f"{self.path}.{key}: expected {DEVICE_LIST_HELP}, got {_show(value)}")
        try:
            return parse_device_list(value)
        except ValueError as exc:
            raise PolicyError(f"{self.path}.{key}: {_show(value)} {exc}; accepted: {DEVICE_LIST_HELP}") from None

    def labels(self, key: str, names: str) -> tuple[str, ...]:
        """A list of labels that must name each of `names` (e.g. "major, minor") in order, or none."""
        value = self.texts(key)
        wanted = names.split(", ")
        if value and len(value) != len(wanted):
            raise PolicyError(f"{self.path}.{key}: expected {len(wanted)} labels ({names}), got {list(value)}")
        return value

    def choice(self, key: str, default: str, accepted: tuple[str, ...]) -> str:
        value = self.data.get(key, default)
        if value not in accepted:
            raise PolicyError(f"{self.path}.{key}: {_show(value)} is not one of {', '.join(accepted)}")
        return str(value)


def _show(value: Any) -> str:
    return "nothing" if value is None else repr(value)


_TOP = (
    "apiVersion",
    "kind",
    "classes",
    "classLabel",
    "defaultVendor",
    "defaults",
    "products",
    "vendors",
    "namespaces",
)


def _build(data: dict[str, Any]) -> Policy:
    top = _Fields(data, "policy", _TOP)
    if data.get("kind", "Policy") != "Policy":
        raise PolicyError(f"kind: {_show(data.get('kind'))} is not Policy")
    classes = top.texts("classes")
    if not classes or len(set(classes)) != len(classes):
        raise PolicyError(f"classes: expected a non-empty list of distinct names, got {list(classes)}")
    d = _Fields(
        data.get("defaults", {}),
        "defaults",
        (
            "fallback",
            "onNoCapacity",
            "staleAfterSeconds",
            "onStale",
            "reservationSeconds",
            "reservationSettleSeconds",
            "maxReservationsPerNamespace",
            "checkVisibleDevices",
            "enforceAllGpuQuotaForms",
            "device",
            "placement",
        ),
    )
    defaults = Defaults(
        fallback=d.flag("fallback", False),
        on_no_capacity="deny" if d.choice("onNoCapacity", "warn", ("warn", "deny")) == "deny" else "warn",
        stale_after_seconds=d.seconds("staleAfterSeconds", 120.0),
        on_stale="deny" if d.choice("onStale", "warn", ("warn", "deny")) == "deny" else "warn",
        reservation_seconds=d.seconds("reservationSeconds", 60.0),
        reservation_settle_seconds=d.seconds("reservationSettleSeconds", 5.0),
        max_reservations_per_namespace=d.count("maxReservationsPerNamespace", 500, most=1_000_000),
        check_visible_devices=d.flag("checkVisibleDevices", True),
        enforce_all_gpu_quota_forms=d.flag("enforceAllGpuQuotaForms", True),
        device=d.devices("device") or (GPU,),
        placement="queue" if d.choice("placement", "now", PLACEMENTS) == "queue" else "now",
    )
    vendors_data = data.get("vendors")
    if not isinstance(vendors_data, dict) or not vendors_data:
        raise PolicyError(f"vendors: expected a mapping of vendor name to settings, got {_show(vendors_data)}")
    vendors = {str(name): _vendor(str(name), spec) for name, spec in vendors_data.items()}
    resources = [r for v in vendors.values() for r in v.resources]
    if len(set(resources)) != len(resources):
        raise PolicyError(f"vendors: two vendors share a resource name: {sorted(resources)}")
    for v in vendors.values():
        for prefix in v.partition_prefixes:
            taken = sorted(r for r in resources if r.startswith(prefix))
            if taken:
                raise PolicyError(
                    f"vendors.{v.name}.partitionResourcePrefix: {prefix!r} would take {taken[0]!r}, a resource of "
                    "whole devices; accepted: a prefix only partitions' resources have, such as "
                    "'huawei.com/Ascend910-'"
                )
    default_vendor = top.text("defaultVendor")
    if default_vendor not in vendors:
        raise PolicyError(f"defaultVendor: {default_vendor!r} is not a vendor; accepted: {', '.join(vendors)}")
    products = _products(data.get("products", []), classes, vendors)
    namespaces_data = data.get("namespaces") or {}
    if not isinstance(namespaces_data, dict):
        raise PolicyError(f"namespaces: expected a mapping of namespace to rules, got {_show(namespaces_data)}")
    namespaces = {str(ns): _namespace(str(ns), rule, classes) for ns, rule in namespaces_data.items()}
    return Policy(
        classes=classes,
        class_label=top.text("classLabel"),
        default_vendor=default_vendor,
        defaults=defaults,
        products=products,
        vendors=vendors,
        namespaces=namespaces,
    )


def _vendor(name: str, spec: Any) -> VendorPolicy:
    path = f"vendors.{name}"
    f = _Fields(
        spec,
        path,
        (
            "resource",
            "productLabel",
            "productPrefixes",
            "memoryLabel",
            "memoryUnit",
            "driverLabel",
            "legacyDriverLabels",
            "taints",
            "partitionResourcePrefix",
            "computeCapabilityLabels",
            "cudaLabel",
            "legacyCudaLabels",
            "otherResources",
            "sharedResourceSuffix",
        ),
    )
    unit = f.choice("memoryUnit", "Mi", tuple(_MEMORY_UNITS))
    legacy = f.labels("legacyDriverLabels", "major, minor, revision")
    taints_data = spec.get("taints", [])
    if not isinstance(taints_data, list):
        raise PolicyError(f"{path}.taints: expected a list of {{key, value, effect}}, got {_show(taints_data)}")
    taints = []
    for i, taint in enumerate(taints_data):
        t = _Fields(taint, f"{path}.taints[{i}]", ("key", "value", "effect"))
        effect = t.choice("effect", "", ("", "NoSchedule", "PreferNoSchedule", "NoExecute"))
        taints.append(TaintRule(key=t.text("key"), value=t.text("value", ""), effect=effect))
    return VendorPolicy(
        name=name,
        resource=f.text("resource"),
        product_label=f.text("productLabel"),
        product_prefixes=f.texts("productPrefixes"),
        memory_label=f.text("memoryLabel", ""),
        memory_unit_mib=_MEMORY_UNITS[unit],
        driver_label=f.text("driverLabel", ""),
        legacy_driver_labels=legacy,
        taints=tuple(taints),
        partition_prefixes=f.text_or_texts("partitionResourcePrefix"),
        compute_labels=f.labels("computeCapabilityLabels", "major, minor"),
        cuda_label=f.text("cudaLabel", ""),
        legacy_cuda_labels=f.labels("legacyCudaLabels", "major, minor"),
        other_resources=f.texts("otherResources"),
        shared_suffix=f.text("sharedResourceSuffix", ""),
    )


def _products(data: Any, classes: tuple[str, ...], vendors: Mapping[str, VendorPolicy]) -> tuple[ProductRule, ...]:
    if not isinstance(data, list):
        raise PolicyError(f"products: expected a list of {{match, class, memory}}, got {_show(data)}")
    prefixes = {p for v in vendors.values() for p in v.product_prefixes}
    rules = []
    for i, entry in enumerate(data):
        path = f"products[{i}]"
        f = _Fields(entry, path, ("match", "class", "memory", "computeCapability"))
        match = f.text("match")
        gpu_class = f.text("class", "")
        if gpu_class and gpu_class not in classes:
            raise PolicyError(f"{path}.class: {gpu_class!r} is not a class; accepted: {', '.join(classes)}")
        memory_mib = 0
        if "memory" in entry:
            try:
                memory_mib = parse_bytes(str(entry["memory"])) // MIB
            except QuantityError as exc:
                raise PolicyError(f"{path}.memory: {exc}") from None
            if memory_mib <= 0:
                raise PolicyError(f"{path}.memory: must be at least 1Mi, got {entry['memory']!r}")
        compute = _compute(entry.get("computeCapability"), f"{path}.computeCapability")
        if not gpu_class and not memory_mib and compute is None:
            raise PolicyError(f"{path}: gives neither class, memory nor computeCapability for {match!r}")
        rules.append(ProductRule(match, tokens(match, prefixes), gpu_class, memory_mib, compute))
    return tuple(rules)


def _compute(value: Any, path: str) -> tuple[int, ...] | None:
    """A compute capability, `"8.0"` (a YAML number `8.9` is read the same way); None when absent."""
    if value is None:
        return None
    readable = isinstance(value, str | int | float) and not isinstance(value, bool)
    version = parse_version(str(value)) if readable else None
    if version is None or len(version) != 2:
        raise PolicyError(f"{path}: {_show(value)} is not a compute capability; accepted: major.minor such as '8.0'")
    return version


def _namespace(name: str, data: Any, classes: tuple[str, ...]) -> NamespaceRule:
    path = f"namespaces.{name}"
    f = _Fields(
        data or {},
        path,
        ("allowedClasses", "defaultClass", "classQuota", "memoryQuota", "allowVisibleDevices", "device", "placement"),
    )
    allowed = f.texts("allowedClasses")
    for cls in allowed:
        if cls not in classes:
            raise PolicyError(f"{path}.allowedClasses: {cls!r} is not a class; accepted: {', '.join(classes)}")
    default = f.text("defaultClass", "")
    if default and default not in (allowed or classes):
        raise PolicyError(
            f"{path}.defaultClass: {default!r} is not an allowed class; accepted: {', '.join(allowed or classes)}"
        )
    quota_data = (data or {}).get("classQuota", {}) or {}
    if not isinstance(quota_data, dict):
        raise PolicyError(f"{path}.classQuota: expected a mapping of class to GPUs, got {_show(quota_data)}")
    quota: dict[str, int] = {}
    for cls, limit in quota_data.items():
        if cls not in classes:
            raise PolicyError(f"{path}.classQuota.{cls}: not a class; accepted: {', '.join(classes)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise PolicyError(f"{path}.classQuota.{cls}: expected a whole number of GPUs ≥ 0, got {limit!r}")
        quota[str(cls)] = limit
    return NamespaceRule(
        allowed_classes=allowed,
        default_class=default,
        class_quota=quota,
        allow_visible_devices=f.flag("allowVisibleDevices", False),
        memory_quota_mib=_memory_quota(path, (data or {}).get("memoryQuota")),
        device=f.devices("device"),
        placement=_placement(f),
    )


def _placement(f: _Fields) -> Placement | None:
    if "placement" not in f.data:
        return None
    return "queue" if f.choice("placement", "now", PLACEMENTS) == "queue" else "now"


def _memory_quota(path: str, value: Any) -> int | None:
    """`memoryQuota: 320Gi`: GPU memory as a Kubernetes quantity, in MiB (a part of a MiB counts as none)."""
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise QuantityError("not a quantity")
        return parse_bytes(str(value)) // MIB
    except QuantityError:
        raise PolicyError(
            f"{path}.memoryQuota: expected GPU memory as a quantity such as 320Gi, got {_show(value)}"
        ) from None
