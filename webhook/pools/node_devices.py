"""The devices a node offers, read from its labels the way GPU Feature Discovery writes them.

One node may offer several kinds of device of one vendor, each on its own resource:
- its vendor resource (`nvidia.com/gpu`), or another resource of its whole devices (Ascend's 310P cards,
  `huawei.com/Ascend310P`), carries whole GPUs, time-sliced or MPS replicas (a `-SHARED` product,
  `nvidia.com/gpu.replicas` above 1, or `nvidia.com/gpu.sharing-strategy` time-slicing or mps), or,
  under the single MIG strategy, MIG instances (product `<model>-MIG-<profile>`, with
  `nvidia.com/gpu.memory` and `.count` describing the instances);
- with GFD's `renameByDefault`, the replicas are on a resource of their own, `nvidia.com/gpu.shared`,
  still described by the `nvidia.com/gpu.*` labels but with the product unsuffixed;
- under the mixed MIG strategy, each profile is a resource of its own (`nvidia.com/mig-3g.20gb`),
  described by `<resource>.product`, `.memory`, `.count` and `.replicas`; the node's remaining whole GPUs
  stay on the vendor resource. Ascend's virtual NPUs (`huawei.com/Ascend910-4c`) are partitions too,
  described by no label: their product is the node's with the template (`huawei-Ascend910-vNPU-4c`),
  their memory unknown.

A device's product is exact (`NVIDIA-A100-SXM4-40GB-MIG-3g.20gb`, `Tesla-T4-SHARED`), and its memory is
what one device can count on: a MIG instance's own, a replica's share of its GPU. Nodes that must not be
used are reported instead: a MIG layout GFD calls invalid, and a MIG configuration that is changing.
Also here: a node's compute capability and the CUDA version its driver supports.

Pure functions of the node's labels, allocatable resources and the policy; webhook.pools.nodes turns
each device into the facts of one pool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from webhook.domain.devices import (
    INVALID_PROFILE,
    MIG,
    SHARED,
    SHARED_SUFFIX,
    cuda_of_driver,
    partition_product,
    profile_memory_mib,
    split_product,
)
from webhook.domain.memory import sold_mib
from webhook.domain.model import NodeInfo, Selector
from webhook.domain.policy import Policy, VendorPolicy
from webhook.domain.products import Tokens, parse_version, tokens
from webhook.domain.quantity import MIB, QuantityError, parse_bytes

UNKNOWN_PRODUCT = "unknown"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"  # written by the GPU Operator's MIG manager
MIG_CHANGING = ("pending", "rebooting", "failed")  # a layout being applied, or one that could not be
SHARING_STRATEGIES = ("time-slicing", "mps")  # GFD's <resource>.sharing-strategy when replicas are shared
_MAX_NUMBER_DIGITS = 6  # counts and MiB in labels: more than any device has
_MEMORY = re.compile(r"^([0-9]{1,18})\s*([A-Za-z]*)$")  # ASCII digits, bounded: int() stays cheap


@dataclass(frozen=True, slots=True)
class Device:
    """One kind of device a node offers on one resource."""

    resource: str
    kind: str  # gpu, mig or shared
    product: str  # exact: the pool's product
    profile: str  # the MIG profile ("" for a whole GPU, and for a replica of one)
    replicas: int  # replicas per GPU of a shared device (0: unknown or not shared)
    selector: Selector  # labels that reach the nodes offering it (the class label is added by the caller)
    memory_mib: int  # what one device can count on, as reported; 0 when unknown
    allocatable: int
    sold_mib: int = 0  # its size as sold (webhook.domain.memory), a replica's share; 0 when unknown


def node_devices(node: NodeInfo, vendor: VendorPolicy, policy: Policy) -> tuple[list[Device], list[str]]:
    """The vendor's devices on the node, and why some of them cannot be used (nothing when the node has
    none of the vendor's resources)."""
    labels, allocatable = node.labels, node.allocatable
    partitions = sorted(r for r in allocatable if vendor.partition_prefix_of(r)) if vendor.partition_prefixes else []
    whole = [r for r in vendor.whole_resources if r in allocatable]
    renamed = [r for r in vendor.resources if r in allocatable and vendor.renamed(r)]
    raw = labels.get(vendor.product_label, "").strip()
    parts = split_product(raw)
    if parts.profile == INVALID_PROFILE:  # GFD's own verdict, whatever the device plugin still advertises
        return [], [
            f"GPU Feature Discovery reports an invalid MIG layout ({vendor.product_label}={raw}, count 0): under "
            "the single MIG strategy every GPU of the node must be in MIG mode with one profile"
        ]
    if not whole and not renamed and not partitions:
        return [], []
    state = labels.get(MIG_STATE_LABEL, "") if vendor.partition_prefixes else ""
    if state in MIG_CHANGING:
        return [], [f"its MIG configuration is not in place ({MIG_STATE_LABEL}={state})"]
    devices: list[Device] = []
    problems: list[str] = []
    for resource in whole:
        if parts.profile and labels.get(f"{resource}.count") == "0":
            problems.append(
                f"GPU Feature Discovery reports no MIG instances ({vendor.product_label}={raw}, "
                f"{resource}.count=0): the MIG layout is invalid"
            )
        else:
            # With the replicas on a resource of their own, the sharing labels describe those, not these.
            sharing = f"{resource}{vendor.shared_suffix}" not in renamed
            devices.append(_whole_device(node, vendor, policy, resource, labelled=resource if sharing else ""))
    devices.extend(_whole_device(node, vendor, policy, r, labelled=vendor.renamed(r), renamed=True) for r in renamed)
    devices.extend(_partition_device(node, vendor, resource, parts.model) for resource in partitions)
    return devices, problems


def _whole_device(
    node: NodeInfo,
    vendor: VendorPolicy,
    policy: Policy,
    resource: str,
    *,
    labelled: str,
    renamed: bool = False,
) -> Device:
    """What a resource of whole devices carries: whole GPUs, replicas, or single-strategy MIG instances.
    `labelled` is the resource GFD's sharing labels (`<resource>.replicas`, `.sharing-strategy`, `.count`)
    are keyed by, "" when they describe another resource; `renamed`: the resource carries replicas only
    (GFD's renameByDefault puts them on `nvidia.com/gpu.shared`, and leaves the product unsuffixed)."""
    labels = node.labels
    raw = labels.get(vendor.product_label, "").strip()
    parts = split_product(raw)
    replicas = _number(labels.get(f"{labelled}.replicas", "")) if labelled else 0
    strategy = labels.get(f"{labelled}.sharing-strategy", "") if labelled else ""
    shared = renamed or parts.shared or replicas > 1 or strategy in SHARING_STRATEGIES
    product = raw or UNKNOWN_PRODUCT
    selector = [(vendor.product_label, raw)] if raw else []
    if shared and not parts.shared:
        # Not GFD's own labelling (it adds the suffix unless the resource is renamed): name the device as
        # GFD would. On the GPUs' own resource, pin the label that tells these nodes from whole ones; a
        # renamed resource reaches only nodes that offer it.
        product = f"{product}{SHARED_SUFFIX}"
        if not renamed:
            pin = f"{resource}.replicas" if replicas > 1 else f"{resource}.sharing-strategy"
            selector.append((pin, labels[pin]))
    memory = _memory_mib(labels.get(vendor.memory_label, "") if vendor.memory_label else "", vendor.memory_unit_mib)
    table = 0 if parts.profile else policy.product_memory_mib(tokens(parts.model, vendor.product_prefixes))
    # Under the single strategy GFD writes the instance's memory in the memory label.
    memory = memory or (profile_memory_mib(parts.profile) if parts.profile else table)
    sold = sold_mib(raw, table)
    if shared:
        replicas = replicas if replicas > 1 else _replicas_from_count(node, resource, labelled or resource)
        memory, sold = (memory // replicas, sold // replicas) if replicas else (0, 0)
    return Device(
        resource=resource,
        kind=SHARED if shared else (MIG if parts.profile else "gpu"),
        product=product,
        profile=parts.profile,
        replicas=replicas if shared else 0,
        selector=tuple(selector),
        memory_mib=memory,
        allocatable=node.allocatable[resource],
        sold_mib=sold,
    )


def _partition_device(node: NodeInfo, vendor: VendorPolicy, resource: str, model: str) -> Device:
    """A partition's resource, `<prefix><profile>`: a mixed-strategy MIG instance (described by
    `<resource>.product` and friends), its replicas on a renamed `<prefix><profile>.shared`, or a virtual
    NPU (`huawei.com/Ascend910-4c`, which no label describes)."""
    labels = node.labels
    base = vendor.renamed(resource) or resource  # a renamed partition's labels are keyed by its own name
    profile = base[len(vendor.partition_prefix_of(base)) :]
    label = f"{base}.product"
    raw = labels.get(label, "").strip()
    product = raw if split_product(raw).profile else partition_product(model or UNKNOWN_PRODUCT, profile)
    replicas = _number(labels.get(f"{base}.replicas", ""))
    shared = base != resource or split_product(product).shared or replicas > 1
    if shared and not split_product(product).shared:
        product = f"{product}{SHARED_SUFFIX}"
    memory = _number(labels.get(f"{base}.memory", "")) or profile_memory_mib(profile)
    sold = sold_mib(profile)
    if shared:
        replicas = replicas if replicas > 1 else 0
        memory, sold = (memory // replicas, sold // replicas) if replicas else (0, 0)
    if raw:
        selector: Selector = ((label, raw),)
    else:  # the resource itself reaches only nodes that offer it; the model label narrows it to the model
        model_label = labels.get(vendor.product_label, "")
        selector = ((vendor.product_label, model_label),) if model_label else ()
    return Device(
        resource=resource,
        kind=SHARED if shared else MIG,
        product=product,
        profile=profile,
        replicas=replicas,
        selector=selector,
        memory_mib=memory,
        allocatable=node.allocatable[resource],
        sold_mib=sold,
    )


def _replicas_from_count(node: NodeInfo, resource: str, labelled: str) -> int:
    """Replicas per GPU from the resource's allocatable and GFD's count of physical GPUs (the label of
    the resource `labelled`); 0 when unknown."""
    gpus = _number(node.labels.get(f"{labelled}.count", ""))
    replicas = node.allocatable.get(resource, 0) // gpus if gpus else 0
    return replicas if replicas > 1 else 0


def compute_capability(
    labels: dict[str, str], vendor: VendorPolicy, policy: Policy, product: Tokens
) -> tuple[int, ...] | None:
    """The compute capability: the vendor's labels (GFD's `nvidia.com/gpu.compute.major` and `.minor`),
    else the product table; None when neither says."""
    if vendor.compute_labels and all(k in labels for k in vendor.compute_labels):
        version = parse_version(".".join(labels[k] for k in vendor.compute_labels))
        if version is not None:
            return version
    return policy.product_compute(product)


def cuda_version(
    labels: dict[str, str], vendor: VendorPolicy, driver: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """The CUDA version the node's driver supports: the vendor's label (GFD's
    `nvidia.com/cuda.runtime-version.full`), else its major and minor labels, else, for a vendor that
    speaks CUDA, what NVIDIA's table says the driver runs; None when unknown."""
    if not vendor.has_cuda:
        return None
    if vendor.cuda_label and vendor.cuda_label in labels:
        version = parse_version(labels[vendor.cuda_label])
        if version is not None:
            return version
    if vendor.legacy_cuda_labels and all(k in labels for k in vendor.legacy_cuda_labels):
        version = parse_version(".".join(labels[k] for k in vendor.legacy_cuda_labels))
        if version is not None:
            return version
    return cuda_of_driver(driver)


def _number(value: str) -> int:
    """A whole number label (`4`), ASCII digits only; 0 when absent or anything else."""
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) <= _MAX_NUMBER_DIGITS else 0


def _memory_mib(value: str, unit_mib: int) -> int:
    """A memory label: a bare number in the vendor's unit (GFD: MiB), or a number with that unit's
    letter (AMD: `64G`), or any Kubernetes quantity. 0 when absent or unreadable."""
    match = _MEMORY.match(value.strip())
    unit_letter = "M" if unit_mib == 1 else "G"
    if match and (not match.group(2) or match.group(2)[0].upper() == unit_letter):
        return int(match.group(1)) * unit_mib
    try:
        return parse_bytes(value) // MIB if value else 0
    except QuantityError:
        return 0
