"""Whether a MIG re-cut could serve a Pod no current layout can (docs/mig.md, "Admission"): the layouts
gpupool may choose (the policy's `migReshaping`, mig-parted's config as the index last saw it), on the MIG
nodes the Pod's constraints allow, of a class it may use. Admission queues such a Pod in a namespace that
queues, with the device resource the re-cut will offer (webhook.admission.queued), and otherwise says in
its denial that the layout exists.

The planner's view of a Pod (`waiting_of`) and of a MIG node (`candidate_of`) are made here, once, for
admission and for the queue's leader (webhook.queue.reshape). The cost is one pass over the MIG nodes,
whose layouts' yields are remembered per kind of node (webhook.mig.layouts): nothing grows with Pods.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from webhook.admission.request import GpuRequest
from webhook.domain.devices import partition_product
from webhook.domain.model import NodeInfo, PoolKey
from webhook.domain.policy import Policy
from webhook.domain.products import matches, tokens
from webhook.mig.follow import stuck_hold
from webhook.mig.hint import Recut, recut_could_serve
from webhook.mig.layouts import Layouts, gpu_count
from webhook.mig.planner import CONFIG_LABEL, RESHAPE_LABEL, STATE_LABEL, Candidate, Waiting
from webhook.pools.index import PoolIndex

MIG_CAPABLE = "nvidia.com/mig.capable"
PRODUCT_LABEL = "nvidia.com/gpu.product"
STRATEGY_LABEL = "nvidia.com/mig.strategy"


def is_mig(node: NodeInfo) -> bool:
    """A node mig-manager may re-cut: MIG-capable, or cut by a named layout already."""
    return node.labels.get(MIG_CAPABLE) == "true" or CONFIG_LABEL in node.labels


def profile_of(req: GpuRequest) -> str:
    """The MIG profile the Pod's own device resource fixes (`nvidia.com/mig-3g.40gb`: 3g.40gb), "" for none."""
    prefix = req.vendor.partition_prefix_of(req.resource) if req.resource else ""
    return req.resource[len(prefix) :] if prefix else ""


def waiting_of(pod: str, req: GpuRequest, nodes: Iterable[NodeInfo]) -> Waiting:
    """The planner's view of a Pod: its memory, count, profile if fixed, and the MIG nodes its constraints allow."""
    allowed = frozenset(
        n.name
        for n in nodes
        if req.requirements.matches(n.name, n.labels)
        and (not req.products or any(matches(q, tokens(n.labels.get(PRODUCT_LABEL, ""))) for q in req.products))
    )
    return Waiting(pod, req.min_memory_mib, max(req.pod_total, 1), None, allowed, profile_of(req))


def candidate_of(node: NodeInfo, layouts: Layouts) -> Candidate:
    """A MIG node as its labels show it (the leader adds what it knows of its Pods and its changes)."""
    return Candidate(
        name=node.name,
        product=node.labels.get(PRODUCT_LABEL, ""),
        gpus=gpu_count(node.labels, layouts.config, layouts.catalog),
        opted_in=node.labels.get(RESHAPE_LABEL, "") == "true",
        layout=node.labels.get(CONFIG_LABEL, ""),
        state=node.labels.get(STATE_LABEL, ""),
        busy=False,
        held=stuck_hold(node.annotations, node.labels, node.allocatable, layouts),
    )


def recut_for(req: GpuRequest, index: PoolIndex, policy: Policy, *, opted_in: bool = True) -> Recut | None:
    """The re-cut that could serve the Pod (webhook.mig.hint), on an opted-in node, or with `opted_in`
    False on any MIG node; None when the policy has no `migReshaping`, the index has no valid mig-parted
    config, the Pod takes no MIG instance, or is one of a gang (a gang is not planned for)."""
    layouts = index.mig.layouts
    if policy.mig_reshaping is None or layouts is None or "mig" not in req.devices or req.group.size:
        return None
    nodes = [n for n in index.capacity.gpu_nodes() if is_mig(n)]
    if not nodes:
        return None
    pod = waiting_of("", req, nodes)
    by_name = {n.name: n for n in nodes}
    classes = req.classes or req.allowed_classes

    def accepts(c: Candidate, profile: str) -> bool:
        return not classes or _class_of(by_name[c.name], profile, req, policy) in classes

    # A node a Pod uses now is named after an idle one: the leader re-cuts only idle nodes.
    candidates = (
        replace(candidate_of(n, layouts), busy=any((index.usage.used_on(n.name) or {}).values())) for n in nodes
    )
    return recut_could_serve(pod, candidates, layouts, opted_in=opted_in, accepts=accepts)


def _class_of(node: NodeInfo, profile: str, req: GpuRequest, policy: Policy) -> str:
    """The class the node's instances of `profile` would be in: its class label, else the policy's product
    table for the instance's product (as webhook.pools.nodes classes a device)."""
    label = node.labels.get(policy.class_label, "")
    if label:
        return label
    product = partition_product(node.labels.get(PRODUCT_LABEL, ""), profile)
    return policy.product_class(tokens(product, req.vendor.product_prefixes))


def recut_pool(req: GpuRequest, recut: Recut, index: PoolIndex, policy: Policy) -> tuple[PoolKey, str]:
    """The pool the re-cut node's instances will be in, and the device resource it will offer the Pod:
    `<prefix><profile>` under GFD's mixed MIG strategy (`nvidia.com/mig-3g.40gb`), the vendor's own under
    the single one (`nvidia.com/gpu`)."""
    node = index.capacity.node(recut.node)
    labels = node.labels if node is not None else {}
    single = labels.get(STRATEGY_LABEL) == "single"
    prefixes: Collection[str] = req.vendor.partition_prefixes
    partition = not single and bool(prefixes)
    resource = f"{next(iter(prefixes))}{recut.profile}" if partition else req.vendor.resource
    product = partition_product(labels.get(PRODUCT_LABEL, ""), recut.profile)
    gpu_class = _class_of(node, recut.profile, req, policy) if node is not None else ""
    return PoolKey(req.vendor.name, gpu_class, product, resource if partition else ""), resource


def recut_note(req: GpuRequest, index: PoolIndex, policy: Policy) -> str:
    """For a denial: the re-cut that would serve the Pod and what it takes for gpupool to make it ("" when
    no layout gpupool may choose would): a namespace that queues, a node opted in."""
    recut = recut_for(req, index, policy, opted_in=False)
    if recut is None:
        return ""
    needs = []
    if not recut.opted_in:
        needs.append(f"the node labelled {RESHAPE_LABEL}=true")
    if policy.placement(req.namespace) != "queue":
        needs.append(f"namespace {req.namespace} queueing its Pods (placement: queue)")
    if not needs:  # it would be queued for it (webhook.admission.queued), unless a hard limit stops it there
        return ""
    return f"A MIG re-cut would serve it: {recut_words(recut)}, which gpupool makes only with " + " and ".join(needs)


def recut_words(recut: Recut) -> str:
    """The re-cut in a message: `node gpu-7 re-cut to all-3g.40gb (a 3g.40gb)`."""
    return f"node {recut.node} re-cut to {recut.layout} (a {recut.profile})"
