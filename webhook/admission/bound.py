"""Pods that bypass placement: checked against every node they could reach.

A Pod that names its node (`spec.nodeName`) skips the scheduler, and a DaemonSet's Pod is placed by the
DaemonSet controller's node affinity (its controller owner, `controller: true`, is a DaemonSet; a
reference that is not the controller's grants nothing). gpupool pins neither to a pool, which could only
strand them, but holds them to their namespace's rules on every node they can land on:

- the nodes are the one it names, or every node its nodeSelector and any term of its required node
  affinity reach (the scheduler ORs the terms, so a term that names one node and another that asks for
  an H100 reach both); nodes a term names by `metadata.name` that gpupool does not know are reached too;
- on each node it reaches, the class of the node's pool must be allowed, the Pod's own annotations must
  hold (class, device, product, memory, driver, compute capability, CUDA), and its classQuota and
  memoryQuota must have room for the class and memory of that node;
- its ResourceQuotas must have room whatever node it lands on; a node gpupool does not know is no
  exemption: its quotas are checked as if it were of every class the namespace has a quota for, and of
  unknown memory (refused under a memoryQuota), and in a namespace limited to some classes it is refused.
"""

from __future__ import annotations

from webhook.admission import verdict
from webhook.admission.decision import bound_problem, class_quota_problem
from webhook.admission.quotas import check_quotas, memory_quota_problem
from webhook.admission.request import GpuRequest
from webhook.admission.verdict import Placement, Verdict
from webhook.domain.affinity import IN, NODE_NAME_FIELD, NodeRequirements
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.nodes import NodeFacts

MAX_NAMED = 5  # nodes a message names before it says how many more


def reachable(requirements: NodeRequirements, node_name: str, index: PoolIndex) -> tuple[list[str], list[str]]:
    """The nodes a Pod that bypasses placement could land on: those gpupool knows, by name, and those it
    names that gpupool does not know (a node without GPUs, or one not seen yet)."""
    if node_name:
        return ([node_name], []) if index.node(node_name) is not None else ([], [node_name])
    named = _names_every_term(requirements)
    if named is not None:  # the DaemonSet controller's form: look up only the nodes it names
        known = []
        for name in sorted(named):
            node = index.node(name)
            if node is not None and requirements.matches(name, node.labels):
                known.append(name)
        return known, sorted(n for n in named if index.node(n) is None)
    return sorted(n.name for n in index.gpu_nodes() if requirements.matches(n.name, n.labels)), []


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
    """The verdict for a Pod that bypasses placement, over the nodes it could reach (`reachable`). No
    patch; the placement is the node's pool when it reaches exactly one node. `nodes`: (known, unknown)."""
    known, unknown = nodes
    where = _where(known, unknown)
    if not devices:
        return verdict.allow(f"bypasses placement ({where}); requests no {req.vendor.name} GPUs")
    resource = req.resource or req.vendor.resource  # the devices the Pod requests: a node may offer several
    rule = policy.namespace(req.namespace)
    facts: list[NodeFacts] = []
    unclassed: list[str] = []  # reached, but no pool of the resource gpupool can class there
    for name in known:
        found = index.node_facts(name, resource)
        if isinstance(found, NodeFacts):
            facts.append(found)
        else:
            unclassed.append(f"{name} ({found.reason})" if found is not None else name)
    unclassed.extend(unknown)
    what = f"{req.vendor.name} GPUs" if resource == req.vendor.resource else f"{resource} devices"
    if not facts and not unclassed:
        unclassed.append("no node gpupool knows")
    for f in facts:
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
    classes = sorted({f.pool.gpu_class for f in facts} | (set(rule.class_quota) if unclassed else set()))
    for gpu_class in classes:
        over = class_quota_problem(req.namespace, gpu_class, devices, index, policy)
        if over:
            return verdict.deny(over, reason="class-quota")
    # The memory it would hold: unknown where a node is not classed (refused under a memoryQuota), else
    # the most of any node it can reach.
    largest = max(facts, key=lambda f: f.memory_mib) if facts and not unclassed else None
    mib, at = (largest.memory_mib, f"node {largest.node}") if largest is not None else (0, f"node {unclassed[0]}")
    memory = memory_quota_problem(req.namespace, devices, mib, index, policy, where=at)
    if memory:
        return verdict.deny(memory, reason="memory-quota")
    quota_problem = check_quotas(req, index, policy, resource, devices)
    if quota_problem:
        return verdict.deny(quota_problem, reason="quota")
    if len(facts) != 1 or unclassed:
        note = f"gpupool: no GPUs gpupool can class on {_listed(unclassed)}: class not checked, quotas are"
        notes = (note,) if unclassed else ()
        return verdict.allow(f"bypasses placement ({where}); checked on {len(facts)} nodes").with_warnings(notes)
    (f,) = facts
    free = index.node_free(f)
    warnings = () if free >= devices else (f"gpupool: node {f.node} has {free} free {f.resource} now",)
    placement = Placement(f.pool, f.resource, devices, devices, f.selector, free >= devices, False, f.kind, node=f.node)
    return verdict.place(placement, [], warnings=warnings, message=f"already bound to node {f.node} in pool {f.pool}")


def _where(known: list[str], unknown: list[str]) -> str:
    nodes = [*known, *unknown]
    if len(nodes) == 1:
        return f"names node {nodes[0]}"
    return f"reaches {len(nodes)} nodes" if nodes else "reaches no node gpupool knows"


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(names[:MAX_NAMED]) + more
