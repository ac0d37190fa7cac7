"""What a node contributes to the pool: its pool, the labels that pin it, its taints, memory and driver.

A pure function of the node and the policy. A node that has a vendor's GPU resource but cannot be put
in a class (an unknown class label, a product the table does not know) is reported, not guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from webhook.domain.model import NodeInfo, PoolKey, Taint
from webhook.domain.model import Selector as Selector  # noqa: PLC0414 (re-exported for webhook.pools.index)
from webhook.domain.policy import Policy, VendorPolicy
from webhook.domain.products import normalise_product, parse_version, tokens
from webhook.domain.quantity import MIB, QuantityError, parse_bytes

UNKNOWN_PRODUCT = "unknown"
_BLOCKING = ("NoSchedule", "NoExecute")
_MEMORY = re.compile(r"^([0-9]{1,18})\s*([A-Za-z]*)$")  # ASCII digits, bounded: int() stays cheap


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """One vendor's GPUs on one node."""

    node: str
    pool: PoolKey
    resource: str
    selector: Selector  # the nodeSelector that pins this node's pool: class label, product label
    gpu_taints: tuple[Taint, ...]  # taints the policy names for this vendor: gpupool tolerates them
    other_taints: tuple[Taint, ...]  # other NoSchedule/NoExecute taints: the Pod must tolerate them
    memory_mib: int  # per GPU; 0 when unknown
    driver: tuple[int, ...] | None
    allocatable: int
    usable: bool  # Ready and schedulable


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
        if vendor.resource not in node.allocatable:
            continue
        result = _vendor_facts(node, vendor, policy)
        if isinstance(result, str):
            problems.append(Unclassified(node.name, vendor.name, result))
        else:
            facts.append(result)
    return facts, problems


def _vendor_facts(node: NodeInfo, vendor: VendorPolicy, policy: Policy) -> NodeFacts | str:
    labels = node.labels
    raw_product = labels.get(vendor.product_label, "")
    product = normalise_product(raw_product) or UNKNOWN_PRODUCT
    product_tokens = tokens(product, vendor.product_prefixes)
    label_class = labels.get(policy.class_label, "")
    if label_class:
        if label_class not in policy.classes:
            return (
                f"label {policy.class_label}={label_class} is not a class of the policy ({', '.join(policy.classes)})"
            )
        gpu_class = label_class
    else:
        gpu_class = policy.product_class(product_tokens) if raw_product else ""
        if not gpu_class:
            return (
                f"no {policy.class_label} label and product {raw_product or '(no ' + vendor.product_label + ')'} "
                "is not in the policy's product table"
            )
    selector: list[tuple[str, str]] = []
    if label_class:
        selector.append((policy.class_label, label_class))
    if raw_product:
        selector.append((vendor.product_label, raw_product))
    gpu_taints = tuple(t for t in node.taints if vendor.gpu_taint(t))
    other_taints = tuple(t for t in node.taints if t.effect in _BLOCKING and not vendor.gpu_taint(t))
    return NodeFacts(
        node=node.name,
        pool=PoolKey(vendor.name, gpu_class, product),
        resource=vendor.resource,
        selector=tuple(sorted(selector)),
        gpu_taints=gpu_taints,
        other_taints=other_taints,
        memory_mib=_memory_mib(labels.get(vendor.memory_label, "") if vendor.memory_label else "", vendor)
        or policy.product_memory_mib(product_tokens),
        driver=_driver(labels, vendor),
        allocatable=node.allocatable[vendor.resource],
        usable=node.ready and not node.unschedulable,
    )


def _memory_mib(value: str, vendor: VendorPolicy) -> int:
    """A memory label: a bare number in the vendor's unit (GFD: MiB), or a number with that unit's
    letter (AMD: `64G`), or any Kubernetes quantity. 0 when absent or unreadable."""
    match = _MEMORY.match(value.strip())
    unit_letter = "M" if vendor.memory_unit_mib == 1 else "G"
    if match and (not match.group(2) or match.group(2)[0].upper() == unit_letter):
        return int(match.group(1)) * vendor.memory_unit_mib
    try:
        return parse_bytes(value) // MIB if value else 0
    except QuantityError:
        return 0


def _driver(labels: dict[str, str], vendor: VendorPolicy) -> tuple[int, ...] | None:
    if vendor.driver_label and vendor.driver_label in labels:
        return parse_version(labels[vendor.driver_label])
    if vendor.legacy_driver_labels and all(k in labels for k in vendor.legacy_driver_labels):
        return parse_version(".".join(labels[k] for k in vendor.legacy_driver_labels))
    return None
