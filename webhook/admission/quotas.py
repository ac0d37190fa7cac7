"""The namespace's quotas, checked on admission: its ResourceQuotas on GPUs, in every form they are
written in, and the policy's GPU-memory quota. (Per-class quotas are in webhook.admission.decision.)

ResourceQuotas in the `requests.<resource>` form are enforced by Kubernetes; gpupool checks them too,
against what it admitted that the quota controller has not counted yet. The forms Kubernetes stores but
never enforces for extended resources (`nvidia.com/gpu: 4`, what `kubectl create quota --hard=nvidia.com/gpu=4`
writes, and `limits.nvidia.com/gpu`) are enforced by gpupool alone, for the Pods it admits, against its
own count of the namespace's Pods (policy `defaults.enforceAllGpuQuotaForms`, on by default).
"""

from __future__ import annotations

from typing import Literal

from webhook.admission.request import GpuRequest
from webhook.domain.policy import Policy
from webhook.domain.quantity import format_mib
from webhook.pools.index import PoolIndex

QuotaUse = Literal["now", "charged", "hard"]


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
    pending = index.reserved(req.namespace, resource)
    enforced = f"requests.{resource}"
    for quota in sorted(index.quotas(req.namespace), key=lambda q: q.name):
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
                used = index.requested(req.namespace, resource) + pending
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
    hard = policy.namespace(namespace).memory_quota_mib
    if hard is None or not devices:
        return ""
    if not mib_each:
        return (
            f"GPU memory quota in namespace {namespace}: the GPU memory of {where} is unknown, so it cannot be "
            "counted (label the nodes with their GPU memory, or give the product's memory in the policy)"
        )
    mib = devices * mib_each
    used = index.memory_used(namespace)
    if used + mib <= hard:
        return ""
    return (
        f"GPU memory quota in namespace {namespace} exceeded: used {format_mib(used)} + requested "
        f"{format_mib(mib)} > hard {format_mib(hard)}"
    )
