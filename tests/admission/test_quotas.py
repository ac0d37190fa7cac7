"""ResourceQuotas on admission, in every form admins write them, and the policy's GPU-memory quota."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import fleet, gpu_node, index_of, mig_mixed_node, pod, policy, quota
from webhook.admission.core import Admitter, evaluate
from webhook.admission.pod import read_pod
from webhook.admission.request import GpuRequest, parse_request
from webhook.domain.model import PoolKey
from webhook.pools.quotas.checks import memory_quota_problem, resource_quota_problem
from webhook.pools.reservations import Reservation
from webhook.sources.snapshot import SnapshotInventory

POLICY = policy()
OFF = policy("defaults: {enforceAllGpuQuotaForms: false}")
T4 = PoolKey("nvidia", "medium", "Tesla-T4")


def ask(gpus: int, namespace: str = "team") -> GpuRequest:
    return parse_request(
        read_pod(pod(namespace=namespace, annotations={"gpupool.io/gpu-count": str(gpus)})).shape, POLICY
    )


def running(name: str, gpus: int, namespace: str = "team", phase: str = "Running") -> dict[str, Any]:
    return pod(name, namespace, gpus=gpus, node="t4-a", phase=phase)


def test_resource_quota_uses_status_used_plus_reservations() -> None:
    """`requests.nvidia.com/gpu` (the form Kubernetes enforces) is checked with status.used plus what
    gpupool admitted that the quota controller has not counted yet."""
    index = index_of(
        [*fleet(), quota("gpu-quota", "team", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "3"})]
    )
    assert resource_quota_problem(ask(1), index, POLICY, "nvidia.com/gpu") == ""
    assert resource_quota_problem(ask(2), index, POLICY, "nvidia.com/gpu") == (
        "exceeded quota gpu-quota in namespace team: requests.nvidia.com/gpu used 3 + requested 2 > hard 4"
    )
    index.reserve(Reservation(namespace="team", pool=T4, selector=(), gpus=1), now=0.0)
    assert "used 4 + requested 1 > hard 4" in resource_quota_problem(ask(1), index, POLICY, "nvidia.com/gpu")


@pytest.mark.parametrize("key", ["nvidia.com/gpu", "limits.nvidia.com/gpu"])
def test_the_tutorials_quota_form_is_enforced_by_gpupool(key: str) -> None:
    """`kubectl create quota --hard=nvidia.com/gpu=4` (and the limits. form) limits nothing in Kubernetes;
    gpupool holds the Pods it admits to it, counting the namespace's non-terminated Pods itself (the
    quota's status.used is empty for these forms) plus its reservations. The denial says Kubernetes
    does not enforce the form and how to write the one it does."""
    objects = [*fleet(), running("a", 2), running("b", 1), running("done", 4, phase="Succeeded"),
               running("other-ns", 4, namespace="elsewhere"), quota("gpu-quota", "team", {key: "4"})]  # fmt: skip
    index = index_of(objects)
    assert resource_quota_problem(ask(1), index, POLICY, "nvidia.com/gpu") == ""
    assert resource_quota_problem(ask(2), index, POLICY, "nvidia.com/gpu") == (
        f"exceeded quota gpu-quota in namespace team: {key} used 3 + requested 2 > hard 4; Kubernetes does not "
        f"enforce '{key}' for extended resources, gpupool does; write 'requests.nvidia.com/gpu: 4' to have "
        "Kubernetes enforce it"
    )
    index.reserve(Reservation(namespace="team", pool=T4, selector=(), gpus=1, name="c"), now=0.0)
    assert "used 4 + requested 1 > hard 4" in resource_quota_problem(ask(1), index, POLICY, "nvidia.com/gpu")
    assert resource_quota_problem(ask(2), index, OFF, "nvidia.com/gpu") == ""  # the policy switch turns it off


def test_a_pod_naming_its_node_is_held_to_the_tutorials_form_too() -> None:
    """Every Pod gpupool admits is held to it, however it arrives: one that names its node as well."""
    index = index_of([*fleet(), running("a", 3), quota("q", "team", {"nvidia.com/gpu": "4"})])
    result = evaluate(pod("bound", "team", gpus=2, node="t4-b"), "team", POLICY, index)
    assert (result.allowed, result.reason) == (False, "quota")
    assert result.message.startswith("exceeded quota q in namespace team: nvidia.com/gpu used 3 + requested 2 > hard 4")


def test_scoped_quota_is_left_to_kubernetes() -> None:
    """gpupool does not evaluate scopes: it denies nothing by such a quota (the warning: tests/pools)."""
    obj = quota("prio", "team", {"requests.nvidia.com/gpu": "0", "nvidia.com/gpu": "0"})
    obj["spec"]["scopeSelector"] = {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    }
    index = index_of([*fleet(), obj])
    assert resource_quota_problem(ask(1), index, POLICY, "nvidia.com/gpu") == ""


# --- the GPU-memory quota ----------------------------------------------------------------------------------

MEMORY = policy("namespaces: {team: {memoryQuota: 64Gi}}")


def memory_fleet() -> list[dict[str, Any]]:
    """T4s (15Gi) and A100s (40Gi); `team` runs one A100 GPU already: 40Gi of its 64Gi."""
    return [
        gpu_node("t4-a", "Tesla-T4", 4, memory_mib=15360),
        gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high"),
        pod("a", "team", gpus=1, node="a100-a", phase="Running"),
    ]


def test_a_pool_whose_gpus_would_exceed_the_memory_quota_is_passed_over() -> None:
    """A Pod that prefers high: another A100 GPU (40Gi) would take team to 80Gi of 64Gi, so the A100
    pool is passed over and the T4 (15Gi) places it, as a class over its quota is."""
    index = index_of(memory_fleet(), MEMORY)
    obj = pod("p", "team", annotations={"gpupool.io/gpu-class": "high,medium"})
    result = evaluate(obj, "team", MEMORY, index)
    assert result.placement is not None and result.placement.pool == T4


def test_nothing_left_under_the_memory_quota_is_denied_naming_used_requested_hard() -> None:
    """Two GPUs are 30Gi on the T4s and 80Gi on the A100s; with 40Gi of 64Gi used neither fits, so the
    Pod is denied naming the namespace, used, requested (on the best-ranked pool) and hard: 403."""
    index = index_of(memory_fleet(), MEMORY)
    result = evaluate(pod("p", "team", annotations={"gpupool.io/gpu-count": "2"}), "team", MEMORY, index)
    assert (result.allowed, result.code, result.reason) == (False, 403, "memory-quota")
    assert result.message == "GPU memory quota in namespace team exceeded: used 40Gi + requested 30Gi > hard 64Gi"


def test_the_memory_quota_counts_admissions_the_watch_has_not_shown() -> None:
    """A burst cannot get past it: each admission holds its memory at once."""
    index = index_of(memory_fleet(), MEMORY)
    assert memory_quota_problem("team", 1, 15360, index, MEMORY, where="t4") == ""
    index.reserve(Reservation(namespace="team", pool=T4, selector=(), gpus=1, name="x"), now=0.0)
    assert memory_quota_problem("team", 1, 15360, index, MEMORY, where="t4") == (
        "GPU memory quota in namespace team exceeded: used 55Gi + requested 15Gi > hard 64Gi"
    )
    assert memory_quota_problem("other", 1, 10**9, index, MEMORY, where="t4") == ""  # no quota there


def test_a_pod_naming_its_node_is_held_to_the_memory_quota() -> None:
    """A Pod that names an A100 node asks for that node's memory: 40 + 2 x 40 > 64."""
    index = index_of(memory_fleet(), MEMORY)
    result = evaluate(pod("b", "team", gpus=2, node="a100-a"), "team", MEMORY, index)
    assert (result.allowed, result.reason) == (False, "memory-quota")
    assert "used 40Gi + requested 80Gi > hard 64Gi" in result.message


def test_devices_of_unknown_memory_cannot_get_around_the_memory_quota() -> None:
    """A pool whose nodes say nothing of their GPU memory (no memory label, a product the table does not
    know) would count 0 against the quota: a way around it. Under a memoryQuota it is passed over, and a
    Pod naming such a node is denied, saying why; a namespace without one still gets it."""
    mystery = gpu_node("x-a", "Mystery-Accelerator-9000", 8, memory_mib=None, gpu_class="high")
    index = index_of([*memory_fleet(), mystery], MEMORY)
    pinned = {"gpupool.io/gpu-product": "Mystery"}
    result = evaluate(pod("p", "team", annotations=pinned), "team", MEMORY, index)
    assert (result.allowed, result.code, result.reason) == (False, 403, "memory-quota")
    assert "the GPU memory of nvidia/high/Mystery-Accelerator-9000 is unknown" in result.message
    assert evaluate(pod("p", "other", annotations=pinned), "other", MEMORY, index).allowed
    bound = evaluate(pod("b", "team", gpus=1, node="x-a"), "team", MEMORY, index)
    assert (bound.allowed, bound.reason) == (False, "memory-quota")
    assert "the GPU memory of node x-a is unknown" in bound.message


def test_mig_instances_count_their_own_memory_against_the_quota() -> None:
    """A MIG instance holds its own memory, not its GPU's: with one 3g.20gb instance (19.6Gi) running
    under a 30Gi quota, a second 3g.20gb is denied, bound or not, and a 1g.5gb still fits."""
    pol = policy("namespaces: {team: {memoryQuota: 30Gi}}")
    running = pod("run", "team", gpus=1, resource="nvidia.com/mig-3g.20gb", node="m-a", phase="Running")
    index = index_of([mig_mixed_node("m-a"), running], pol)
    assert index.usage.memory_used("team") == 20096
    for node in ("m-a", None):
        again = evaluate(pod("b", "team", gpus=1, resource="nvidia.com/mig-3g.20gb", node=node), "team", pol, index)
        assert (again.allowed, again.reason) == (False, "memory-quota")
        assert "used 20096Mi + requested 20096Mi > hard 30Gi" in again.message
    small = evaluate(pod("s", "team", gpus=1, resource="nvidia.com/mig-1g.5gb"), "team", pol, index)
    assert small.allowed and small.placement is not None and small.placement.resource == "nvidia.com/mig-1g.5gb"


# --- several kinds of device in one Pod ------------------------------------------------------------------


def several(name: str, namespace: str, *, node: str | None = None, gpus: int = 4, mig: int = 1) -> dict[str, Any]:
    """A Pod asking `gpus` x nvidia.com/gpu and `mig` x nvidia.com/mig-1g.5gb, in two containers."""
    obj = pod(name, namespace, gpus=gpus, node=node)
    obj["spec"]["containers"].append(
        {"name": "slice", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.5gb": str(mig)}}}
    )
    return obj


def mixed_fleet(*more: dict[str, Any]) -> list[dict[str, Any]]:
    """A mixed-strategy A100 (4 whole GPUs, 4 3g.20gb, 14 1g.5gb; classes from the product table) and T4s."""
    return [mig_mixed_node("mixed-a", gpu_class=None), *fleet(), *more]


@pytest.mark.parametrize("node", [None, "mixed-a"], ids=["unplaced", "naming-its-node"])
def test_several_kinds_are_held_to_the_tutorials_quota_again_and_again(node: str | None) -> None:
    """team-b may hold 4 nvidia.com/gpu (the tutorial's form, enforced by gpupool) and runs 1: a Pod asking
    4 GPUs plus a 1g.5gb MIG slice is refused for its 4 GPUs, every time it is tried (server-side dry runs
    included), whether gpupool places it or it names its node."""
    objects = mixed_fleet(running("a", 1, namespace="team-b"), quota("gpu-quota", "team-b", {"nvidia.com/gpu": "4"}))
    index = index_of(objects)
    for _ in range(3):
        result = evaluate(several("p", "team-b", node=node), "team-b", POLICY, index)
        assert (result.allowed, result.code, result.reason) == (False, 403, "quota")
        assert "exceeded quota gpu-quota in namespace team-b: nvidia.com/gpu used 1 + requested 4 > hard 4" in (
            result.message
        )


@pytest.mark.parametrize("node", [None, "mixed-a"], ids=["unplaced", "naming-its-node"])
def test_each_kind_is_counted_as_itself_against_its_own_resource_quota(node: str | None) -> None:
    """ResourceQuotas name a resource: the MIG slice counts against requests.nvidia.com/mig-1g.5gb, the GPUs
    against requests.nvidia.com/gpu, neither against the other's. 2 GPUs + 1 slice fit quotas of 2 and 1;
    a second slice does not."""
    hard = {"requests.nvidia.com/gpu": "2", "requests.nvidia.com/mig-1g.5gb": "1"}
    index = index_of(mixed_fleet(quota("q", "team", hard)))
    assert evaluate(several("p", "team", node=node, gpus=2), "team", POLICY, index).allowed
    over = evaluate(several("p", "team", node=node, gpus=2, mig=2), "team", POLICY, index)
    assert (over.allowed, over.reason) == (False, "quota")
    assert "requests.nvidia.com/mig-1g.5gb used 0 + requested 2 > hard 1" in over.message


def test_a_pod_naming_its_node_counts_every_kind_against_the_class_quota_together() -> None:
    """On the mixed A100 node whole GPUs and 1g.5gb slices are both high: with classQuota high: 4 and 1
    held, 2 GPUs and 2 slices (4 high devices) are refused, though each kind alone would fit."""
    pol = policy("namespaces: {team: {classQuota: {high: 4}}}")
    index = index_of(mixed_fleet(pod("a", "team", gpus=1, node="mixed-a", phase="Running")), pol)
    assert evaluate(pod("g", "team", gpus=2, node="mixed-a"), "team", pol, index).allowed
    together = evaluate(several("p", "team", node="mixed-a", gpus=2, mig=2), "team", pol, index)
    assert (together.allowed, together.reason) == (False, "class-quota")
    assert "class quota high in namespace team exceeded: used 1 + requested 4 > hard 4" in together.message


def test_a_pod_naming_its_node_counts_every_kind_against_the_memory_quota_together() -> None:
    """2 whole A100-40GB GPUs (80Gi) and a 1g.5gb slice (4864Mi) are 84.75Gi together: over 84Gi."""
    pol = policy("namespaces: {team: {memoryQuota: 84Gi}}")
    index = index_of(mixed_fleet(), pol)
    assert evaluate(pod("g", "team", gpus=2, node="mixed-a"), "team", pol, index).allowed
    together = evaluate(several("p", "team", node="mixed-a", gpus=2), "team", pol, index)
    assert (together.allowed, together.reason) == (False, "memory-quota")
    assert "used 0Mi + requested 86784Mi > hard 84Gi" in together.message


def test_a_pod_naming_its_node_is_held_to_the_class_of_every_kind_it_requests() -> None:
    """Where whole A100s are medium and 1g.5gb slices high, a students Pod (medium only) naming the node
    may take a whole GPU but not a GPU and a slice: the slice's class is checked too."""
    pol = policy(
        "products: [{match: A100, class: medium}, {match: A100-MIG-1g.5gb, class: high}]\n"
        "namespaces: {students: {allowedClasses: [low, medium]}}\n"
    )
    index = index_of(mixed_fleet(), pol)
    assert evaluate(pod("g", "students", gpus=1, node="mixed-a"), "students", pol, index).allowed
    result = evaluate(several("p", "students", node="mixed-a", gpus=1), "students", pol, index)
    assert (result.allowed, result.reason) == (False, "bound-node")
    assert "class high is not allowed in namespace students" in result.message


def test_a_pod_naming_a_node_gpupool_does_not_know_is_still_held_to_its_resource_quotas() -> None:
    """A node gpupool cannot check (not seen yet) leaves the node's class unchecked where the namespace has
    no class rules, but its ResourceQuotas hold wherever the Pod runs."""
    index = index_of(mixed_fleet(running("a", 3), quota("q", "team", {"requests.nvidia.com/gpu": "4"},
                                                        {"requests.nvidia.com/gpu": "3"})))  # fmt: skip
    assert evaluate(pod("b", "team", gpus=1, node="unseen"), "team", POLICY, index).allowed
    result = evaluate(several("b", "team", node="unseen", gpus=2), "team", POLICY, index)
    assert (result.allowed, result.reason) == (False, "quota")
    assert "requests.nvidia.com/gpu used 3 + requested 2 > hard 4" in result.message


def test_a_pod_naming_its_node_reserves_its_first_kind_exactly() -> None:
    """Until the watch shows it, a Pod naming its node holds its first resource's devices on the node (the
    whole GPUs here), not the sum of every kind: 2 GPUs + 1 slice leave 2 of 4 whole GPUs for the next."""
    pol = policy("namespaces: {team: {classQuota: {high: 4}}}")
    index = index_of(mixed_fleet(), pol)
    admitter = Admitter(pol, SnapshotInventory(index, "test"))
    first = admitter.admit(several("p", "team", node="mixed-a", gpus=2), namespace="team")
    assert first.placement is not None and (first.placement.resource, first.placement.pod_total) == (
        "nvidia.com/gpu",
        2,
    )
    assert index.usage.class_used("team", "high") == 2
    assert admitter.admit(pod("q", "team", gpus=2, node="mixed-a"), namespace="team").allowed
    assert not admitter.admit(pod("r", "team", gpus=1, node="mixed-a"), namespace="team").allowed
