"""From a Pod's `gpupool.io/` annotations and its spec to a validated GpuRequest.

Every bad value is refused with a message that names the annotation, the value and what is accepted;
nothing is silently ignored. The Pod's own GPU limits, nodeSelector and tolerations are read here too,
because they constrain the request (a limit is a count, a nodeSelector a pin).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from webhook.kubeobj import POOL_ANNOTATION, as_map, container_gpus, effective_gpus, tolerations_of
from webhook.model import PoolKey, Toleration
from webhook.policy import Policy, VendorPolicy
from webhook.products import Tokens, parse_version, tokens
from webhook.quantity import MIB, QuantityError, parse_bytes, parse_count

PREFIX = "gpupool.io/"
CLASS, MEMORY, COUNT, PRODUCT = "gpu-class", "min-memory", "gpu-count", "gpu-product"
DRIVER, VENDOR, CONTAINER, FALLBACK, POOL = "min-driver", "vendor", "container", "fallback", "pool"
KNOWN = (CLASS, MEMORY, COUNT, PRODUCT, DRIVER, VENDOR, CONTAINER, FALLBACK, POOL)
MAX_COUNT = 64
T = TypeVar("T")
_PRODUCT_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RequestError(ValueError):
    """The Pod asks for something malformed or contradictory; the message is shown to the user."""


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What the Pod asks for, validated against the policy."""

    namespace: str
    vendor: VendorPolicy
    classes: tuple[str, ...]  # in the order of preference; empty: any allowed class
    class_source: str  # "annotation", "namespace default" or "any"
    allowed_classes: tuple[str, ...]  # what the namespace permits, in policy order
    min_memory_mib: int
    count: int  # GPUs for the target container; 0: the Pod's own GPU requests (init containers) stand
    pod_total: int  # GPUs the whole Pod needs on one node
    products: tuple[Tokens, ...]  # any of these; empty: any product
    product_text: str
    min_driver: tuple[int, ...] | None
    container_index: int
    container_name: str
    fallback: bool
    pins: tuple[tuple[str, str], ...]  # the Pod's nodeSelector entries on pool labels
    pool_pin: PoolKey | None  # an existing gpupool.io/pool annotation
    tolerations: tuple[Toleration, ...]


def gpupool_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    """The Pod's gpupool.io/ annotations without the prefix; refuses non-string values."""
    found = {}
    for key, value in as_map(as_map(pod.get("metadata")).get("annotations")).items():
        if isinstance(key, str) and key.startswith(PREFIX):
            if not isinstance(value, str):
                raise RequestError(f"annotation {key}: value must be a string, got {value!r}")
            found[key[len(PREFIX) :]] = value
    return found


def requested_resources(pod: Mapping[str, Any], policy: Policy) -> set[str]:
    """The policy's GPU resources that any container of the Pod already requests or limits."""
    spec = as_map(pod.get("spec"))
    found: set[str] = set()
    for field in ("containers", "initContainers"):
        for c in spec.get(field) or []:
            res = as_map(as_map(c).get("resources"))
            for kind in ("limits", "requests"):
                found.update(r for r in as_map(res.get(kind)) if r in policy.gpu_resources)
    return found


def wants_gpus(pod: Mapping[str, Any], policy: Policy) -> bool:
    """Is this Pod gpupool's business: a gpupool.io/ annotation, or a GPU resource?"""
    annotations = as_map(as_map(pod.get("metadata")).get("annotations"))
    return any(isinstance(k, str) and k.startswith(PREFIX) for k in annotations) or bool(
        requested_resources(pod, policy)
    )


class _Errors:
    """Collects every problem, so the user fixes a Pod in one go instead of one denial at a time."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def check(self, parse: Callable[[], T], fallback: T) -> T:
        try:
            return parse()
        except RequestError as exc:
            self.messages.append(str(exc))
            return fallback


def parse_request(pod: Mapping[str, Any], namespace: str, policy: Policy) -> GpuRequest:
    """The validated request; raises RequestError naming everything that is wrong."""
    ann = gpupool_annotations(pod)
    errors = _Errors()
    for key in sorted(set(ann) - set(KNOWN)):
        close = difflib.get_close_matches(key, KNOWN, n=1)
        hint = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
        errors.messages.append(
            f"unknown annotation {PREFIX}{key}{hint}; accepted: {', '.join(PREFIX + k for k in KNOWN)}"
        )
    spec = as_map(pod.get("spec"))
    containers: list[Mapping[str, Any]] = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    if not containers:
        raise RequestError("; ".join([*errors.messages, "the Pod has no containers"]))
    default_vendor = policy.vendors[policy.default_vendor]
    vendor = errors.check(lambda: _vendor(ann, pod, policy), default_vendor)
    index = errors.check(lambda: _container(ann, containers, vendor.resource), 0)
    target = containers[index]
    inits = [as_map(c) for c in spec.get("initContainers") or []]
    already = any(container_gpus(c, vendor.resource) for c in [*containers, *inits])
    count = errors.check(lambda: _count(ann, target, vendor.resource, already), 1)
    rule = policy.namespace(namespace)
    allowed = rule.allowed_classes or policy.classes
    no_classes: tuple[tuple[str, ...], str] = ((), "any")
    classes, source = errors.check(lambda: _classes(ann, policy, namespace, allowed, rule.default_class), no_classes)
    no_products: tuple[Tokens, ...] = ()
    products = errors.check(lambda: _products(ann, vendor), no_products)
    memory = errors.check(lambda: _memory(ann), 0)
    driver = errors.check(lambda: _driver(ann), None)
    fallback = errors.check(lambda: _flag(ann, FALLBACK, policy.defaults.fallback), False)
    pool = errors.check(lambda: _pool(ann), None)
    if errors.messages:
        raise RequestError("; ".join(errors.messages))
    counts = [count if i == index else container_gpus(c, vendor.resource) for i, c in enumerate(containers)]
    init_counts = [(container_gpus(c, vendor.resource), c.get("restartPolicy") == "Always") for c in inits]
    return GpuRequest(
        namespace=namespace,
        vendor=vendor,
        classes=classes,
        class_source=source,
        allowed_classes=tuple(c for c in policy.classes if c in allowed),
        min_memory_mib=memory,
        count=count,
        pod_total=effective_gpus(counts, init_counts),
        products=products,
        product_text=ann.get(PRODUCT, ""),
        min_driver=driver,
        container_index=index,
        container_name=str(target.get("name", "")),
        fallback=fallback,
        pins=_pins(spec, policy),
        pool_pin=pool,
        tolerations=tolerations_of(spec),
    )


def _vendor(ann: dict[str, str], pod: Mapping[str, Any], policy: Policy) -> VendorPolicy:
    requested = requested_resources(pod, policy)
    owners = sorted(v.name for v in policy.vendors.values() if v.resource in requested)
    if VENDOR in ann:
        name = ann[VENDOR].strip()
        if name not in policy.vendors:
            raise RequestError(
                f"annotation {PREFIX}{VENDOR}: {ann[VENDOR]!r} is not a vendor; accepted: {', '.join(policy.vendors)}"
            )
        if owners and owners != [name]:
            raise RequestError(
                f"annotation {PREFIX}{VENDOR}: {name!r} contradicts the Pod's own "
                f"{', '.join(policy.vendors[o].resource for o in owners)} request"
            )
        return policy.vendors[name]
    if len(owners) > 1:
        raise RequestError(
            f"the Pod requests GPUs of several vendors ({', '.join(owners)}); set {PREFIX}{VENDOR} "
            "and request one vendor's resource"
        )
    return policy.vendors[owners[0] if owners else policy.default_vendor]


def _container(ann: dict[str, str], containers: list[Mapping[str, Any]], resource: str) -> int:
    names = [str(c.get("name", "")) for c in containers]
    if CONTAINER in ann:
        name = ann[CONTAINER].strip()
        if name not in names:
            raise RequestError(
                f"annotation {PREFIX}{CONTAINER}: no container named {name!r}; accepted: {', '.join(names)}"
            )
        return names.index(name)
    # The container that already asks for the GPUs, else the first one.
    return next((i for i, c in enumerate(containers) if container_gpus(c, resource)), 0)


def _count(ann: dict[str, str], container: Mapping[str, Any], resource: str, pod_has_gpus: bool) -> int:
    """GPUs for the target container: the annotation, else its own limit; 0 (leave it alone) when only
    other containers of the Pod, such as an init container, ask for GPUs; else 1."""
    res = as_map(container.get("resources"))
    existing = {}
    for kind in ("limits", "requests"):
        if resource in as_map(res.get(kind)):
            raw = as_map(res.get(kind))[resource]
            value = parse_count(raw)
            if str(raw).strip() != str(value) or value < 1:
                raise RequestError(
                    f"container {container.get('name')!r}: {kind} {resource}: {raw!r} is not a whole number of GPUs ≥ 1"
                )
            existing[kind] = value
    if len(set(existing.values())) > 1:
        raise RequestError(
            f"container {container.get('name')!r}: limits {resource}={existing['limits']} and requests "
            f"{resource}={existing['requests']} differ; Kubernetes requires them equal for GPUs"
        )
    current = next(iter(existing.values()), None)
    if COUNT not in ann:
        if current is not None:
            return current
        return 0 if pod_has_gpus else 1
    raw = ann[COUNT].strip()
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_COUNT:
        raise RequestError(
            f"annotation {PREFIX}{COUNT}: {ann[COUNT]!r} is not a whole number of GPUs; accepted: 1 to {MAX_COUNT}"
        )
    count = int(raw)
    if current is not None and current != count:
        raise RequestError(
            f"annotation {PREFIX}{COUNT}: {count} contradicts container {container.get('name')!r}'s "
            f"{resource}: {current}; remove one or make them equal"
        )
    return count


def _classes(
    ann: dict[str, str], policy: Policy, namespace: str, allowed: tuple[str, ...], default: str
) -> tuple[tuple[str, ...], str]:
    if CLASS not in ann:
        if default:
            return (default,), "namespace default"
        return (), "any"
    items = [c.strip() for c in ann[CLASS].split(",")]
    accepted = ", ".join(policy.classes)
    if not all(items):
        raise RequestError(
            f"annotation {PREFIX}{CLASS}: {ann[CLASS]!r} has an empty entry; accepted: a class or an ordered "
            f"list such as 'medium,high' of: {accepted}"
        )
    for c in items:
        if c not in policy.classes:
            raise RequestError(f"annotation {PREFIX}{CLASS}: {c!r} is not a class; accepted: {accepted}")
        if c not in allowed:
            raise RequestError(
                f"annotation {PREFIX}{CLASS}: class {c!r} is not allowed in namespace {namespace}; "
                f"accepted here: {', '.join(allowed)}"
            )
    if len(set(items)) != len(items):
        raise RequestError(f"annotation {PREFIX}{CLASS}: {ann[CLASS]!r} names a class twice")
    return tuple(items), "annotation"


def _memory(ann: dict[str, str]) -> int:
    if MEMORY not in ann:
        return 0
    try:
        value = parse_bytes(ann[MEMORY])
    except QuantityError:
        value = -1
    if value <= 0:
        raise RequestError(
            f"annotation {PREFIX}{MEMORY}: {ann[MEMORY]!r} is not a positive memory quantity; accepted: a "
            "Kubernetes quantity such as 24Gi, 40G or 16384Mi"
        )
    return -(-value // MIB)  # round up to whole MiB


def _products(ann: dict[str, str], vendor: VendorPolicy) -> tuple[Tokens, ...]:
    if PRODUCT not in ann:
        return ()
    items = [p.strip() for p in ann[PRODUCT].split(",")]
    for p in items:
        if not _PRODUCT_TOKEN.match(p):
            raise RequestError(
                f"annotation {PREFIX}{PRODUCT}: {p!r} is not a product token; accepted: comma-separated names "
                "of letters, digits, '.', '_' and '-', such as A100 or H100-80GB"
            )
    return tuple(tokens(p, vendor.product_prefixes) for p in items)


def _driver(ann: dict[str, str]) -> tuple[int, ...] | None:
    if DRIVER not in ann:
        return None
    version = parse_version(ann[DRIVER])
    if version is None:
        raise RequestError(
            f"annotation {PREFIX}{DRIVER}: {ann[DRIVER]!r} is not a driver version; accepted: dotted numbers "
            "such as 535 or 535.104.05"
        )
    return version


def _flag(ann: dict[str, str], key: str, default: bool) -> bool:
    if key not in ann:
        return default
    value = ann[key].strip().lower()
    if value not in ("true", "false"):
        raise RequestError(f"annotation {PREFIX}{key}: {ann[key]!r} is not a boolean; accepted: true, false")
    return value == "true"


def _pool(ann: dict[str, str]) -> PoolKey | None:
    if POOL not in ann:
        return None
    pool = PoolKey.parse(ann[POOL].strip())
    if pool is None:
        raise RequestError(
            f"annotation {POOL_ANNOTATION}: {ann[POOL]!r} is not vendor/class/product; gpupool sets it, "
            "remove it to let gpupool choose"
        )
    return pool


def _pins(spec: Mapping[str, Any], policy: Policy) -> tuple[tuple[str, str], ...]:
    selector = as_map(spec.get("nodeSelector"))
    return tuple(sorted((str(k), str(v)) for k, v in selector.items() if k in policy.pool_labels))
