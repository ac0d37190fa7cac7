"""ResourceQuotas that do not do what their author meant: the warnings for the admin (the check on
admission is webhook.admission.quotas)."""

from __future__ import annotations

from webhook.domain.model import QuotaInfo
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex


def unenforced(quota: QuotaInfo, policy: Policy) -> list[str]:
    """GPU entries (MIG instances included) written as `nvidia.com/gpu: 4`, which Kubernetes stores but
    never enforces."""
    return [
        f"quota {quota.namespace}/{quota.name}: '{r}: {quota.hard[r]}' is not enforced by Kubernetes for "
        f"extended resources; write 'requests.{r}: {quota.hard[r]}'"
        for r in sorted(quota.hard)
        if policy.vendor_of(r) is not None and f"requests.{r}" not in quota.hard
    ]


def quota_warnings(index: PoolIndex, policy: Policy) -> list[str]:
    """Quotas on GPU resources that do not do what their author meant."""
    warnings = []
    for q in sorted(index.all_quotas(), key=lambda q: (q.namespace, q.name)):
        warnings.extend(unenforced(q, policy))
        if q.scoped:
            warnings.append(f"quota {q.namespace}/{q.name}: has scopes; gpupool does not check it (Kubernetes does)")
    return warnings
