"""Every quota gpupool checks, as the admin sees it (`gpupool quota`, the quota metrics), and the
ResourceQuotas that do not do what their author meant (warnings). The checks themselves are
webhook.pools.quotas.checks.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from webhook.domain.exactness import exact_in
from webhook.domain.model import QuotaInfo
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.quotas.forms import counted_by_gpupool, enforced, forms, is_enforced, resource_of

KUBERNETES_AND_GPUPOOL = "Kubernetes and gpupool"
GPUPOOL_ONLY = "gpupool only"
NOBODY = "nobody"
CLASS_QUOTA, MEMORY_QUOTA = "classQuota", "memoryQuota"
GPU_MEMORY = "gpu-memory"


class QuotaRow(NamedTuple):
    """One limit of one quota: what is used of it, what is pending, and what is allowed."""

    namespace: str
    quota: str  # the ResourceQuota's name, or classQuota / memoryQuota (the policy's)
    resource: str  # the ResourceQuota's key (requests.nvidia.com/gpu, nvidia.com/gpu...), the class, or gpu-memory
    used: int  # GPUs, or MiB of GPU memory
    pending: int  # of which not yet counted by Kubernetes: admissions the watch has not shown yet
    hard: int
    unit: Literal["gpus", "MiB"]
    enforced_by: str  # Kubernetes and gpupool, gpupool only, or nobody
    # False for a quota only gpupool enforces in a namespace that places `now` while several processes admit:
    # each checks it alone, so a burst can exceed it (webhook.domain.exactness)
    exact: bool = True


def quota_rows(
    index: PoolIndex, policy: Policy, namespace: str | None = None, *, admitters: int | None = None
) -> list[QuotaRow]:
    """Every quota gpupool checks (of one namespace, or all), sorted by namespace, quota and resource;
    `exact` says whether it holds under a burst with `admitters` processes (replicas x workers; None: several).

    `used` is what counts against `hard` before `pending`: a ResourceQuota's status.used for the form
    Kubernetes enforces, gpupool's own count of the namespace's Pods for the forms it does not; the GPUs
    or memory the namespace holds for the policy's quotas. A Pod is admitted when used + pending +
    requested ≤ hard. Quotas with scopes are left out: gpupool does not check them."""
    rows: list[QuotaRow] = []
    quotas = index.quotas.of(namespace) if namespace is not None else index.quotas.all()
    enforce_all = policy.defaults.enforce_all_gpu_quota_forms
    for q in quotas:
        if q.scoped:
            continue
        for r in gpu_resources_of(q, policy):
            pending = index.usage.reserved(q.namespace, r)
            for key in forms(r):
                if key not in q.hard:
                    continue
                if is_enforced(key):
                    used, who = q.used.get(key, 0), KUBERNETES_AND_GPUPOOL
                else:
                    used, who = index.usage.requested(q.namespace, r), GPUPOOL_ONLY if enforce_all else NOBODY
                rows.append(QuotaRow(q.namespace, q.name, key, used, pending, q.hard[key], "gpus", who))
    for ns, rule in policy.namespaces.items():
        if namespace is not None and ns != namespace:
            continue
        for gpu_class, hard in rule.class_quota.items():
            pending = index.usage.class_pending(ns, gpu_class)
            used = index.usage.class_used(ns, gpu_class) - pending
            rows.append(QuotaRow(ns, CLASS_QUOTA, gpu_class, used, pending, hard, "gpus", GPUPOOL_ONLY))
        if rule.memory_quota_mib is not None:
            pending = index.usage.memory_pending(ns)
            used = index.usage.memory_used(ns) - pending
            rows.append(
                QuotaRow(ns, MEMORY_QUOTA, GPU_MEMORY, used, pending, rule.memory_quota_mib, "MiB", GPUPOOL_ONLY)
            )
    rows = [
        r._replace(exact=exact_in(policy, r.namespace, admitters)) if r.enforced_by == GPUPOOL_ONLY else r for r in rows
    ]
    return sorted(rows, key=lambda row: (row.namespace, row.quota, row.resource))


def gpu_resources_of(quota: QuotaInfo, policy: Policy) -> list[str]:
    """The GPU resources (MIG instances included) a quota's hard names, in any form, sorted."""
    named = {resource_of(key) for key in quota.hard}
    return sorted(r for r in named if policy.vendor_of(r) is not None)


def unenforced(quota: QuotaInfo, policy: Policy) -> list[str]:
    """GPU entries (MIG instances included) written as `nvidia.com/gpu: 4` or `limits.nvidia.com/gpu: 4`,
    which Kubernetes stores but never enforces for extended resources: enforced by gpupool only (or by
    nobody, when the policy turns that off)."""
    who = (
        "enforced by gpupool only, for the Pods it admits"
        if policy.defaults.enforce_all_gpu_quota_forms
        else "not enforced at all (policy defaults.enforceAllGpuQuotaForms is false)"
    )
    return [
        f"quota {quota.namespace}/{quota.name}: '{key}: {quota.hard[key]}' is not enforced by Kubernetes for "
        f"extended resources; {who}; write '{enforced(r)}: {quota.hard[key]}'"
        for r in gpu_resources_of(quota, policy)
        if enforced(r) not in quota.hard
        for key in counted_by_gpupool(r)
        if key in quota.hard
    ]


def quota_warnings(index: PoolIndex, policy: Policy, namespace: str | None = None) -> list[str]:
    """Quotas on GPU resources (of one namespace, or all) that do not do what their author meant."""
    warnings = []
    quotas = index.quotas.of(namespace) if namespace is not None else index.quotas.all()
    for q in sorted(quotas, key=lambda q: (q.namespace, q.name)):
        warnings.extend(unenforced(q, policy))
        if q.scoped:
            warnings.append(f"quota {q.namespace}/{q.name}: has scopes; gpupool does not check it (Kubernetes does)")
    return warnings
