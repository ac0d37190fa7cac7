"""The namespace's quotas, checked on admission: its ResourceQuotas on GPUs, in every form they are
written in, and the policy's per-class and GPU-memory quotas.

A Pod that gpupool places holds one kind of device, in one pool (webhook.admission.decision checks the
pools' classes and memory). A Pod it does not place, because it names its node or requests several kinds
of device itself, holds what it requests: `held_quota_problem` holds every kind to every quota at once,
so 4 GPUs and a MIG slice are counted together, as the scheduler will run them.

ResourceQuotas in the `requests.<resource>` form are enforced by Kubernetes; gpupool checks them too,
against what it admitted that the quota controller has not counted yet. The forms Kubernetes stores but
never enforces for extended resources (`nvidia.com/gpu: 4`, what `kubectl create quota --hard=nvidia.com/gpu=4`
writes, and `limits.nvidia.com/gpu`) are enforced by gpupool alone, for the Pods it admits, against its
own count of the namespace's Pods (policy `defaults.enforceAllGpuQuotaForms`, on by default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

from webhook.admission.request import GpuRequest
from webhook.admission.verdict import Reason
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.domain.quantity import format_mib
from webhook.pools.index import PoolIndex

QuotaUse = Literal["now", "charged", "hard"]


class Held(NamedTuple):
    """Devices of one resource a Pod holds, and what is known of them where it runs."""

    resource: str
    devices: int
    gpu_class: str = ""  # the class of the node's pool for the resource; "" when not known
    memory_mib: int = 0  # per device; 0 when unknown


Holding = tuple[str, Sequence[Held]]  # where the Pod may run (for messages: "node x") and what it holds there


def held_quota_problem(
    req: GpuRequest, holdings: Sequence[Holding], index: PoolIndex, policy: Policy
) -> tuple[str, Reason]:
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
        quota = check_quotas(req, index, policy, resource, count)
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


def check_quotas(
    req: GpuRequest, index: PoolIndex, policy: Policy, resource: str, count: int | None = None, *, use: QuotaUse = "now"
) -> str:
    """The namespace's ResourceQuotas on `resource` for `count` devices (default: the request's GPUs): a
    denial message, or "". Whether the forms Kubernetes ignores are enforced is the policy's call.

    `use` says what the Pod's devices are held against: "now", what is used (an admission); "charged",
    what is used, for a Pod Kubernetes has counted already in the `requests.` form since it was created
    (the queue's release: that form is not checked again); "hard", the hard limits alone (a Pod queued at
    admission, which holds nothing until released)."""
    count = req.pod_total if count is None else count
    enforce_all = policy.defaults.enforce_all_gpu_quota_forms
    pending = index.usage.reserved(req.namespace, resource)
    enforced = f"requests.{resource}"
    for quota in sorted(index.quotas.of(req.namespace), key=lambda q: q.name):
        if quota.scoped:
            continue
        for key in (enforced, resource, f"limits.{resource}"):
            if key not in quota.hard:
                continue
            hard = quota.hard[key]
            if key != enforced and not enforce_all:
                continue
            if use == "hard":
                used = 0
            elif key == enforced:
                if use == "charged":
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
    req: GpuRequest, pool: PoolKey, index: PoolIndex, policy: Policy, *, resource: str, memory_mib: int
) -> tuple[str, Reason]:
    """Why the request alone is over a hard limit of the namespace's quotas in `pool` (of `resource`,
    `memory_mib` per device; "" when it is not): the class quota, the GPU-memory quota, or a ResourceQuota
    in any form gpupool checks. What a queued Pod is held to (webhook.admission.queueing), since it holds
    nothing until it is released."""
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
    problem = check_quotas(req, index, policy, resource, use="hard")
    return (problem, "quota") if problem else ("", "")
