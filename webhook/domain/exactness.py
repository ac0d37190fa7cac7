"""What `placement: now` cannot promise: exact quotas when more than one process admits.

Under `now` the quotas only gpupool enforces (ResourceQuotas written as `nvidia.com/gpu` or
`limits.nvidia.com/gpu`, the policy's `classQuota` and `memoryQuota`) are checked by the process that
kube-apiserver calls, against what that process has seen: two replicas (or two workers of one) that admit
at the same moment each see room for one more Pod, and both admit it. Under `queue` one leader charges
them, so they are exact with any number of replicas. `requests.nvidia.com/gpu` is enforced by Kubernetes
itself, exact either way.
"""

from __future__ import annotations

from webhook.domain.policy_model import Policy


def exact_in(policy: Policy, namespace: str, admitters: int | None) -> bool:
    """Are the quotas only gpupool enforces exact for the namespace's Pods? With `queue` always; with `now`
    only when one process admits. `admitters` is replicas x workers; None when unknown (counted as several:
    the shipped install runs two replicas)."""
    return policy.placement(namespace) == "queue" or admitters == 1


def policy_warnings(policy: Policy, admitters: int | None) -> list[str]:
    """The quotas of `policy` that a burst may exceed because their namespace places `now` while several
    processes admit, each warning naming the field and how to make it exact."""
    if admitters == 1:
        return []
    several = "several admitting processes" if admitters is None else f"{admitters} admitting processes"
    fix = "set placement: queue there for exact quotas (docs/queue.md)"
    warnings = []
    for ns, rule in sorted(policy.namespaces.items()):
        quotas = [
            name
            for name, set_ in (
                ("classQuota", bool(rule.class_quota)),
                ("memoryQuota", rule.memory_quota_mib is not None),
            )
            if set_
        ]
        if quotas and not exact_in(policy, ns, admitters):
            warnings.append(
                f"namespaces.{ns}: placement now with {' and '.join(quotas)}: with {several} (replicas x workers) "
                f"each checks it alone against what it has seen, so a burst can exceed it; {fix}"
            )
    if policy.defaults.enforce_all_gpu_quota_forms:
        where = [f"namespaces.{ns}" for ns in sorted(policy.namespaces) if not exact_in(policy, ns, admitters)]
        if policy.defaults.placement == "now":
            where.insert(0, "defaults (every namespace not listed)")
        if where:
            warnings.append(
                f"placement now in {', '.join(where)}: ResourceQuotas written as nvidia.com/gpu or "
                f"limits.nvidia.com/gpu there, which only gpupool enforces, are checked by each of {several} "
                f"alone, so a burst can exceed them (`gpupool quota` marks them); {fix}, or write "
                "requests.nvidia.com/gpu, which Kubernetes enforces"
            )
    return warnings
