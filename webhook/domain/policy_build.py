"""Reading the policy file: YAML merged over the built-in default (`default_policy.yaml`), each field
checked with its path, into the values of webhook.domain.policy_model."""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.resources
import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from webhook.domain.devices import DEVICE_LIST_HELP, GPU, parse_device_list
from webhook.domain.errors import read_user_file
from webhook.domain.policy_model import (
    ENFORCEMENTS,
    PLACEMENTS,
    Defaults,
    Enforcement,
    MigReshaping,
    NamespaceRule,
    PlacementMode,
    Policy,
    PolicyError,
    ProductRule,
    TaintRule,
    VendorPolicy,
)
from webhook.domain.products import parse_version, tokens
from webhook.domain.quantity import MIB, QuantityError, parse_bytes

_MEMORY_UNITS = {"Mi": 1, "Gi": 1024}


def default_policy_text() -> str:
    return importlib.resources.files("webhook.domain").joinpath("default_policy.yaml").read_text("utf-8")


def load_policy(path: str | None) -> Policy:
    """The policy from `path` merged over the default, or the default itself when path is None."""
    if path is None:
        return load_policy_text(None)
    _, text = read_user_file(path, PolicyError, "policy file")
    return load_policy_text(text, source=path)


def load_policy_text(text: str | None, source: str = "policy") -> Policy:
    """Parse and validate policy YAML (merged over the built-in default)."""
    base = _default_data()
    if text is not None:
        user = _parse_yaml(text, source)
        base = _merge(base, user)
    try:
        policy = _build(base)
    except PolicyError as exc:
        raise PolicyError(f"{source}: {exc}") from None
    return replace(policy, digest=content_digest(base))


DIGEST_CHARS = 16  # of SHA-256's hex: 64 bits, ample to tell the versions of one cluster's policy apart


def content_digest(data: dict[str, Any]) -> str:
    """The version of a policy's content (merged over the default): SHA-256 of its canonical JSON, so a
    file rewritten with other comments, order or quoting keeps its version."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


def _default_data() -> dict[str, Any]:
    """The built-in default, parsed once per process (it is part of the package and never changes) and
    copied for each load, so that what a load builds never shares a mutable value with the next."""
    return copy.deepcopy(_parsed_default())


@functools.cache
def _parsed_default() -> dict[str, Any]:
    return _parse_yaml(default_policy_text(), "built-in default policy")


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
    "migReshaping",
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
            "queueHoldAfterSeconds",
            "checkVisibleDevices",
            "enforceAllGpuQuotaForms",
            "device",
            "placement",
            "enforcement",
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
        queue_hold_after_seconds=d.seconds("queueHoldAfterSeconds", 300.0),
        check_visible_devices=d.flag("checkVisibleDevices", True),
        enforce_all_gpu_quota_forms=d.flag("enforceAllGpuQuotaForms", True),
        device=d.devices("device") or (GPU,),
        placement="now" if d.choice("placement", "queue", PLACEMENTS) == "now" else "queue",
        enforcement=_enforcement(d) or "enforce",
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
        mig_reshaping=_mig_reshaping(data.get("migReshaping")),
    )


_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_MAX_MIG_CONFIGS = 256


def _mig_reshaping(data: Any) -> MigReshaping | None:
    """`migReshaping` (absent or null: off; `{}`: on, with every default)."""
    if data is None:
        return None
    path = "migReshaping"
    f = _Fields(data, path, ("configMap", "configs", "idleSeconds", "maxInFlight", "timeoutSeconds", "drain"))
    default = MigReshaping()
    where = f.text("configMap", "/".join(default.config_map))
    namespace, _, name = where.partition("/")
    if not _DNS_LABEL.fullmatch(namespace) or not _DNS_SUBDOMAIN.fullmatch(name):
        raise PolicyError(
            f"{path}.configMap: {where[:300]!r} is not <namespace>/<name> of a ConfigMap; accepted: such as "
            "gpu-operator/default-mig-parted-config"
        )
    configs = f.texts("configs")
    if len(configs) > _MAX_MIG_CONFIGS:
        raise PolicyError(f"{path}.configs: {len(configs)} names, more than the {_MAX_MIG_CONFIGS} accepted")
    for config in configs:
        if not _LABEL_VALUE.fullmatch(config):
            raise PolicyError(
                f"{path}.configs: {config[:80]!r} cannot be a value of the label nvidia.com/mig.config; accepted: "
                "a layout name of the mig-parted config such as all-3g.40gb (at most 63 letters, digits, -, _, .)"
            )
    if len(set(configs)) != len(configs):
        raise PolicyError(f"{path}.configs: names a layout twice")
    return MigReshaping(
        config_map=(namespace, name),
        configs=configs,
        idle_seconds=f.seconds("idleSeconds", default.idle_seconds),
        max_in_flight=f.count("maxInFlight", default.max_in_flight, most=1000),
        timeout_seconds=f.seconds("timeoutSeconds", default.timeout_seconds),
        drain=f.flag("drain", default.drain),
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
        (
            "allowedClasses",
            "defaultClass",
            "classQuota",
            "memoryQuota",
            "allowVisibleDevices",
            "device",
            "placement",
            "enforcement",
        ),
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
        enforcement=_enforcement(f),
    )


def _placement(f: _Fields) -> PlacementMode | None:
    if "placement" not in f.data:
        return None
    return "queue" if f.choice("placement", "now", PLACEMENTS) == "queue" else "now"


def _enforcement(f: _Fields) -> Enforcement | None:
    """`enforcement: enforce | audit`; None when absent."""
    if "enforcement" not in f.data:
        return None
    return "audit" if f.choice("enforcement", "enforce", ENFORCEMENTS) == "audit" else "enforce"


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
