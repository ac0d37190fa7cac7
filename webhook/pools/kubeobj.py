"""Projections of raw Kubernetes JSON (as the API or `kubectl get -o yaml` gives it) onto the domain.

Shared by the snapshot file and the watch cache. Only GPU resources are kept, and Pods that neither hold
GPUs nor carry a gpupool placement project to None, so the inventory never stores the bulk of a large
cluster's Pods.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

from webhook.domain.affinity import NO_REQUIREMENTS, AffinityError, NodeRequirements, read_affinity
from webhook.domain.groups import GROUP_ANNOTATION, controller_of, workload_group
from webhook.domain.model import (
    NO_TOLERATIONS,
    POOL_ANNOTATION,
    NodeInfo,
    PodInfo,
    QuotaInfo,
    Taint,
    Toleration,
    Tolerations,
    effective_gpus,
)
from webhook.domain.quantity import QuantityError, parse_bytes, parse_count, parse_milli
from webhook.mig.follow import ANNOTATIONS as RESHAPE_ANNOTATIONS
from webhook.pools.quotas.forms import forms, prefixed

_EMPTY: Mapping[str, Any] = {}


def as_map(value: Any) -> Mapping[str, Any]:
    """A JSON object field, or an empty one when it is missing, null or of another type. Decoded JSON and
    YAML objects are dicts, and `isinstance(x, dict)` is far cheaper than the Mapping ABC check on the
    admission path."""
    return value if isinstance(value, dict) else _EMPTY


def as_list(value: Any) -> list[Any]:
    """A JSON array field, or an empty one."""
    return value if isinstance(value, list) else []


def own(value: Any) -> str:
    """`str(value)` as a string of its own, not one of the decoded object's.

    What a projection keeps outlives the list page it was read from. A string of the page kept alive
    keeps the allocator's pool around it alive too, and the next pages are then decoded into memory
    strewn with them: a cold sync that kept the page's own strings of its GPU Pods and the keys of its
    Pods decoded every page 1.5x slower and freed it 1.5x slower (bench/bench_cache.py). A copy made
    while projecting lies with the other projections, away from the page.
    """
    text = str(value)
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def shared(value: Any) -> str:
    """`own(value)`, interned: for a string many objects carry the same (a namespace, a phase, a resource
    name), one copy for all of them."""
    return sys.intern(own(value))


def node_from_obj(obj: Mapping[str, Any], resources: Collection[str], prefixes: tuple[str, ...] = ()) -> NodeInfo:
    """The node, with its allocatable `resources` and any resource with one of the `prefixes` (GPU
    partitions such as nvidia.com/mig-3g.20gb)."""
    meta, spec, status = as_map(obj.get("metadata")), as_map(obj.get("spec")), as_map(obj.get("status"))
    allocatable = as_map(status.get("allocatable"))
    conditions = as_list(status.get("conditions"))
    ready = any(as_map(c).get("type") == "Ready" and as_map(c).get("status") == "True" for c in conditions)
    labels = {own(k): own(v) for k, v in as_map(meta.get("labels")).items()}
    annotations = {
        own(k): own(v)
        for k, v in as_map(meta.get("annotations")).items()
        if isinstance(k, str) and k.startswith(RESHAPE_ANNOTATIONS) and isinstance(v, str) and len(v) <= 256
    }
    return NodeInfo(
        name=own(meta.get("name", "")),
        labels=labels,
        taints=tuple(
            Taint(own(t.get("key", "")), own(t.get("value", "") or ""), own(t.get("effect", "")))
            for t in (as_map(x) for x in as_list(spec.get("taints")))
        ),
        allocatable={
            own(r): parse_count(v)
            for r, v in allocatable.items()
            if r in resources or (prefixes and isinstance(r, str) and r.startswith(prefixes))
        },
        unschedulable=bool(spec.get("unschedulable", False)),
        ready=ready,
        cpu_milli=parse_milli(allocatable["cpu"]) if "cpu" in allocatable else None,
        memory_bytes=_bytes(allocatable["memory"]) if "memory" in allocatable else None,
        annotations=annotations,
    )


def _bytes(value: Any) -> int | None:
    try:
        return parse_bytes(value)
    except QuantityError:
        return None


def container_gpus(container: Mapping[str, Any], resource: str) -> int:
    """A container's request for an extended resource; requests default to limits for those."""
    res = as_map(container.get("resources"))
    requests, limits = as_map(res.get("requests")), as_map(res.get("limits"))
    if resource in requests:
        return parse_count(requests[resource])
    return parse_count(limits[resource]) if resource in limits else 0


def pod_gpu_requests(
    spec: Mapping[str, Any], resources: Collection[str], prefixes: tuple[str, ...] = ()
) -> dict[str, int]:
    """The Pod's effective request per GPU resource: `resources`, and any resource with one of the
    `prefixes` (GPU partitions such as nvidia.com/mig-3g.20gb)."""
    containers = [as_map(c) for c in as_list(spec.get("containers"))]
    inits = [as_map(c) for c in as_list(spec.get("initContainers"))]
    result: dict[str, int] = {}
    # Only the resources some container names can add up to GPUs: the policy's others are not summed.
    named = _named_with(resources, prefixes, [*containers, *inits])
    for resource in sorted(named):
        total = effective_gpus(
            [container_gpus(c, resource) for c in containers],
            [(container_gpus(c, resource), c.get("restartPolicy") == "Always") for c in inits],
        )
        if total:
            result[resource] = total
    return result


def _named_with(resources: Collection[str], prefixes: tuple[str, ...], containers: list[Mapping[str, Any]]) -> set[str]:
    """The `resources`, and the resources with one of the `prefixes`, that a container requests or limits."""
    return {
        name
        for c in containers
        for part in ("limits", "requests")
        for name in as_map(as_map(c.get("resources")).get(part))
        if isinstance(name, str) and (name in resources or (prefixes and name.startswith(prefixes)))
    }


# Resources most containers request and no GPU is: a requests or limits map of these alone is passed over
# with one set comparison (`GpuNames.named_by`).
_STANDARD = frozenset({"cpu", "memory", "ephemeral-storage"})


class GpuNames:
    """The GPU resources and partition prefixes of a policy, as the one question asked of every Pod of a
    list: does any of its containers name one of them? (`gpu_names` makes one per policy.)"""

    __slots__ = ("_plain", "prefixes", "resources")

    def __init__(self, resources: frozenset[str], prefixes: tuple[str, ...]) -> None:
        self.resources, self.prefixes = resources, prefixes
        # The standard resources that are neither GPU resources nor GPU partitions under this policy.
        self._plain = frozenset(r for r in _STANDARD if r not in resources and not r.startswith(prefixes))

    def named_by(self, spec: Mapping[str, Any]) -> bool:
        """Whether any container or init container names a GPU resource (or a resource with one of the
        prefixes) in its requests or limits. A Pod that names none requests no GPU (`pod_gpu_requests` is
        empty), and that is most Pods of a cluster: a cold sync of 150,000 Pods asks this of every one, so
        it is written for the common shape (dicts all the way down, a map of standard resources) at the
        cost of a few dict lookups, and reads the rest only when that shape is not what it finds."""
        containers = spec.get("containers")
        if isinstance(containers, list) and self._in(containers):
            return True
        inits = spec.get("initContainers")
        return bool(inits) and isinstance(inits, list) and self._in(inits)

    def _in(self, containers: list[Any]) -> bool:
        plain = self._plain
        for container in containers:
            if not isinstance(container, dict):
                continue
            res = container.get("resources")
            if not isinstance(res, dict):
                continue
            requests, limits = res.get("requests"), res.get("limits")
            if isinstance(requests, dict) and not plain.issuperset(requests) and self._gpu(requests):
                return True
            if isinstance(limits, dict) and not plain.issuperset(limits) and self._gpu(limits):
                return True
        return False

    def pod(self, obj: Mapping[str, Any]) -> PodInfo | None:
        """`pod_from_obj` under this policy. A Pod that names no GPU resource is read no further than
        whether it carries a gpupool placement."""
        spec = as_map(obj.get("spec"))
        if self.named_by(spec):
            return _pod(obj, spec, pod_gpu_requests(spec, self.resources, self.prefixes))
        meta = obj.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        if not isinstance(annotations, dict) or POOL_ANNOTATION not in annotations:
            return None
        return _pod(obj, spec, {})

    def _gpu(self, names: dict[Any, Any]) -> bool:
        if not self.resources.isdisjoint(names):
            return True
        prefixes = self.prefixes
        return bool(prefixes) and any(isinstance(name, str) and name.startswith(prefixes) for name in names)


@lru_cache(maxsize=16)
def gpu_names(resources: frozenset[str], prefixes: tuple[str, ...] = ()) -> GpuNames:
    """The `GpuNames` of a policy's `gpu_resources` and `partition_prefixes` (one per policy, kept)."""
    return GpuNames(resources, prefixes)


def names_gpus(spec: Mapping[str, Any], resources: Collection[str], prefixes: tuple[str, ...] = ()) -> bool:
    """`GpuNames.named_by` for these resources and prefixes."""
    return gpu_names(frozenset(resources), prefixes).named_by(spec)


def pod_from_obj(
    obj: Mapping[str, Any], resources: Collection[str], prefixes: tuple[str, ...] = (), *, screen: bool = True
) -> PodInfo | None:
    """The Pod, or None when it neither requests a GPU (or GPU partition) nor carries a gpupool placement.
    Its workload group is worked out by the same rule as on admission (webhook.domain.groups).
    `screen=False` reads every Pod whole: the reference the screen (`GpuNames.named_by`) is tested against."""
    names = gpu_names(frozenset(resources), prefixes)
    if screen:
        return names.pod(obj)
    spec = as_map(obj.get("spec"))
    return _pod(obj, spec, pod_gpu_requests(spec, names.resources, prefixes))


def _pod(obj: Mapping[str, Any], spec: Mapping[str, Any], requests: dict[str, int]) -> PodInfo | None:
    meta = as_map(obj.get("metadata"))
    annotations = as_map(meta.get("annotations"))
    pool = str(annotations.get(POOL_ANNOTATION, ""))
    if not requests and not pool:
        return None
    status = as_map(obj.get("status"))
    group = workload_group(
        annotations.get(GROUP_ANNOTATION), as_map(meta.get("labels")), controller_of(meta.get("ownerReferences"))
    )
    node = own(spec.get("nodeName", "") or "")
    node_selector = {own(k): own(v) for k, v in as_map(spec.get("nodeSelector")).items()}
    # The strings many Pods share (namespace, phase, resource, pool, gates, group) are interned: one
    # string each, not one per Pod (a queue of 100,000 Pods kept some 300 bytes a Pod of such copies).
    pod = PodInfo(
        namespace=shared(meta.get("namespace", "")),
        name=own(meta.get("name", "")),
        generate_name=own(meta.get("generateName", "") or ""),
        node=node,
        phase=shared(status.get("phase", "Pending") or "Pending"),
        gpu_requests={shared(r): n for r, n in requests.items()},
        pool=shared(pool),
        node_selector=node_selector,
        group=shared(group) if group else "",
        gates=_gate_names(spec) if "schedulingGates" in spec else (),
        deleting=bool(meta.get("deletionTimestamp")),
    )
    return pod if node else _with_needs(pod, spec, node_selector)


class _Shared:
    """One object for the many unbound Pods that need the same of a node: a queue of 100,000 Pods of a few
    workloads kept an indexed `Tolerations` (four empty tables even for none) and `NodeRequirements` per
    Pod, 1.1 of the 3.6 KiB each kept (docs/queue.md, "What the queue keeps of a Pod"). Only small ones
    are kept for sharing (at most `SMALL` tolerations; a nodeSelector of at most `SMALL` entries and no
    node-affinity terms, whose long lists are shared by webhook.domain.affinity already), at most `LIMIT`
    of each: what the table outlives its Pods by stays a few MB. Past that, Pods keep their own."""

    LIMIT, SMALL = 4096, 8

    def __init__(self) -> None:
        self._tolerations: dict[tuple[Toleration, ...], Tolerations] = {(): NO_TOLERATIONS}
        self._requirements: dict[NodeRequirements, NodeRequirements] = {NO_REQUIREMENTS: NO_REQUIREMENTS}

    def tolerations(self, items: tuple[Toleration, ...]) -> Tolerations:
        found = self._tolerations.get(items) if len(items) <= self.SMALL else None
        if found is None:
            found = Tolerations(items)
            if len(items) <= self.SMALL and len(self._tolerations) < self.LIMIT:
                self._tolerations[items] = found
        return found

    def requirements(self, needs: NodeRequirements) -> NodeRequirements:
        if needs.terms is not None or len(needs.selector) > self.SMALL:
            return needs
        found = self._requirements.get(needs)
        if found is None:
            found = needs
            if len(self._requirements) < self.LIMIT:
                self._requirements[needs] = needs
        return found


_SHARED = _Shared()


def _gate_names(spec: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(shared(as_map(g).get("name", "")) for g in as_list(spec.get("schedulingGates")))


def _with_needs(pod: PodInfo, spec: Mapping[str, Any], node_selector: dict[str, str]) -> PodInfo:
    """An unbound Pod with what it needs of a node (`could_run`): only such Pods are asked, and few Pods
    wait for a node at any one time, so bound Pods never pay for reading it."""
    try:
        terms = read_affinity(spec).required
    except AffinityError:
        terms = None  # kube-apiserver stores only valid Pods; anything else asks nothing rather than too much
    containers = [as_map(c) for c in as_list(spec.get("containers"))]
    inits = [as_map(c) for c in as_list(spec.get("initContainers"))]
    tolerations = tuple(
        Toleration(
            own(t.get("key") or ""),
            own(t.get("operator") or "Equal"),
            own(t.get("value") or ""),
            own(t.get("effect") or ""),
        )
        for t in (as_map(x) for x in as_list(spec.get("tolerations")))
    )
    return replace(
        pod,
        requirements=_SHARED.requirements(NodeRequirements(tuple(sorted(node_selector.items())), terms)),
        tolerations=_SHARED.tolerations(tolerations),
        cpu_milli=_effective(containers, inits, "cpu", lambda v: parse_milli(v) or 0),
        memory_bytes=_effective(containers, inits, "memory", lambda v: _bytes(v) or 0),
    )


def _effective(
    containers: list[Mapping[str, Any]], inits: list[Mapping[str, Any]], resource: str, parse: Callable[[Any], int]
) -> int:
    """A Pod's effective request of cpu or memory, as the scheduler sums it (sidecars included)."""

    def request(c: Mapping[str, Any]) -> int:
        value = as_map(as_map(c.get("resources")).get("requests")).get(resource)
        return parse(value) if value is not None else 0

    return effective_gpus(
        [request(c) for c in containers], [(request(c), c.get("restartPolicy") == "Always") for c in inits]
    )


def quota_from_obj(
    obj: Mapping[str, Any], resources: Collection[str], prefixes: tuple[str, ...] = ()
) -> QuotaInfo | None:
    """The quota's GPU entries (`requests.<resource>`, and the unenforced bare `<resource>` so it can be
    flagged), GPU partitions with one of the `prefixes` included; None when it limits no GPU resource."""
    meta, spec, status = as_map(obj.get("metadata")), as_map(obj.get("spec")), as_map(obj.get("status"))
    keys = {key for r in resources for key in forms(r)}
    partitions = prefixed(prefixes)

    def gpu(key: object) -> bool:
        return key in keys or bool(partitions and isinstance(key, str) and key.startswith(partitions))

    hard = {k: parse_count(v) for k, v in as_map(spec.get("hard") or status.get("hard")).items() if gpu(k)}
    if not hard:
        return None
    used = {k: parse_count(v) for k, v in as_map(status.get("used")).items() if gpu(k)}
    scoped = bool(as_list(spec.get("scopes")) or as_map(spec.get("scopeSelector")))
    return QuotaInfo(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        hard=hard,
        used=used,
        scoped=scoped,
    )
