"""ResourceQuotas on admission: the check in the form Kubernetes enforces, with gpupool's reservations."""

from __future__ import annotations

from tests.builders import fleet, index_of, pod, policy, quota
from webhook.admission.pod import read_pod
from webhook.admission.quotas import check_quotas
from webhook.admission.request import parse_request
from webhook.domain.model import PoolKey

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
    """gpupool does not evaluate scopes: it denies nothing by such a quota (the warning: tests/pools)."""
    obj = quota("prio", "team", {"requests.nvidia.com/gpu": "0"})
    obj["spec"]["scopeSelector"] = {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    }
    index = index_of([*fleet(), obj])
    one = parse_request(read_pod(pod(namespace="team", annotations={"gpupool.io/gpu-count": "1"})).shape, POLICY)
    assert check_quotas(one, index, "nvidia.com/gpu") == ""
