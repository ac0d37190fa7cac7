"""ResourceQuotas that do not do what their author meant: the warnings for the admin (the check on
admission is webhook.admission.quotas)."""

from __future__ import annotations

from webhook.domain.model import QuotaInfo
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex


def unenforced(quota: QuotaInfo, policy: Policy) -> list[str]:
    """GPU entries written as `nvidia.com/gpu: 4` or `limits.nvidia.com/gpu: 4`, which Kubernetes stores
    but never enforces for extended resources: enforced by gpupool only (or by nobody, when the policy
    turns that off)."""
    who = (
        "enforced by gpupool only, for the Pods it admits"
        if policy.defaults.enforce_all_gpu_quota_forms
        else "not enforced at all (policy defaults.enforceAllGpuQuotaForms is false)"
    )
    return [
        f"quota {quota.namespace}/{quota.name}: '{key}: {quota.hard[key]}' is not enforced by Kubernetes for "
        f"extended resources; {who}; write 'requests.{r}: {quota.hard[key]}'"
        for r in sorted(policy.gpu_resources)
        if f"requests.{r}" not in quota.hard
        for key in (r, f"limits.{r}")
        if key in quota.hard
    ]


def quota_warnings(index: PoolIndex, policy: Policy) -> list[str]:
    """Quotas on GPU resources that do not do what their author meant."""
    warnings = []
    for q in sorted(index.all_quotas(), key=lambda q: (q.namespace, q.name)):
        warnings.extend(unenforced(q, policy))
        if q.scoped:
            warnings.append(f"quota {q.namespace}/{q.name}: has scopes; gpupool does not check it (Kubernetes does)")
    return warnings
