"""Every check of a namespace's quotas: its ResourceQuotas on device resources, in every form they are
written in (webhook.pools.quotas.forms), and the policy's per-class and GPU-memory quotas, each against
what the ledger counts (webhook.pools.ledger, read through `index.usage`).

Each check answers the words of a denial, "" when there is room. What the Pod's devices are held
against depends on who asks:

- **now** (admission): what the namespace uses now, admissions the watch has not shown yet included
  (`resource_quota_problem`, `pool_quota_problem`, `class_quota_problem`, `memory_quota_problem`);
- **charged** (the queue's release): the same, except that the `requests.` form is not checked again,
  since Kubernetes charged the Pod to it when it was created, gated or not (`charged_quota_problem`);
- **hard** (a Pod queued at admission, which holds nothing until it is released): the hard limits alone
  (`hard_limit_problem`).

A Pod that gpupool places holds one kind of device, in one pool. A Pod it does not place, because it
names its node or requests several kinds of device itself, holds what it requests: `held_quota_problem`
holds every kind to every quota at once, so 4 GPUs and a MIG slice are counted together, as the scheduler
will run them. `quota_keys` names the quotas a release would take from, for the queue's rule that a later
Pod does not take what an earlier one waits for.

ResourceQuotas in the `requests.<resource>` form are enforced by Kubernetes; gpupool checks them too,
against what it admitted that the quota controller has not counted yet. The other forms are enforced by
gpupool alone (policy `defaults.enforceAllGpuQuotaForms`, on by default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple, Protocol

from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.domain.quantity import format_mib
from webhook.pools.index import PoolIndex
from webhook.pools.quotas.forms import counted_by_gpupool, forms

QuotaReason = Literal["", "quota", "class-quota", "memory-quota"]  # which kind of quota a problem is of
QuotaKey = tuple[str, ...]  # ("class", ns, class) | ("memory", ns) | ("quota", ns, resource)
_Basis = Literal["now", "charged", "hard"]


class Ask(Protocol):
    """What a check reads of a Pod's request (webhook.admission.request.GpuRequest is one)."""

    @property
    def namespace(self) -> str: ...

    @property
    def pod_total(self) -> int: ...


class Held(NamedTuple):
    """Devices of one resource a Pod holds, and what is known of them where it runs."""

    resource: str
    devices: int
    gpu_class: str = ""  # the class of the node's pool for the resource; "" when not known
    memory_mib: int = 0  # per device; 0 when unknown


Holding = tuple[str, Sequence[Held]]  # where the Pod may run (for messages: "node x") and what it holds there


def has_pool_quotas(namespace: str, policy: Policy) -> bool:
    """Does the namespace have a per-class or GPU-memory quota (what `pool_quota_problem` checks)?"""
    rule = policy.namespace(namespace)
    return bool(rule.class_quota) or rule.memory_quota_mib is not None


def pool_quota_problem(req: Ask, pool: PoolKey, index: PoolIndex, policy: Policy) -> tuple[str, QuotaReason]:
    """Why placing the request in `pool` would exceed the namespace's per-class or GPU-memory quota now,
    and which one; ("", "") when it would not."""
    note = class_quota_problem(req.namespace, pool.gpu_class, req.pod_total, index, policy)
    if note:
        return note, "class-quota"
    note = memory_quota_problem(
        req.namespace, req.pod_total, index.capacity.pool_memory_mib(pool), index, policy, where=str(pool)
    )
    return (note, "memory-quota") if note else ("", "")


def held_quota_problem(
    req: Ask, holdings: Sequence[Holding], index: PoolIndex, policy: Policy
) -> tuple[str, QuotaReason]:
    """Why a Pod that holds devices of several resources would exceed one of the namespace's quotas, and
    which kind of quota; ("", "") when none. `holdings`: each place it may run (every node it can reach;
    at least one) and what it holds there; every quota must have room wherever it lands. On each, a
    class counts the Pod's devices of every resource of that class, and a device of unknown class counts
    against every class the namespace has a quota for; GPU memory counts all its devices (unknown memory
    is refused under a memoryQuota); and every ResourceQuota is checked for its own resource."""
    quota_classes = tuple(policy.namespace(req.namespace).class_quota)
    worst: Counter[str] = Counter()
    for _, held in holdings:
        here: Counter[str] = Counter()
        for h in held:
            for gpu_class in (h.gpu_class,) if h.gpu_class else quota_classes:
                here[gpu_class] += h.devices
        for gpu_class, count in here.items():
            worst[gpu_class] = max(worst[gpu_class], count)
    for gpu_class, count in sorted(worst.items()):
        over = class_quota_problem(req.namespace, gpu_class, count, index, policy)
        if over:
            return over, "class-quota"
    # Where its memory is unknown if anywhere (refused under a memoryQuota), else where it holds the most.
    unknown = next(((w, held) for w, held in holdings if any(h.devices and not h.memory_mib for h in held)), None)
    where, held = unknown or max(holdings, key=lambda o: sum(h.devices * h.memory_mib for h in o[1]))
    memory = memory_total_problem(req.namespace, [(h.devices, h.memory_mib) for h in held], index, policy, where=where)
    if memory:
        return memory, "memory-quota"
    per_resource: Counter[str] = Counter()
    for _, held in holdings:
        for h in held:
            per_resource[h.resource] = max(per_resource[h.resource], h.devices)
    for resource, count in sorted(per_resource.items()):
        quota = resource_quota_problem(req, index, policy, resource, count)
        if quota:
            return quota, "quota"
    return "", ""


def class_quota_problem(namespace: str, gpu_class: str, count: int, index: PoolIndex, policy: Policy) -> str:
    """Why `count` more GPUs of `gpu_class` would exceed the namespace's per-class quota; "" if not."""
    limit = policy.namespace(namespace).class_quota.get(gpu_class)
    used = index.usage.class_used(namespace, gpu_class)
    if limit is None or used + count <= limit:
        return ""
    return f"class quota {gpu_class} in namespace {namespace} exceeded: used {used} + requested {count} > hard {limit}"


def resource_quota_problem(req: Ask, index: PoolIndex, policy: Policy, resource: str, count: int | None = None) -> str:
    """The namespace's ResourceQuotas on `resource` for `count` devices (default: the request's), against
    what is used now: a denial message, or "". Whether the forms Kubernetes ignores are enforced is the
    policy's call."""
    return _resource_quotas(req, index, policy, resource, req.pod_total if count is None else count, basis="now")


def charged_quota_problem(req: Ask, index: PoolIndex, policy: Policy, resource: str) -> str:
    """`resource_quota_problem` for a Pod Kubernetes has counted already in the `requests.` form since it
    was created (the queue's release): that form is not checked again."""
    return _resource_quotas(req, index, policy, resource, req.pod_total, basis="charged")


def _resource_quotas(req: Ask, index: PoolIndex, policy: Policy, resource: str, count: int, *, basis: _Basis) -> str:
    quotas = index.quotas.of(req.namespace)
    if not quotas:  # most namespaces: nothing more to read
        return ""
    enforce_all = policy.defaults.enforce_all_gpu_quota_forms
    pending = index.usage.reserved(req.namespace, resource)
    keys = forms(resource)
    enforced = keys[0]
    for quota in sorted(quotas, key=lambda q: q.name):
        if quota.scoped:
            continue
        for key in keys:
            if key not in quota.hard:
                continue
            hard = quota.hard[key]
            if key != enforced and not enforce_all:
                continue
            if basis == "hard":
                used = 0
            elif key == enforced:
                if basis == "charged":
                    continue
                used = quota.used.get(key, 0) + pending
            else:
                used = index.usage.requested(req.namespace, resource) + pending
            if used + count > hard:
                problem = (
                    f"exceeded quota {quota.name} in namespace {req.namespace}: {key} used {used} + requested "
                    f"{count} > hard {hard}"
                )
                if key != enforced:
                    problem += (
                        f"; Kubernetes does not enforce '{key}' for extended resources, gpupool does; write "
                        f"'{enforced}: {hard}' to have Kubernetes enforce it"
                    )
                return problem
    return ""


def memory_quota_problem(
    namespace: str, devices: int, mib_each: int, index: PoolIndex, policy: Policy, *, where: str
) -> str:
    """Why `devices` more devices of `mib_each` MiB of GPU memory (in `where`: a pool, or a node) would
    exceed the namespace's memoryQuota; "" if they would not (or it has none). Used counts the
    namespace's Pods and the admissions the watch has not shown yet. Devices whose memory is unknown
    cannot be counted, so under a memoryQuota they are refused, as min-memory refuses them."""
    return memory_total_problem(namespace, [(devices, mib_each)], index, policy, where=where)


def memory_total_problem(
    namespace: str, parts: Iterable[tuple[int, int]], index: PoolIndex, policy: Policy, *, where: str
) -> str:
    """`memory_quota_problem` for devices of several kinds at once: `parts` are (devices, MiB each)."""
    hard = policy.namespace(namespace).memory_quota_mib
    parts = [(devices, mib_each) for devices, mib_each in parts if devices]
    if hard is None or not parts:
        return ""
    if not all(mib_each for _, mib_each in parts):
        return (
            f"GPU memory quota in namespace {namespace}: the GPU memory of {where} is unknown, so it cannot be "
            "counted (label the nodes with their GPU memory, or give the product's memory in the policy)"
        )
    mib = sum(devices * mib_each for devices, mib_each in parts)
    used = index.usage.memory_used(namespace)
    if used + mib <= hard:
        return ""
    return (
        f"GPU memory quota in namespace {namespace} exceeded: used {format_mib(used)} + requested "
        f"{format_mib(mib)} > hard {format_mib(hard)}"
    )


def hard_limit_problem(
    req: Ask, pool: PoolKey, index: PoolIndex, policy: Policy, *, resource: str, memory_mib: int
) -> tuple[str, QuotaReason]:
    """Why the request alone is over a hard limit of the namespace's quotas in `pool` (of `resource`,
    `memory_mib` per device; "" when it is not): the class quota, the GPU-memory quota, or a ResourceQuota
    in any form gpupool checks. What a queued Pod is held to, since it holds nothing until it is released."""
    rule = policy.namespace(req.namespace)
    limit = rule.class_quota.get(pool.gpu_class)
    if limit is not None and req.pod_total > limit:
        return (
            f"class quota {pool.gpu_class} in namespace {req.namespace}: requested {req.pod_total} > hard {limit}",
            "class-quota",
        )
    if rule.memory_quota_mib is not None:
        if not memory_mib:
            return (f"GPU memory quota in namespace {req.namespace}: the GPU memory of {pool} is unknown",
                    "memory-quota")  # fmt: skip
        mib = req.pod_total * memory_mib
        if mib > rule.memory_quota_mib:
            return (
                f"GPU memory quota in namespace {req.namespace}: requested {format_mib(mib)} > hard "
                f"{format_mib(rule.memory_quota_mib)}",
                "memory-quota",
            )
    problem = _resource_quotas(req, index, policy, resource, req.pod_total, basis="hard")
    return (problem, "quota") if problem else ("", "")


def quota_keys(namespace: str, pools: Iterable[PoolKey], index: PoolIndex, policy: Policy) -> set[QuotaKey]:
    """The quotas of the namespace a release to one of `pools` would take from: its class quotas of their
    classes, its GPU-memory quota, and the ResourceQuotas on their resources in the forms gpupool counts
    itself (the `requests.` form charged the Pod at creation)."""
    rule = policy.namespace(namespace)
    pools = list(pools)
    keys: set[QuotaKey] = {("class", namespace, p.gpu_class) for p in pools if p.gpu_class in rule.class_quota}
    if rule.memory_quota_mib is not None:
        keys.add(("memory", namespace))
    limited = {k for q in index.quotas.of(namespace) for k in q.hard}
    for p in pools:
        resource = p.resource or policy.vendors[p.vendor].resource
        if set(counted_by_gpupool(resource)) & limited:
            keys.add(("quota", namespace, resource))
    return keys
