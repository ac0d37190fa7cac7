"""ResourceQuotas that do not do what their author meant, as the admin is warned of them."""

from __future__ import annotations

from tests.builders import fleet, index_of, pod, policy, quota
from tests.pools.probes import T4, T4_SELECTOR
from webhook.pools.kubeobj import quota_from_obj
from webhook.pools.quotas.report import quota_rows, quota_warnings, unenforced
from webhook.pools.reservations import Reservation

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
    """`nvidia.com/gpu: 4` and `limits.nvidia.com/gpu: 4` limit nothing in Kubernetes: the warning says
    that gpupool alone enforces them (or nobody, with the policy switch off) and what to write instead."""
    info = quota_from_obj(
        quota("q", "team-b", {"nvidia.com/gpu": "4", "limits.nvidia.com/gpu": "6", "cpu": "8"}), POLICY.gpu_resources
    )
    assert info is not None
    assert unenforced(info, POLICY) == [
        "quota team-b/q: 'nvidia.com/gpu: 4' is not enforced by Kubernetes for extended resources; enforced by "
        "gpupool only, for the Pods it admits; write 'requests.nvidia.com/gpu: 4'",
        "quota team-b/q: 'limits.nvidia.com/gpu: 6' is not enforced by Kubernetes for extended resources; enforced "
        "by gpupool only, for the Pods it admits; write 'requests.nvidia.com/gpu: 6'",
    ]
    off = policy("defaults: {enforceAllGpuQuotaForms: false}")
    assert "not enforced at all (policy defaults.enforceAllGpuQuotaForms is false)" in unenforced(info, off)[0]
    both = quota_from_obj(
        quota("q", "t", {"nvidia.com/gpu": "4", "requests.nvidia.com/gpu": "4"}), POLICY.gpu_resources
    )
    assert both is not None and unenforced(both, POLICY) == []


def test_every_quota_gpupool_checks_is_a_row_with_used_pending_hard_and_who_enforces_it() -> None:
    """ResourceQuotas in the form Kubernetes enforces (used: status.used), in the forms only gpupool
    enforces (used: gpupool's own count of the namespace's Pods), the policy's class and memory quotas;
    pending is what gpupool admitted that the watch has not shown yet. Scoped quotas are not checked,
    so not listed; -n keeps one namespace."""
    pol = policy("namespaces: {team-a: {classQuota: {medium: 8}, memoryQuota: 64Gi}}")
    scoped = quota("prio", "team-a", {"requests.nvidia.com/gpu": "1"})
    scoped["spec"]["scopes"] = ["NotTerminating"]
    objects = [
        *fleet(),
        pod("a", "team-a", gpus=2, node="t4-a", phase="Running"),
        pod("b", "team-b", gpus=1, node="t4-b", phase="Running"),
        quota("gpu-quota", "team-a", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "2"}),
        quota("tutorial", "team-b", {"nvidia.com/gpu": "4", "limits.nvidia.com/gpu": "6"}),
        scoped,
    ]
    index = index_of(objects, pol)
    index.reserve(Reservation(namespace="team-a", pool=T4, selector=T4_SELECTOR, gpus=1, name="next"), now=0.0)
    rows = quota_rows(index, pol)
    assert [tuple(r) for r in rows] == [
        ("team-a", "classQuota", "medium", 2, 1, 8, "gpus", "gpupool only", False),
        ("team-a", "gpu-quota", "requests.nvidia.com/gpu", 2, 1, 4, "gpus", "Kubernetes and gpupool", True),
        ("team-a", "memoryQuota", "gpu-memory", 2 * 15360, 15360, 64 * 1024, "MiB", "gpupool only", False),
        ("team-b", "tutorial", "limits.nvidia.com/gpu", 1, 0, 6, "gpus", "gpupool only", False),
        ("team-b", "tutorial", "nvidia.com/gpu", 1, 0, 4, "gpus", "gpupool only", False),
    ]
    # Placing `now` with an unknown count of admitting processes, only the requests. form is exact; one
    # process makes every row exact.
    assert all(r.exact for r in quota_rows(index, pol, admitters=1))
    assert [r.quota for r in quota_rows(index, pol, "team-b")] == ["tutorial", "tutorial"]
    off = policy("defaults: {enforceAllGpuQuotaForms: false}")
    assert {r.enforced_by for r in quota_rows(index_of(objects, off), off, "team-b")} == {"nobody"}


def test_a_quota_on_mig_instances_is_a_row_too() -> None:
    """Admission enforces a ResourceQuota on a MIG profile's resource, so `gpupool quota` and the quota
    metrics list it beside the whole GPUs', in every form."""
    hard = {"requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-3g.20gb": "2", "nvidia.com/mig-1g.5gb": "7"}
    index = index_of([*fleet(), quota("mixed", "team-a", hard)], POLICY)
    assert [(r.resource, r.hard, r.enforced_by) for r in quota_rows(index, POLICY)] == [
        ("nvidia.com/mig-1g.5gb", 7, "gpupool only"),
        ("requests.nvidia.com/gpu", 4, "Kubernetes and gpupool"),
        ("requests.nvidia.com/mig-3g.20gb", 2, "Kubernetes and gpupool"),
    ]


def test_an_unprefixed_mig_quota_is_flagged_too() -> None:
    """`nvidia.com/mig-1g.5gb: 7` is stored and never enforced, like `nvidia.com/gpu: 4`."""
    info = quota_from_obj(
        quota("q", "t", {"nvidia.com/mig-1g.5gb": "7"}), POLICY.gpu_resources, POLICY.partition_prefixes
    )
    assert info is not None
    assert unenforced(info, POLICY) == [
        "quota t/q: 'nvidia.com/mig-1g.5gb: 7' is not enforced by Kubernetes for extended resources; "
        "enforced by gpupool only, for the Pods it admits; write 'requests.nvidia.com/mig-1g.5gb: 7'"
    ]
