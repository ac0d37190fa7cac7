"""What one Pod or reservation holds, and where a Pod's GPUs count (README "How gpupool decides", 7).

A Pod bound to a node uses GPUs on that node and counts them against the class of the node's pool,
whatever its annotations say (`bound_claim`). An unbound Pod holds its GPUs in the pool its nodeSelector
or gpupool.io/pool annotation pins it to, and counts them against that pool's class (`unbound_claim`).
Both read the capacity index: which pools a node is in, which pools a nodeSelector reaches, the memory
per GPU of a node or pool. Every Pod also counts its GPU requests against its namespace (the quota forms
gpupool counts itself), the GPU memory it holds (the policy's memoryQuota), and, with a workload group
and a gpupool.io/pool annotation, one member of its group on that pool. The ledger
(webhook.pools.ledger) works claims out, keeps them, and works them out again when the nodes change.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import NamedTuple

from webhook.domain.devices import SHARED_SUFFIX
from webhook.domain.model import PodInfo, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.nodes import NodeFacts, Selector
from webhook.pools.pool import Pool

Counts = tuple[tuple[str, int], ...]  # (resource or class, GPUs)


class Claim(NamedTuple):
    """What one Pod or reservation adds to the ledger, so it can be taken back exactly. (A NamedTuple:
    one is built per admission, cheaper than a frozen dataclass; and a reservation is this one object,
    which is all a full garbage collection has to walk for each of them.)"""

    namespace: str
    node: str = ""  # bound: real usage on this node
    requests: Counts = ()  # bound: GPUs per resource on that node
    holds: tuple[tuple[PoolKey, int], ...] = ()  # not bound: GPUs held per pool (pending)
    pins: Selector = ()  # the pool labels its nodeSelector pins: which of the pool's groups a hold reaches
    classes: Counts = ()  # GPUs counted against the namespace's classes
    reserved: tuple[str, int] = ("", 0)  # (resource, GPUs) not yet in any quota's status.used
    who: tuple[str, str, str] = ("", "", "")  # a reservation's Pod: (namespace, name, generateName)
    echoed: bool = False  # a reservation a re-invocation of its Pod has matched already
    counted: Counts = ()  # a Pod's GPU requests, counted against its namespace by gpupool itself
    memory_mib: int = 0  # GPU memory held: devices x memory per device of the node or pool
    group: tuple[str, PoolKey] | None = None  # (workload group, the pool it holds a member of the group in)
    # Unbound: each pool its pins reach, with a node of it that could take the Pod ("" for none), so that
    # only a change of those nodes or pools works it out again (webhook.pools.unbound).
    watched: tuple[tuple[PoolKey, str], ...] = ()
    # A reservation its Pod's validating call confirmed (webhook.admission.validation): no later call finds
    # it to take it back, so a review posted for the same Pod name cannot drop it.
    confirmed: bool = False


MemoryOf = Callable[[PoolKey], int]  # memory per GPU of a pool (MiB), 0 when not known
Runnable = Callable[[Pool, PodInfo, Selector], str]  # a node of the pool that could ever take the Pod, or ""


def bound_claim(pod: PodInfo, node_facts: list[NodeFacts]) -> Claim:
    """A Pod bound to a node whose facts are `node_facts`: its requests are used there."""
    requests = tuple(pod.gpu_requests.items())
    return Claim(
        pod.namespace,
        node=pod.node,
        requests=requests,
        classes=node_classes(node_facts, requests),
        counted=requests,
        memory_mib=node_memory(node_facts, requests),
        group=group_member(pod),
    )


def group_member(pod: PodInfo) -> tuple[str, PoolKey] | None:
    """The Pod as a member of its workload group on the pool its gpupool.io/pool annotation names;
    None without a group or a placement."""
    if not pod.group or not pod.pool:
        return None
    pool = PoolKey.parse(pod.pool)
    return (pod.group, pool) if pool is not None else None


def node_memory(node_facts: list[NodeFacts], requests: Counts) -> int:
    """GPU memory a bound Pod holds: each device it requests times the node's memory per device of that
    resource (a MIG instance's or a replica's own; 0 for a node not seen yet)."""
    return sum(n * f.memory_mib for resource, n in requests for f in node_facts if f.resource == resource)


def node_classes(node_facts: list[NodeFacts], requests: Counts) -> Counts:
    """A bound Pod's devices by the class of the node's pool for each resource (a node may offer whole
    GPUs and MIG instances of several classes)."""
    if not node_facts:
        return ()  # not seen yet, or a node gpupool cannot class: counted once it is
    return tuple((f.pool.gpu_class, n) for resource, n in requests for f in node_facts if f.resource == resource)


def unbound_claim(
    pod: PodInfo, pools: Collection[Pool], policy: Policy, memory_of: MemoryOf, runnable: Runnable
) -> Claim:
    """Where an unbound Pod's devices count, per device resource (a vendor's GPUs, or a MIG profile of its
    own). The pools that matter are those its nodeSelector's pool labels reach; of those, the ones with a
    node that could ever take it (`runnable`: labels, affinity, taints, its requests within the node's
    allocatable) are where it can run. It counts in its gpupool.io/pool annotation's pool when it can run
    there; else in the one pool it can run in; else, when it can run nowhere, in the annotated pool if
    its nodeSelector does not contradict it; else, when the pools it can run in share a class, against that
    class; else nowhere until it is bound. Its devices are held in the pool (taking room from other Pods)
    only where it can run: a Pod that can never be scheduled holds no GPUs, though its namespace's quotas
    still count what it was granted. The GPU memory it holds is that of the pool it counts in."""
    if pod.queued:
        return Claim(pod.namespace)  # waiting in gpupool's queue: it holds and counts nothing until released
    pins = policy.hold_pins(pod.node_selector)
    annotated = PoolKey.parse(pod.pool) if pod.pool else None
    holds: list[tuple[PoolKey, int]] = []
    classes: list[tuple[str, int]] = []
    memory = 0
    watched: dict[PoolKey, str] = {}
    for resource, gpus in pod.gpu_requests.items():
        vendor = policy.vendor_of(resource)
        if vendor is None:
            continue
        relevant = [p for p in pools if p.resource == resource and p.reach(pins)]
        witnesses = {p.key: runnable(p, pod, pins) for p in relevant}
        watched.update(witnesses)
        can_run = [p.key for p in relevant if witnesses[p.key]]
        pool: PoolKey | None = None
        if annotated is not None and witnesses.get(annotated):
            pool = annotated
        elif len(can_run) == 1:
            pool = can_run[0]
        elif not can_run and annotated is not None and _may_hold(annotated, resource, pins, policy):
            pool = annotated
        elif can_run and len({p.gpu_class for p in can_run}) == 1:
            classes.append((can_run[0].gpu_class, gpus))
        if pool is None:
            continue
        classes.append((pool.gpu_class, gpus))
        memory += gpus * memory_of(pool)
        if pool in can_run:
            holds.append((pool, gpus))
    return Claim(
        pod.namespace,
        holds=tuple(holds),
        pins=pins,
        classes=tuple(classes),
        counted=tuple(pod.gpu_requests.items()),
        memory_mib=memory,
        group=group_member(pod),
        watched=tuple(sorted(watched.items())),
    )


def _may_hold(pool: PoolKey, resource: str, pins: Selector, policy: Policy) -> bool:
    """Whether an annotated pool can count the Pod's devices of `resource`: one this policy knows, on that
    resource, and not contradicted by the nodeSelector's class or product label."""
    vendor = policy.vendors.get(pool.vendor)
    if vendor is None or (pool.resource or vendor.resource) != resource or pool.gpu_class not in policy.classes:
        return False
    pinned = dict(pins)
    gpu_class, product = pinned.get(policy.class_label), pinned.get(vendor.product_label)
    if gpu_class is not None and gpu_class != pool.gpu_class:
        return False
    if product is None or pool.resource:  # a MIG profile of its own is pinned by its own product label
        return True
    return pool.product in (product.strip(), f"{product.strip()}{SHARED_SUFFIX}")
