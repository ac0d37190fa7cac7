"""What `placement: now` cannot promise: which quotas a burst through several admitting processes can
exceed, and the policy's warnings that say so."""

from __future__ import annotations

from webhook.domain.exactness import exact_in, policy_warnings
from webhook.domain.policy import load_policy, load_policy_text

NOW_WITH_QUOTAS = """
defaults: {placement: now}
namespaces:
  team-c: {classQuota: {medium: 4}}
  team-m: {memoryQuota: 100Gi}
  team-q: {placement: queue, classQuota: {medium: 4}}
  team-open: {allowedClasses: [low]}
"""


def test_the_shipped_policy_warns_of_nothing_with_two_replicas() -> None:
    """Every namespace queues under the shipped policy: every quota is exact with any replica count."""
    assert policy_warnings(load_policy(None), 2) == []
    assert exact_in(load_policy(None), "anywhere", 2)


def test_a_now_namespace_with_a_policy_quota_is_warned_of_with_more_than_one_admitter() -> None:
    """classQuota and memoryQuota of `now` namespaces are named, with the field and the fix; a queue
    namespace's are not; the ResourceQuota forms get one warning naming where `now` applies."""
    warnings = policy_warnings(load_policy_text(NOW_WITH_QUOTAS), 2)
    assert len(warnings) == 3, warnings
    class_quota, memory_quota, resource_quotas = warnings
    assert class_quota.startswith("namespaces.team-c: placement now with classQuota: with 2 admitting processes")
    assert memory_quota.startswith("namespaces.team-m: placement now with memoryQuota")
    for warning in warnings:
        assert "a burst can exceed" in warning and "placement: queue" in warning
    assert "defaults (every namespace not listed)" in resource_quotas
    assert "namespaces.team-c" in resource_quotas and "namespaces.team-q" not in resource_quotas
    assert "requests.nvidia.com/gpu" in resource_quotas


def test_one_admitting_process_is_exact_under_now() -> None:
    """One process sees every admission: nothing to warn of."""
    policy = load_policy_text(NOW_WITH_QUOTAS)
    assert policy_warnings(policy, 1) == []
    assert exact_in(policy, "team-c", 1)


def test_an_unknown_replica_count_counts_as_several() -> None:
    policy = load_policy_text(NOW_WITH_QUOTAS)
    assert not exact_in(policy, "team-c", None)
    assert policy_warnings(policy, None)[0].startswith("namespaces.team-c: placement now with classQuota: with several")


def test_resource_quota_forms_are_not_warned_of_when_gpupool_does_not_enforce_them() -> None:
    """With enforceAllGpuQuotaForms false gpupool does not check the forms at all (gpupool quota says
    `nobody`): no warning about their exactness, only the policy's own quotas."""
    policy = load_policy_text("defaults: {placement: now, enforceAllGpuQuotaForms: false}\n")
    assert policy_warnings(policy, 2) == []
