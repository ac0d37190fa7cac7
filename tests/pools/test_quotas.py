"""ResourceQuotas that do not do what their author meant, as the admin is warned of them."""

from __future__ import annotations

from tests.builders import fleet, index_of, policy, quota
from webhook.pools.kubeobj import quota_from_obj
from webhook.pools.quotas import quota_warnings, unenforced

POLICY = policy()


def test_scoped_quota_is_not_hidden_from_the_admin() -> None:
    """gpupool does not evaluate scopes, and says so."""
    obj = quota("prio", "team", {"requests.nvidia.com/gpu": "0"})
    obj["spec"]["scopeSelector"] = {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    }
    index = index_of([*fleet(), obj])
    assert quota_warnings(index, POLICY) == ["quota team/prio: has scopes; gpupool does not check it (Kubernetes does)"]


def test_unprefixed_gpu_quota_is_flagged_with_the_fix() -> None:
    """`nvidia.com/gpu: 4` limits nothing; the warning says what to write instead."""
    info = quota_from_obj(quota("q", "team-b", {"nvidia.com/gpu": "4", "cpu": "8"}), POLICY.gpu_resources)
    assert info is not None
    assert unenforced(info, POLICY) == [
        "quota team-b/q: 'nvidia.com/gpu: 4' is not enforced by Kubernetes for extended resources; "
        "write 'requests.nvidia.com/gpu: 4'"
    ]
    both = quota_from_obj(
        quota("q", "t", {"nvidia.com/gpu": "4", "requests.nvidia.com/gpu": "4"}), POLICY.gpu_resources
    )
    assert both is not None and unenforced(both, POLICY) == []


def test_an_unprefixed_mig_quota_is_flagged_too() -> None:
    """`nvidia.com/mig-1g.5gb: 7` is stored and never enforced, like `nvidia.com/gpu: 4`."""
    info = quota_from_obj(
        quota("q", "t", {"nvidia.com/mig-1g.5gb": "7"}), POLICY.gpu_resources, POLICY.partition_prefixes
    )
    assert info is not None
    assert unenforced(info, POLICY) == [
        "quota t/q: 'nvidia.com/mig-1g.5gb: 7' is not enforced by Kubernetes for extended resources; "
        "write 'requests.nvidia.com/mig-1g.5gb: 7'"
    ]
