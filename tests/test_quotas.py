"""ResourceQuotas: the admission check in the form Kubernetes enforces, and warnings for the other form."""

from __future__ import annotations

from tests.builders import fleet, index_of, pod, policy, quota
from webhook.annotations import parse_request
from webhook.kubeobj import quota_from_obj
from webhook.model import PoolKey
from webhook.pod import read_pod
from webhook.quotas import check_quotas, quota_warnings, unenforced

POLICY = policy()
T4 = PoolKey("nvidia", "medium", "Tesla-T4")


def test_resource_quota_uses_status_used_plus_reservations() -> None:
    """`requests.nvidia.com/gpu` is checked with used + requested ≤ hard; the unenforced form is not."""
    objects = [
        *fleet(),
        quota("gpu-quota", "team", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "3"}),
        quota("wrong", "team", {"nvidia.com/gpu": "1"}),
    ]
    index = index_of(objects)
    one = parse_request(read_pod(pod(namespace="team", annotations={"gpupool.io/gpu-count": "1"})).shape, POLICY)
    two = parse_request(read_pod(pod(namespace="team", annotations={"gpupool.io/gpu-count": "2"})).shape, POLICY)
    assert check_quotas(one, index, "nvidia.com/gpu") == ""
    assert check_quotas(two, index, "nvidia.com/gpu") == (
        "exceeded quota gpu-quota in namespace team: requests.nvidia.com/gpu used 3 + requested 2 > hard 4"
    )
    index.reserve("team", T4, (), 1, now=0.0)
    assert "used 4 + requested 1 > hard 4" in check_quotas(one, index, "nvidia.com/gpu")


def test_scoped_quota_is_left_to_kubernetes() -> None:
    """gpupool does not evaluate scopes; it neither denies by such a quota nor hides it from the admin."""
    obj = quota("prio", "team", {"requests.nvidia.com/gpu": "0"})
    obj["spec"]["scopeSelector"] = {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    }
    index = index_of([*fleet(), obj])
    one = parse_request(read_pod(pod(namespace="team", annotations={"gpupool.io/gpu-count": "1"})).shape, POLICY)
    assert check_quotas(one, index, "nvidia.com/gpu") == ""
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
