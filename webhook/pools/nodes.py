"""What a node contributes to the pool: for each device it offers, its pool, the labels that pin it, its
taints, memory, driver, compute capability and CUDA version.

A pure function of the node and the policy. The devices come from webhook.pools.node_devices; a node that has
a vendor's devices but cannot be put in a class (an unknown class label, a product the table does not
know), or whose devices must not be used (an invalid or changing MIG layout), is reported, not guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.domain.devices import GPU
from webhook.domain.memory import offered_mib
from webhook.domain.model import NodeInfo, PoolKey, Taint
from webhook.domain.model import Selector as Selector  # noqa: PLC0414 (re-exported for webhook.pools.index)
from webhook.domain.policy import Policy, VendorPolicy
from webhook.domain.products import parse_version, tokens
from webhook.mig.follow import under_way
from webhook.pools.node_devices import UNKNOWN_PRODUCT as UNKNOWN_PRODUCT  # noqa: PLC0414 (re-exported)
from webhook.pools.node_devices import Device, compute_capability, cuda_version, node_devices

_BLOCKING = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """One kind of device on one node: what it contributes to its pool."""

    node: str
    pool: PoolKey
    resource: str
    selector: Selector  # the nodeSelector that pins this node's pool: class label, product label
    gpu_taints: tuple[Taint, ...]  # taints the policy names for this vendor: gpupool tolerates them
    other_taints: tuple[Taint, ...]  # other NoSchedule/NoExecute taints: the Pod must tolerate them
    memory_mib: int  # per device; 0 when unknown
    driver: tuple[int, ...] | None
    allocatable: int
    usable: bool  # Ready and schedulable, and no MIG re-cut of gpupool under way (webhook.mig.follow)
    kind: str = GPU  # gpu, mig or shared
    profile: str = ""  # the MIG profile of a MIG instance (or of a shared one)
    replicas: int = 0  # replicas per GPU of a shared device; 0 when unknown or not shared
    compute: tuple[int, ...] | None = None  # compute capability, None when unknown
    cuda: tuple[int, ...] | None = None  # the CUDA version the driver supports, None when unknown
    sold_mib: int = 0  # per device, its size as sold (webhook.domain.memory); 0 when unknown

    @property
    def offered_mib(self) -> int:
        """The memory `min-memory` is compared with (webhook.domain.memory.offered_mib)."""
        return offered_mib(self.sold_mib, self.memory_mib)


@dataclass(frozen=True, slots=True)
class Unclassified:
    """A node with GPUs that gpupool cannot place Pods on, and why."""

    node: str
    vendor: str
    reason: str


def node_facts(node: NodeInfo, policy: Policy) -> tuple[list[NodeFacts], list[Unclassified]]:
    facts: list[NodeFacts] = []
    problems: list[Unclassified] = []
    for vendor in policy.vendors.values():
        devices, unusable = node_devices(node, vendor, policy)
        problems.extend(Unclassified(node.name, vendor.name, reason) for reason in unusable)
        if not devices:
            continue
        driver = _driver(node.labels, vendor)
        for device in devices:
            result = _device_facts(node, vendor, policy, device, driver)
            if isinstance(result, str):
                problems.append(Unclassified(node.name, vendor.name, result))
            else:
                facts.append(result)
    return facts, problems


def _device_facts(
    node: NodeInfo, vendor: VendorPolicy, policy: Policy, device: Device, driver: tuple[int, ...] | None
) -> NodeFacts | str:
    labels = node.labels
    product_tokens = tokens(device.product, vendor.product_prefixes)
    label_class = labels.get(policy.class_label, "")
    if label_class:
        if label_class not in policy.classes:
            return (
                f"label {policy.class_label}={label_class} is not a class of the policy ({', '.join(policy.classes)})"
            )
        gpu_class = label_class
    else:
        gpu_class = policy.product_class(product_tokens) if device.product != UNKNOWN_PRODUCT else ""
        if not gpu_class:
            named = device.product if device.product != UNKNOWN_PRODUCT else f"(no {vendor.product_label})"
            return f"no {policy.class_label} label and product {named} is not in the policy's product table"
    selector = [*device.selector, *([(policy.class_label, label_class)] if label_class else [])]
    gpu_taints = tuple(t for t in node.taints if vendor.gpu_taint(t))
    other_taints = tuple(t for t in node.taints if t.effect in _BLOCKING and not vendor.gpu_taint(t))
    return NodeFacts(
        node=node.name,
        pool=PoolKey(
            vendor.name, gpu_class, device.product, "" if device.resource == vendor.resource else device.resource
        ),
        resource=device.resource,
        selector=tuple(sorted(selector)),
        gpu_taints=gpu_taints,
        other_taints=other_taints,
        memory_mib=device.memory_mib,
        driver=driver,
        allocatable=device.allocatable,
        usable=node.ready and not node.unschedulable and not under_way(node.annotations),
        kind=device.kind,
        profile=device.profile,
        replicas=device.replicas,
        compute=compute_capability(labels, vendor, policy, product_tokens),
        cuda=cuda_version(labels, vendor, driver),
        sold_mib=device.sold_mib,
    )


def _driver(labels: dict[str, str], vendor: VendorPolicy) -> tuple[int, ...] | None:
    if vendor.driver_label and vendor.driver_label in labels:
        return parse_version(labels[vendor.driver_label])
    if vendor.legacy_driver_labels and all(k in labels for k in vendor.legacy_driver_labels):
        return parse_version(".".join(labels[k] for k in vendor.legacy_driver_labels))
    return None
