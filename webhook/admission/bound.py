"""Pods that bypass placement: checked against every node they could reach.

A Pod that names its node (`spec.nodeName`) skips the scheduler, and a DaemonSet's Pod is placed by the
DaemonSet controller's node affinity (its controller owner, `controller: true`, is a DaemonSet; a
reference that is not the controller's grants nothing). gpupool pins neither to a pool, which could only
strand them, but holds them to their namespace's rules on every node they can land on:

- the nodes are the one it names, or every node its nodeSelector and any term of its required node
  affinity reach (the scheduler ORs the terms, so a term that names one node and another that asks for
  an H100 reach both); nodes a term names by `metadata.name` that gpupool does not know are reached too;
- on each node it reaches, for every kind of device it requests (whole GPUs and MIG slices of a node may
  be of different classes), the class of the node's pool must be allowed, the Pod's own annotations must
  hold (class, device, product, memory, driver, compute capability, CUDA), and its classQuota and
  memoryQuota must have room for all its devices of that node's classes and memory together;
- its ResourceQuotas must have room for each resource whatever node it lands on; a node gpupool does not
  know is no exemption: its quotas are checked as if it were of every class the namespace has a quota
  for, and of unknown memory (refused under a memoryQuota), and in a namespace limited to some classes
  it is refused.
"""

from __future__ import annotations

from webhook.admission import verdict
from webhook.admission.misses import pool_misses
from webhook.admission.pieces import NO_PATCH
from webhook.admission.request import GpuRequest
from webhook.admission.verdict import Placement, Verdict
from webhook.domain.affinity import IN, NODE_NAME_FIELD, NodeRequirements
from webhook.domain.devices import KINDS
from webhook.domain.memory import memory_shortfall
from webhook.domain.policy import Policy
from webhook.domain.products import format_version, version_at_least
from webhook.pools.index import PoolIndex
from webhook.pools.nodes import NodeFacts, Unclassified
from webhook.pools.quotas.checks import Held, Holding, held_quota_problem

MAX_NAMED = 5  # nodes a message names before it says how many more


def reachable(requirements: NodeRequirements, node_name: str, index: PoolIndex) -> tuple[list[str], list[str]]:
    """The nodes a Pod that bypasses placement could land on: those gpupool knows, by name, and those it
    names that gpupool does not know (a node without GPUs, or one not seen yet)."""
    if node_name:
        return ([node_name], []) if index.capacity.node(node_name) is not None else ([], [node_name])
    named = _names_every_term(requirements)
    if named is not None:  # the DaemonSet controller's form: look up only the nodes it names
        known = []
        for name in sorted(named):
            node = index.capacity.node(name)
            if node is not None and requirements.matches(name, node.labels):
                known.append(name)
        return known, sorted(n for n in named if index.capacity.node(n) is None)
    return sorted(n.name for n in index.capacity.gpu_nodes() if requirements.matches(n.name, n.labels)), []


def single_named_node(requirements: NodeRequirements) -> str:
    """The node, when every term names it and no other (how the DaemonSet controller pins its Pods); ""
    otherwise. (A reservation and a re-invocation are matched on it.)"""
    named = _names_every_term(requirements)
    return next(iter(named)) if named is not None and len(named) == 1 else ""


def _names_every_term(requirements: NodeRequirements) -> frozenset[str] | None:
    """The node names, when every term names the nodes it takes by `metadata.name In` (so no other node
    can be reached); None otherwise."""
    if not requirements.terms:
        return None
    names: set[str] = set()
    for term in requirements.terms:
        fields = [r for r in term.fields if r.key == NODE_NAME_FIELD and r.operator == IN]
        if not fields:
            return None
        names.update(set.intersection(*(set(r.values) for r in fields)))
    return frozenset(names)


def check_bound(
    req: GpuRequest, nodes: tuple[list[str], list[str]], devices: int, policy: Policy, index: PoolIndex
) -> Verdict:
    """The verdict for a Pod that bypasses placement, over the nodes it could reach (`reachable`), for every
    kind of device it requests itself (whole GPUs and a MIG slice are held together). No patch; the
    placement is the node's pool of its first resource when it reaches exactly one node, for `devices`
    (what its reservation holds). `nodes`: (known, unknown)."""
    known, unknown = nodes
    where = _where(known, unknown)
    kinds = req.own_requests  # (resource, devices) per resource it requests, sorted
    if not kinds:
        return verdict.allow(f"bypasses placement ({where}); requests no {req.vendor.name} GPUs")
    rule = policy.namespace(req.namespace)
    on: list[tuple[str, list[tuple[int, NodeFacts]]]] = []  # the nodes every kind is classed on
    unclassed: list[str] = []  # reached, but some kind has no pool gpupool can class there
    for name in known:
        found = [(n, index.capacity.node_facts(name, resource)) for resource, n in kinds]
        missing = next((f for _, f in found if not isinstance(f, NodeFacts)), _CLASSED)
        if missing is _CLASSED:
            on.append((name, [(n, f) for n, f in found if isinstance(f, NodeFacts)]))
        else:
            unclassed.append(f"{name} ({missing.reason})" if isinstance(missing, Unclassified) else name)
    unclassed.extend(unknown)
    resources = [resource for resource, _ in kinds]
    what = f"{req.vendor.name} GPUs" if resources == [req.vendor.resource] else f"{', '.join(resources)} devices"
    if not on and not unclassed:
        unclassed.append("no node gpupool knows")
    for _, held in on:
        for _, f in held:
            problem = bound_problem(req, f)
            if problem:
                return verdict.deny(problem, reason="bound-node")
    if unclassed and rule.restricted:
        which = (
            f"names node {unclassed[0]}, which has"
            if len(known) + len(unknown) == 1
            else f"can reach {_listed(unclassed)}, which have"
        )
        return verdict.deny(
            f"the Pod {which} no {what} gpupool can class; namespace {req.namespace} may only use some GPU "
            "classes, so the Pod must leave its node to gpupool",
            reason="bound-node",
        )
    # Every quota must have room wherever it lands: on each node its devices of each class and their
    # memory; on a node gpupool cannot class, of every class with a quota and of unknown memory.
    holdings: list[Holding] = [
        (f"node {name}", [Held(f.resource, n, f.pool.gpu_class, f.memory_mib) for n, f in held]) for name, held in on
    ]
    if unclassed:
        holdings.append((f"node {unclassed[0]}", [Held(resource, n) for resource, n in kinds]))
    problem, reason = held_quota_problem(req, holdings, index, policy)
    if problem:
        return verdict.deny(problem, reason=reason)
    if len(on) != 1 or unclassed:
        note = f"gpupool: no GPUs gpupool can class on {_listed(unclassed)}: class not checked, quotas are"
        notes = (note,) if unclassed else ()
        return verdict.allow(f"bypasses placement ({where}); checked on {len(on)} nodes").with_warnings(notes)
    ((name, held),) = on
    free = [(n, f, index.capacity.node_free(f)) for n, f in held]
    warnings = tuple(f"gpupool: node {name} has {left} free {f.resource} now" for n, f, left in free if left < n)
    # The placement (and the reservation until the watch shows the Pod) is the first resource's.
    f = held[0][1]
    placement = Placement(
        pool=f.pool,
        resource=f.resource,
        gpus=devices,
        pod_total=devices,
        selector=f.selector,
        has_capacity=not warnings,
        fallback=False,
        device=f.kind,
        node=f.node,
    )
    pools = " and ".join(str(f.pool) for _, f in held)
    return verdict.place(
        placement, NO_PATCH, warnings=warnings, message=f"already bound to node {name} in pool {pools}"
    )


_CLASSED = object()  # no kind is missing on the node


def _where(known: list[str], unknown: list[str]) -> str:
    nodes = [*known, *unknown]
    if len(nodes) == 1:
        return f"names node {nodes[0]}"
    return f"reaches {len(nodes)} nodes" if nodes else "reaches no node gpupool knows"


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(names[:MAX_NAMED]) + more


def bound_problem(req: GpuRequest, facts: NodeFacts) -> str:
    """Why a Pod that names its node breaks its namespace's rules or its own annotations there ("" when
    it does not). A namespace's default class is only a default: any allowed class may be named."""
    requested = req.classes if req.class_source == "annotation" else req.allowed_classes
    # Likewise the namespace's device default: a Pod on a node may use what the node offers.
    devices = req.devices if req.device_source == "annotation" else KINDS
    reasons = [m.text for m in pool_misses(req, facts.pool, facts.kind, requested, (), devices=devices)]
    short = memory_shortfall(req.min_memory_mib, facts.sold_mib, facts.memory_mib)
    if short:
        reasons.append(short)
    for need, name, what, have_version in (
        (req.min_driver, "min-driver", "driver", facts.driver),
        (req.min_compute, "min-compute-capability", "compute capability", facts.compute),
        (req.min_cuda, "min-cuda", "CUDA", facts.cuda),
    ):
        if need is not None and (have_version is None or not version_at_least(have_version, need)):
            have = format_version(have_version) if have_version else "unknown"
            reasons.append(f"{what} {have} < {name} {format_version(need)}")
    return f"node {facts.node} is in pool {facts.pool}: {'; '.join(reasons)}" if reasons else ""
