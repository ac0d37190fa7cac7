"""The namespace's ResourceQuotas, checked on admission against what gpupool has admitted but the quota
controller has not counted yet."""

from __future__ import annotations

from webhook.admission.request import GpuRequest
from webhook.pools.index import PoolIndex


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
