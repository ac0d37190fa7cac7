"""What a Pod asks of its device: which kinds it accepts (`gpupool.io/device`), the compute capability
(`gpupool.io/min-compute-capability`) and the CUDA version (`gpupool.io/min-cuda`) it needs.

Read from the Pod's gpupool.io/ annotations and the device resource it requests itself, for
webhook.admission.request to put in the GpuRequest. Every bad value raises a DeviceError naming the
annotation, the value and what is accepted; values are bounded (`MAX_CHARS`) before they are read, and
versions are ASCII digits read by linear code (webhook.domain.products.parse_version).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from webhook.domain.devices import DEVICE_LIST_HELP, SHARED, parse_device_list
from webhook.domain.model import PREFIX
from webhook.domain.policy import Policy, VendorPolicy
from webhook.domain.products import parse_version
from webhook.domain.quantity import shown

DEVICE, COMPUTE, CUDA = "device", "min-compute-capability", "min-cuda"
ANNOTATIONS = (DEVICE, COMPUTE, CUDA)
MAX_CHARS = {DEVICE: 32, COMPUTE: 16, CUDA: 16}  # the longest value each accepts, checked before parsing


class DeviceError(ValueError):
    """A device annotation is malformed or contradicts the Pod; the message is shown to the user."""


class DeviceRequest(NamedTuple):
    devices: tuple[str, ...]  # kinds in the order of preference
    source: str  # where they come from: annotation, namespace default, policy default, requested resource
    min_compute: tuple[int, ...] | None
    min_cuda: tuple[int, ...] | None


def device_resource(requested: set[str], vendor: VendorPolicy) -> str:
    """The one device resource of the vendor the Pod requests itself (its GPUs, another card's resource,
    renamed replicas, one MIG profile or virtual NPU): it pins the pools as it pins the vendor. "" when it
    requests none, or several (then nothing is placed)."""
    owned = sorted(r for r in requested if vendor.owns(r))
    return owned[0] if len(owned) == 1 else ""


def parse_device_request(
    ann: dict[str, str], policy: Policy, namespace: str, vendor: VendorPolicy, *, resource: str, count: int
) -> DeviceRequest:
    """The device annotations of a Pod whose vendor is `vendor`, that requests `resource` itself ("" for
    none) and `count` devices in its target container."""
    devices, source = _devices(ann, policy, namespace, vendor, resource)
    if devices == (SHARED,) and count > 1:
        where = "" if source == "annotation" else f" (the {source})"
        asked = (
            f"annotation {PREFIX}gpu-count: {count}" if "gpu-count" in ann else f"{count} devices ({PREFIX}gpu-count)"
        )
        raise DeviceError(
            f"{asked} with {PREFIX}{DEVICE}: shared{where}: a shared replica is one share of a GPU, and a "
            f"container gets one; accepted: {PREFIX}gpu-count 1, or gpu or mig in {PREFIX}{DEVICE}"
        )
    return DeviceRequest(devices, source, _version(ann, policy, vendor, _COMPUTE), _version(ann, policy, vendor, _CUDA))


def _devices(
    ann: dict[str, str], policy: Policy, namespace: str, vendor: VendorPolicy, resource: str
) -> tuple[tuple[str, ...], str]:
    # A partition's resource (a MIG instance, a virtual NPU) or renamed replicas' carry only some kinds.
    kinds = vendor.device_kinds(resource) if resource else ()
    if DEVICE not in ann:
        if kinds:  # the Pod's own request says which device it takes
            return kinds, "requested resource"
        own = bool(policy.namespace(namespace).device)
        return policy.device_default(namespace), "namespace default" if own else "policy default"
    value = ann[DEVICE]
    try:
        devices = parse_device_list(value)
    except ValueError as exc:
        raise DeviceError(f"annotation {PREFIX}{DEVICE}: {shown(value)} {exc}; accepted: {DEVICE_LIST_HELP}") from None
    if kinds and not set(devices) & set(kinds):
        what = "shared replicas" if kinds == (SHARED,) else "a partition of a device"
        raise DeviceError(
            f"annotation {PREFIX}{DEVICE}: {shown(value)} contradicts the Pod's own {resource} request ({what}); "
            f"accepted here: {', '.join(kinds)}"
        )
    return devices, "annotation"


class _Versioned(NamedTuple):
    """A `major.minor` annotation that only some vendors' devices have."""

    key: str
    speaks: Callable[[VendorPolicy], bool]  # does the vendor's device have it?
    lacks: str  # what the others' lack, as the refusal says it
    what: str
    example: str


_COMPUTE = _Versioned(COMPUTE, lambda v: bool(v.compute_labels), "have no compute capability", "a compute capability",
                      "8.0 or 8.9")  # fmt: skip
_CUDA = _Versioned(CUDA, lambda v: v.has_cuda, "do not run CUDA", "a CUDA version", "12.4")


def _version(ann: dict[str, str], policy: Policy, vendor: VendorPolicy, spec: _Versioned) -> tuple[int, ...] | None:
    """The annotation as a version; None when absent. Refused on a vendor whose devices lack it, and when
    it is not `major.minor`."""
    if spec.key not in ann:
        return None
    value = ann[spec.key]
    if not spec.speaks(vendor):
        which = ", ".join(v.name for v in policy.vendors.values() if spec.speaks(v)) or "none"
        raise DeviceError(
            f"annotation {PREFIX}{spec.key}: {shown(value)}: {vendor.name} devices {spec.lacks}; accepted: only for "
            f"{which}"
        )
    version = parse_version(value)
    if version is None or len(version) > 2:
        raise DeviceError(
            f"annotation {PREFIX}{spec.key}: {shown(value)} is not {spec.what}; accepted: major.minor such as "
            f"{spec.example}"
        )
    return version
