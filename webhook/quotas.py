"""ResourceQuotas as gpupool reads them: the check on admission, and the warnings for the admin."""

from __future__ import annotations

from webhook.annotations import GpuRequest
from webhook.model import QuotaInfo
from webhook.policy import Policy
from webhook.pool_index import PoolIndex


def check_quotas(req: GpuRequest, index: PoolIndex, resource: str, count: int | None = None) -> str:
    """The namespace's ResourceQuotas on `requests.<resource>` (the only form Kubernetes enforces for
    extended resources) for `count` devices (default: the request's GPUs): a denial message, or "".
    Used counts what gpupool admitted that the quota controller has not counted yet."""
    key = f"requests.{resource}"
    count = req.pod_total if count is None else count
    pending = index.reserved(req.namespace, resource)
    for quota in sorted(index.quotas(req.namespace), key=lambda q: q.name):
        if quota.scoped or key not in quota.hard:
            continue
        used = quota.used.get(key, 0) + pending
        if used + count > quota.hard[key]:
            return (
                f"exceeded quota {quota.name} in namespace {req.namespace}: {key} used {used} + "
                f"requested {count} > hard {quota.hard[key]}"
            )
    return ""


def unenforced(quota: QuotaInfo, policy: Policy) -> list[str]:
    """GPU entries written as `nvidia.com/gpu: 4`, which Kubernetes stores but never enforces."""
    return [
        f"quota {quota.namespace}/{quota.name}: '{r}: {quota.hard[r]}' is not enforced by Kubernetes for "
        f"extended resources; write 'requests.{r}: {quota.hard[r]}'"
        for r in sorted(policy.gpu_resources)
        if r in quota.hard and f"requests.{r}" not in quota.hard
    ]


def quota_warnings(index: PoolIndex, policy: Policy) -> list[str]:
    """Quotas on GPU resources that do not do what their author meant."""
    warnings = []
    for q in sorted(index.all_quotas(), key=lambda q: (q.namespace, q.name)):
        warnings.extend(unenforced(q, policy))
        if q.scoped:
            warnings.append(f"quota {q.namespace}/{q.name}: has scopes; gpupool does not check it (Kubernetes does)")
    return warnings
