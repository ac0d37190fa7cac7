"""From a Pod's shape (webhook.admission.pod) to a validated GpuRequest.

Every bad value is refused with a message that names the annotation, the value and what is accepted;
nothing is silently ignored. The Pod's own GPU limits, nodeSelector and tolerations are read here too,
because they constrain the request (a limit is a count, a nodeSelector a pin).

Every value may come from a hostile Pod: its length is checked before it is parsed, numbers are ASCII
digits read by linear code, and a denial lists the first few problems and how many more there are, so
neither the work nor the message grows with what the Pod sent.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from webhook.admission import device_request
from webhook.admission.device_request import DeviceError, device_resource, parse_device_request
from webhook.admission.fence import MAX_TOKEN_CHARS
from webhook.admission.pod import ContainerView, PodShape, shape_bytes
from webhook.domain.affinity import NO_REQUIREMENTS, NodeRequirements
from webhook.domain.groups import GROUP_POLICIES, MAX_GROUP_SIZE, NO_GROUP_RULE, GroupRule, valid_name
from webhook.domain.groups import MAX_NAME_CHARS as MAX_GROUP_NAME
from webhook.domain.model import POOL_ANNOTATION, PREFIX, PoolKey, Tolerations, effective_gpus
from webhook.domain.policy import Policy, VendorPolicy
from webhook.domain.products import Tokens, parse_version, tokens
from webhook.domain.quantity import GIB, MIB, QuantityError, parse_bytes, parse_count, shown

CLASS, MEMORY, COUNT, PRODUCT = "gpu-class", "min-memory", "gpu-count", "gpu-product"
DRIVER, VENDOR, CONTAINER, FALLBACK, POOL = "min-driver", "vendor", "container", "fallback", "pool"
GROUP, GROUP_POLICY, GROUP_SIZE = "group", "group-policy", "group-size"
RELEASED_BY = "released-by"  # the queue's fencing token (webhook.admission.fence): written by gpupool, not read here
POLICY = "policy"  # the policy version the mutating call applied (webhook.admission.versions): written by gpupool
KNOWN: tuple[str, ...] = (CLASS, MEMORY, COUNT, PRODUCT, DRIVER, VENDOR, CONTAINER, FALLBACK, POOL, GROUP,
                          GROUP_POLICY, GROUP_SIZE, RELEASED_BY, POLICY)  # fmt: skip
# The longest value each annotation accepts, checked before the value is parsed.
MAX_CHARS = {CLASS: 256, MEMORY: 32, COUNT: 8, PRODUCT: 512, DRIVER: 32, VENDOR: 63, CONTAINER: 253,
             FALLBACK: 8, POOL: 512, GROUP: MAX_GROUP_NAME, GROUP_POLICY: 16, GROUP_SIZE: 8,
             RELEASED_BY: MAX_TOKEN_CHARS, POLICY: 64}  # fmt: skip
KNOWN = (*KNOWN, *device_request.ANNOTATIONS)  # the device's kind, compute capability and CUDA
MAX_CHARS |= device_request.MAX_CHARS
# A request mirrors the shape it is read from (tuples of its entries, an index of its tolerations): a memo
# entry of a shape and its request, or of a request, weighs at most this many times the shape.
REQUEST_WEIGHT = 3
MAX_COUNT = 64
MAX_PROBLEMS = 5  # a denial names this many problems, then says how many more there are
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
    fallback: bool
    pins: tuple[tuple[str, str], ...]  # the Pod's nodeSelector entries on pool labels
    pool_pin: PoolKey | None  # an existing gpupool.io/pool annotation
    tolerations: Tolerations
    partitions: tuple[str, ...] = ()  # GPU partition resources the Pod requests itself (nvidia.com/mig-...)
    group: GroupRule = NO_GROUP_RULE  # what it asks of its workload group (the group itself is identity)
    resource: str = ""  # the one device resource the Pod requests itself (its pools'), "" for none
    devices: tuple[str, ...] = ("gpu",)  # device kinds it accepts, in the order of preference
    device_source: str = "policy default"  # annotation, namespace default, policy default, requested resource
    min_compute: tuple[int, ...] | None = None  # compute capability
    min_cuda: tuple[int, ...] | None = None  # the CUDA version the node's driver must support
    node_selector: tuple[tuple[str, str], ...] = ()  # the Pod's whole nodeSelector (pins are its pool labels)
    requirements: NodeRequirements = NO_REQUIREMENTS  # its nodeSelector and required node affinity
    # The Pod's own effective request per device resource of its vendor, as the scheduler counts it
    # (before any patch), sorted by resource: what a Pod gpupool does not place holds.
    own_requests: tuple[tuple[str, int], ...] = ()
    # What the shape it was read from holds (pod.shape_bytes), by which memos weigh it: not part of it.
    shape_bytes: int = field(default=0, compare=False)


def gpupool_annotations(shape: PodShape) -> dict[str, str]:
    """The Pod's gpupool.io/ annotations without the prefix."""
    return {key[len(PREFIX) :]: value for key, value in shape.annotations or ()}


def container_gpus(container: ContainerView, resource: str) -> int:
    """A container's request for an extended resource; requests default to limits for those."""
    for entries in (container.requests, container.limits):
        for name, value in entries or ():
            if name == resource:
                return parse_count(value)
    return 0


def requested_resources(shape: PodShape, policy: Policy) -> set[str]:
    """The vendors' GPU resources (and GPU partitions, such as MIG instances) that any container of the
    Pod already requests or limits."""
    return {
        name
        for c in all_containers(shape)
        for entries in (c.limits, c.requests)
        for name, _ in entries or ()
        if policy.vendor_of(name) is not None
    }


def wants_gpus(shape: PodShape, policy: Policy) -> bool:
    """Is this Pod gpupool's business: a gpupool.io/ annotation, a GPU resource, or a container that sets
    NVIDIA_VISIBLE_DEVICES (webhook/manifests send exactly these Pods)?"""
    return (
        bool(shape.annotations)
        or bool(requested_resources(shape, policy))
        or any(c.visible_devices is not None for c in all_containers(shape))
    )


def pod_devices(shape: PodShape, resources: set[str]) -> int:
    """The Pod's effective request of devices among `resources` (a GPU and its partitions alike), as the
    scheduler computes it per resource."""
    inits = shape.init_containers or ()
    return sum(
        effective_gpus(
            [container_gpus(c, r) for c in shape.containers], [(container_gpus(c, r), c.sidecar) for c in inits]
        )
        for r in resources
    )


# NVIDIA_VISIBLE_DEVICES values that expose no GPU (the NVIDIA container runtime's own words).
NO_DEVICES = ("", "void", "none")


def visible_devices_problem(containers: Iterable[ContainerView], namespace: str, policy: Policy) -> str:
    """Why one of `containers` must not set NVIDIA_VISIBLE_DEVICES; "" when none does, or the policy or
    the namespace's rule turns the check off. A runtime that honours the variable for unprivileged
    containers gives the container the GPUs it names, whatever the container requests: every GPU of the
    node with `all`, GPUs no device plugin, scheduler or quota counts. With a GPU resource the device
    plugin sets the variable itself, so a container has no reason to. Only `void`, `none` and empty
    (which expose nothing) are accepted, and privileged containers, which see every device anyway."""
    if not policy.defaults.check_visible_devices or policy.namespace(namespace).allow_visible_devices:
        return ""
    for c in containers:
        if c.visible_devices is None or c.privileged:
            continue
        if c.visible_devices_from:
            setting = f"sets NVIDIA_VISIBLE_DEVICES from a {c.visible_devices_from}, which gpupool cannot read"
        elif c.visible_devices.strip().lower() in NO_DEVICES:
            continue
        else:
            setting = f"sets NVIDIA_VISIBLE_DEVICES={shown(c.visible_devices)}"
        owned = sorted(
            {name for entries in (c.limits, c.requests) for name, _ in entries or () if policy.vendor_of(name)}
        )
        allow = f"set it to void, or ask an admin to allow it in namespace {namespace} (allowVisibleDevices)"
        if owned:
            return (
                f"container {shown(c.name)} {setting}: where the NVIDIA runtime honours the variable it would see "
                f"the GPUs it names, not only the {', '.join(owned)} it requests; leave it unset (the device "
                f"plugin sets it for the devices the container is given), {allow}"
            )
        return (
            f"container {shown(c.name)} {setting} but requests no GPU resource itself: where the NVIDIA runtime "
            "honours the variable it would use GPUs that no quota counts; leave it unset and request the GPUs "
            f"(gpupool.io/ annotations, or a resource such as {policy.vendors[policy.default_vendor].resource}: 1), "
            f"{allow}"
        )
    return ""


def all_containers(shape: PodShape) -> tuple[ContainerView, ...]:
    """The Pod's containers and init containers."""
    return (*shape.containers, *(shape.init_containers or ()))


class _Errors:
    """Collects every problem, so the user fixes a Pod in one go instead of one denial at a time."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def check(self, parse: Callable[[], T], fallback: T) -> T:
        try:
            return parse()
        except (RequestError, DeviceError) as exc:
            self.messages.append(str(exc))
            return fallback

    def raise_any(self, *more: str) -> None:
        messages = [*self.messages, *more]
        if not messages:
            return
        shown_ = messages[:MAX_PROBLEMS]
        if len(messages) > MAX_PROBLEMS:
            shown_.append(f"and {len(messages) - MAX_PROBLEMS} more problems")
        raise RequestError("; ".join(shown_))


def parse_request(shape: PodShape, policy: Policy) -> GpuRequest:
    """The validated request; raises RequestError naming what is wrong (the first few problems)."""
    ann = gpupool_annotations(shape)
    errors = _Errors()
    for key, value in list(ann.items()):
        limit = MAX_CHARS.get(key)
        if limit is not None and len(value) > limit:
            errors.messages.append(
                f"annotation {PREFIX}{key}: the value is {len(value)} characters long; accepted: at most {limit}"
            )
            del ann[key]
    unknown = sorted(set(ann) - set(KNOWN))
    if unknown:
        errors.messages.append(_unknown(unknown))
    containers = shape.containers
    if not containers:
        errors.raise_any("the Pod has no containers")
    default_vendor = policy.vendors[policy.default_vendor]
    vendor = errors.check(lambda: _vendor(ann, shape, policy), default_vendor)
    requested = requested_resources(shape, policy)
    resource = device_resource(requested, vendor)  # a MIG profile the Pod requests pins its pools
    index = errors.check(lambda: _container(ann, containers, resource or vendor.resource), 0)
    target = containers[index]
    inits = shape.init_containers or ()
    # Any of the vendor's devices the Pod already asks for (whole GPUs or partitions): then they stand.
    owned = [r for r in requested if vendor.owns(r)] or [vendor.resource]
    already = any(container_gpus(c, r) for c in (*containers, *inits) for r in owned)
    count = errors.check(lambda: _count(ann, target, resource or vendor.resource, already), 1)
    namespace = shape.namespace
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
    group = errors.check(lambda: _group(ann), NO_GROUP_RULE)
    no_device = device_request.DeviceRequest(policy.defaults.device, "policy default", None, None)
    device = errors.check(
        lambda: parse_device_request(ann, policy, namespace, vendor, resource=resource, count=count), no_device
    )
    errors.raise_any()
    counted = resource or vendor.resource
    counts = [count if i == index else container_gpus(c, counted) for i, c in enumerate(containers)]
    init_counts = [(container_gpus(c, counted), c.sidecar) for c in inits]
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
        fallback=fallback,
        pins=policy.hold_pins(dict(shape.node_selector or ())),
        pool_pin=pool,
        tolerations=Tolerations(shape.tolerations or ()),
        partitions=tuple(sorted(r for r in owned if r != vendor.resource)),
        group=group,
        resource=resource,
        devices=device.devices,
        device_source=device.source,
        min_compute=device.min_compute,
        min_cuda=device.min_cuda,
        node_selector=tuple(sorted(shape.node_selector or ())),
        requirements=shape.requirements,
        own_requests=tuple((r, n) for r in sorted(owned) if (n := pod_devices(shape, {r}))) if already else (),
        shape_bytes=shape_bytes(shape),
    )


def _unknown(keys: list[str]) -> str:
    """One message for every unknown key: the first few by name, each with a hint when one is close."""
    named = []
    for key in keys[:MAX_PROBLEMS]:
        close = difflib.get_close_matches(key, KNOWN, n=1) if len(key) <= 64 else []
        hint = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
        named.append(f"{PREFIX}{shown(key)[1:-1]}{hint}")
    more = f" and {len(keys) - MAX_PROBLEMS} more" if len(keys) > MAX_PROBLEMS else ""
    noun = "annotation" if len(keys) == 1 else "annotations"
    return f"unknown {noun} {', '.join(named)}{more}; accepted: {', '.join(PREFIX + k for k in KNOWN)}"


def _vendor(ann: dict[str, str], shape: PodShape, policy: Policy) -> VendorPolicy:
    requested = requested_resources(shape, policy)
    owners = sorted({vendor.name for r in requested if (vendor := policy.vendor_of(r)) is not None})
    if VENDOR in ann:
        name = ann[VENDOR].strip()
        if name not in policy.vendors:
            accepted = ", ".join(policy.vendors)
            raise RequestError(
                f"annotation {PREFIX}{VENDOR}: {shown(ann[VENDOR])} is not a vendor; accepted: {accepted}"
            )
        if owners and owners != [name]:
            raise RequestError(
                f"annotation {PREFIX}{VENDOR}: {shown(name)} contradicts the Pod's own "
                f"{', '.join(sorted(requested))} request"
            )
        return policy.vendors[name]
    if len(owners) > 1:
        raise RequestError(
            f"the Pod requests GPUs of several vendors ({', '.join(owners)}); set {PREFIX}{VENDOR} "
            "and request one vendor's resource"
        )
    return policy.vendors[owners[0] if owners else policy.default_vendor]


def _container(ann: dict[str, str], containers: tuple[ContainerView, ...], resource: str) -> int:
    names = [c.name for c in containers]
    if CONTAINER in ann:
        name = ann[CONTAINER].strip()
        if name not in names:
            listed = ", ".join(names[:MAX_PROBLEMS]) + (
                f" and {len(names) - MAX_PROBLEMS} more" if len(names) > MAX_PROBLEMS else ""
            )
            raise RequestError(f"annotation {PREFIX}{CONTAINER}: no container named {shown(name)}; accepted: {listed}")
        return names.index(name)
    # The container that already asks for the GPUs, else the first one.
    return next((i for i, c in enumerate(containers) if container_gpus(c, resource)), 0)


def _count(ann: dict[str, str], container: ContainerView, resource: str, pod_has_gpus: bool) -> int:
    """GPUs for the target container: the annotation, else its own limit; 0 (leave it alone) when only
    other containers of the Pod, such as an init container, ask for GPUs; else 1."""
    existing = {}
    for kind, entries in (("limits", container.limits), ("requests", container.requests)):
        for name, raw in entries or ():
            if name != resource:
                continue
            value = parse_count(raw)
            if value < 1 or (raw.strip() if isinstance(raw, str) else str(raw)) != str(value):
                raise RequestError(
                    f"container {shown(container.name)}: {kind} {resource}: {shown(raw)} is not a whole number of "
                    "GPUs ≥ 1"
                )
            existing[kind] = value
    if len(set(existing.values())) > 1:
        raise RequestError(
            f"container {shown(container.name)}: limits {resource}={existing['limits']} and requests "
            f"{resource}={existing['requests']} differ; Kubernetes requires them equal for GPUs"
        )
    current = next(iter(existing.values()), None)
    if COUNT not in ann:
        if current is not None:
            return current
        return 0 if pod_has_gpus else 1
    raw = ann[COUNT].strip()
    # ASCII digits only: str.isdigit() also accepts superscript and full-width digits, which int() refuses
    # or reads as another number.
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_COUNT:
        raise RequestError(
            f"annotation {PREFIX}{COUNT}: {shown(ann[COUNT])} is not a whole number of GPUs; accepted: 1 to {MAX_COUNT}"
        )
    count = int(raw)
    if current is not None and current != count:
        raise RequestError(
            f"annotation {PREFIX}{COUNT}: {count} contradicts container {shown(container.name)}'s "
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
    # Case-insensitive, as products are: `High` is the policy's `high` (its own spelling wins when it has one).
    spelled = {c.casefold(): c for c in reversed(policy.classes)}
    items = [
        c if (c := raw.strip()) in policy.classes else spelled.get(c.casefold(), c) for raw in ann[CLASS].split(",")
    ]
    accepted = ", ".join(policy.classes)
    if not all(items):
        raise RequestError(
            f"annotation {PREFIX}{CLASS}: {shown(ann[CLASS])} has an empty entry; accepted: a class or an ordered "
            f"list such as 'medium,high' of: {accepted}"
        )
    for c in items:
        if c not in policy.classes:
            raise RequestError(f"annotation {PREFIX}{CLASS}: {shown(c)} is not a class; accepted: {accepted}")
        if c not in allowed:
            raise RequestError(
                f"annotation {PREFIX}{CLASS}: class {shown(c)} is not allowed in namespace {namespace}; "
                f"accepted here: {', '.join(allowed)}"
            )
    if len(set(items)) != len(items):
        raise RequestError(f"annotation {PREFIX}{CLASS}: {shown(ann[CLASS])} names a class twice")
    return tuple(items), "annotation"


def _memory(ann: dict[str, str]) -> int:
    if MEMORY not in ann:
        return 0
    try:
        value = parse_bytes(ann[MEMORY])
    except QuantityError:
        value = -1
    accepted = "accepted: a Kubernetes quantity below 8Ei such as 24Gi, 40G or 16384Mi"
    if value <= 0:
        raise RequestError(
            f"annotation {PREFIX}{MEMORY}: {shown(ann[MEMORY])} is not a positive memory quantity; {accepted}"
        )
    text = ann[MEMORY].strip()
    if value < GIB and text.isascii() and text.isdigit():  # a bare number is bytes: surely meant as GiB
        raise RequestError(
            f"annotation {PREFIX}{MEMORY}: {shown(text)} is {value} bytes; did you mean {value}Gi? A number "
            f"without a unit under 1Gi is refused; {accepted}"
        )
    return -(-value // MIB)  # round up to whole MiB


def _products(ann: dict[str, str], vendor: VendorPolicy) -> tuple[Tokens, ...]:
    if PRODUCT not in ann:
        return ()
    items = [p.strip() for p in ann[PRODUCT].split(",")]
    for p in items:
        if not _PRODUCT_TOKEN.match(p):
            raise RequestError(
                f"annotation {PREFIX}{PRODUCT}: {shown(p)} is not a product token; accepted: comma-separated names "
                "of letters, digits, '.', '_' and '-', such as A100 or H100-80GB"
            )
    return tuple(tokens(p, vendor.product_prefixes) for p in items)


def _driver(ann: dict[str, str]) -> tuple[int, ...] | None:
    if DRIVER not in ann:
        return None
    version = parse_version(ann[DRIVER])
    if version is None:
        raise RequestError(
            f"annotation {PREFIX}{DRIVER}: {shown(ann[DRIVER])} is not a driver version; accepted: dotted numbers "
            "such as 535 or 535.104.05"
        )
    return version


def _flag(ann: dict[str, str], key: str, default: bool) -> bool:
    if key not in ann:
        return default
    value = ann[key].strip().lower()
    if value not in ("true", "false"):
        raise RequestError(f"annotation {PREFIX}{key}: {shown(ann[key])} is not a boolean; accepted: true, false")
    return value == "true"


def _pool(ann: dict[str, str]) -> PoolKey | None:
    if POOL not in ann:
        return None
    pool = PoolKey.parse(ann[POOL].strip())
    if pool is None:
        raise RequestError(
            f"annotation {POOL_ANNOTATION}: {shown(ann[POOL])} is not vendor/class/product; gpupool sets it, "
            "remove it to let gpupool choose"
        )
    return pool


def _group(ann: dict[str, str]) -> GroupRule:
    """The group annotations: `group` is checked here (the view reads it as the Pod's group, unstripped,
    as the inventory does), `group-policy` and `group-size` make the rule."""
    if GROUP not in ann and GROUP_POLICY not in ann and GROUP_SIZE not in ann:
        return NO_GROUP_RULE
    if GROUP in ann and not valid_name(ann[GROUP]):
        raise RequestError(
            f"annotation {PREFIX}{GROUP}: {shown(ann[GROUP])} is not a group name; accepted: 1 to {MAX_GROUP_NAME} "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    policy = ann.get(GROUP_POLICY, "prefer").strip()
    if policy not in GROUP_POLICIES:
        raise RequestError(
            f"annotation {PREFIX}{GROUP_POLICY}: {shown(ann[GROUP_POLICY])} is not a group policy; accepted: "
            f"{', '.join(GROUP_POLICIES)}"
        )
    size = 0
    if GROUP_SIZE in ann:
        raw = ann[GROUP_SIZE].strip()
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_GROUP_SIZE:
            raise RequestError(
                f"annotation {PREFIX}{GROUP_SIZE}: {shown(ann[GROUP_SIZE])} is not a whole number of Pods; accepted: "
                f"1 to {MAX_GROUP_SIZE}"
            )
        size = int(raw)
    return GroupRule("strict" if policy == "strict" else "prefer", size)
