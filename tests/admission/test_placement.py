"""The patch says exactly the pool: where the scheduler may put a patched Pod, judged by Kubernetes' rules
(tests/scheduling.py), is the chosen pool's nodes that the Pod itself allows — never a node gpupool rules
out, whatever the labelling of the fleet and whatever node affinity the Pod brings; and Pods that bypass
placement are checked on every node they can reach."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import scheduling
from tests.admission.demo import (
    _demo_objects,
    apply,
    demo_policy,
    kubectl_patch,
    load_sample,
    shared_demo_index,
    validate_pod,
)
from tests.builders import GPU_TAINT, gpu_node, index_of, pod
from tests.builders import policy as read_policy
from webhook.admission.core import Admitter, evaluate
from webhook.admission.verdict import Verdict
from webhook.domain.model import PoolKey
from webhook.domain.policy import Policy
from webhook.pools.kubeobj import node_from_obj
from webhook.sources.snapshot import SnapshotInventory


@functools.cache
def policy(text: str | None = None) -> Policy:
    """`tests.builders.policy`, read once per text for the module: the property test below asked for it
    again in each example, a fifth of its time, and nothing changes a Policy. (The test's body is left as
    it was: hypothesis derives a derandomized test's examples from its source.)"""
    return read_policy(text)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
A100 = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def nodes_of(objects: list[dict[str, Any]], resource: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "Node" and scheduling.offers(o, resource, 0)]


def where_it_can_run(result: Verdict, obj: dict[str, Any], objects: list[dict[str, Any]]) -> set[str]:
    """The nodes offering the placement's resource that the patched Pod's constraints allow."""
    assert result.placement is not None and result.patch
    return scheduling.reachable(apply(obj, result.patch), nodes_of(objects, result.placement.resource))


def demo_objects() -> list[dict[str, Any]]:
    return copy.deepcopy(list(_demo_objects()))


# --- finding 1: nodes gpupool leaves out are never reached -------------------------------------------------


def test_a_pod_waiting_for_the_h100s_cannot_land_on_the_one_whose_mig_layout_is_pending() -> None:
    """On the demo inventory, min-cuda 12.4 and compute 8.0 send the Pod to the H100s, which have no free
    GPU: it waits. gpu-h100-mig-01 (product H100, MIG config pending, 8 GPUs Ready) must not take it, or
    the scheduler binds it at once to a node whose layout is being changed and the warning is false."""
    obj = pod(
        "cuda", "ml-train", annotations={"gpupool.io/min-cuda": "12.4", "gpupool.io/min-compute-capability": "8.0"}
    )
    result = evaluate(obj, "ml-train", demo_policy(), shared_demo_index())
    assert result.placement is not None and str(result.placement.pool) == "nvidia/high/NVIDIA-H100-80GB-HBM3"
    assert any("will wait" in w for w in result.warnings)
    reached = where_it_can_run(result, obj, demo_objects())
    assert "gpu-h100-mig-01" not in reached
    assert reached == {n.name for n in shared_demo_index().capacity.members(result.placement.pool)}


def test_the_strict_group_sample_cannot_land_on_the_pending_node_either() -> None:
    obj = load_sample("group-strict.yaml")
    result = evaluate(obj, obj["metadata"]["namespace"], demo_policy(), shared_demo_index())
    assert "gpu-h100-mig-01" not in where_it_can_run(result, obj, demo_objects())


@pytest.mark.parametrize("state", ["pending", "rebooting", "failed"])
def test_a_mig_layout_that_is_not_in_place_is_never_reached(state: str) -> None:
    """Whatever the MIG manager says is not in place, the node is not pooled and not reachable."""
    objects = [
        gpu_node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class="high"),
        gpu_node("h100-m", "NVIDIA-H100-80GB-HBM3", 8, memory_mib=81559, gpu_class="high",
                 labels={"nvidia.com/mig.config.state": state}),
    ]  # fmt: skip
    obj = pod(annotations={"gpupool.io/gpu-class": "high"})
    result = evaluate(obj, "ml", policy(), index_of(objects))
    assert where_it_can_run(result, obj, objects) == {"h100-a"}


# --- finding 2: half-labelled fleets are placed, not refused ------------------------------------------------


def half_labelled() -> list[dict[str, Any]]:
    """The tutorial's hand labels on part of a T4 fleet: some medium, some unlabelled, one high."""
    return [
        gpu_node("t4-labelled", gpu_class="medium"),
        gpu_node("t4-plain-a", gpu_class=None),
        gpu_node("t4-plain-b", gpu_class=None, gpus=2),
        gpu_node("t4-high", gpu_class="high"),
    ]


MEDIUM_T4S = {"t4-labelled", "t4-plain-a", "t4-plain-b"}


@pytest.mark.parametrize("gpus", [1, 2], ids=["one-gpu", "two-gpus"])
def test_a_medium_pod_on_a_half_labelled_fleet_is_placed_on_every_medium_t4(gpus: int) -> None:
    """Refused before ("no GPU pool matches the Pod"): now placed, reaching the medium T4s, labelled or
    not, and never the T4 labelled high."""
    obj = pod(annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus)})
    objects = half_labelled()
    result = evaluate(obj, "ml", policy(), index_of(objects))
    assert result.allowed and result.placement is not None and result.placement.pool == T4, result.message
    assert where_it_can_run(result, obj, objects) == MEDIUM_T4S


def test_a_medium_pod_with_its_own_node_affinity_gets_it_anded_with_the_pool() -> None:
    """Its own terms are kept and each one gets the pool's requirements: a term naming the high T4 (or a
    zone it shares) reaches no node outside the pool."""
    obj = pod(annotations={"gpupool.io/gpu-class": "medium"})
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["t4-high"]}]},
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                           "values": ["t4-high", "t4-plain-a"]}]},
                ]
            }
        }
    }  # fmt: skip
    objects = half_labelled()
    result = evaluate(obj, "ml", policy(), index_of(objects))
    assert result.allowed and result.placement is not None, result.message
    patched = apply(obj, result.patch)
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms["nodeSelectorTerms"]) == 2 and terms["nodeSelectorTerms"][0]["matchFields"]
    assert where_it_can_run(result, obj, objects) == {"t4-plain-a"}


def test_a_term_that_cannot_meet_the_pool_leaves_it_out_with_the_reason() -> None:
    """A Pod whose only term asks for a zone no T4 is in: the T4 pool is no candidate, and explain says why."""
    obj = pod(annotations={"gpupool.io/gpu-class": "medium"})
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["mars"]}]}
                ]
            }
        }
    }
    result = evaluate(obj, "ml", policy(), index_of(half_labelled()))
    assert not result.allowed
    assert any("required node affinity excludes every node of the pool" in r for r in result.reasons)


# --- finding 3: replicas without the -SHARED suffix -------------------------------------------------------


def test_whole_t4s_are_kept_apart_from_replicas_labelled_by_count_only() -> None:
    """Older GFD and hand labels: `nvidia.com/gpu.replicas: 4` on a `Tesla-T4` product. A whole-GPU Pod
    reaches the whole T4s only; a replica Pod the replicas only."""
    objects = [
        gpu_node("t4-whole", gpu_class=None),
        gpu_node("t4-shared", gpus=16, gpu_class=None, labels={"nvidia.com/gpu.replicas": "4"}),
    ]
    whole = pod(annotations={"gpupool.io/gpu-class": "medium"})
    result = evaluate(whole, "ml", policy(), index_of(objects))
    assert where_it_can_run(result, whole, objects) == {"t4-whole"}
    shared = pod(annotations={"gpupool.io/device": "shared"})
    result = evaluate(shared, "ml", policy(), index_of(objects))
    assert result.placement is not None and result.placement.device == "shared"
    assert where_it_can_run(result, shared, objects) == {"t4-shared"}


# --- property: for generated fleets and Pods, exactly the pool's nodes the Pod allows ----------------------

PRODUCTS = ["Tesla-T4", "NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"]
NODE = st.fixed_dictionaries(
    {
        "product": st.sampled_from(PRODUCTS),
        "gpus": st.sampled_from([1, 2, 4, 8]),
        "label": st.sampled_from([None, None, "same", "low", "medium", "high", "superfast"]),
        "sharing": st.sampled_from([None, None, None, "suffixed", "count-only", "strategy-only"]),
        "mig": st.sampled_from([None, None, None, "success", "pending", "rebooting", "failed", "single"]),
        "zone": st.sampled_from(["a", "b"]),
        "taint": st.booleans(),
    }
)
CLASS_OF = {
    "Tesla-T4": "medium",
    "NVIDIA-L4": "medium",
    "NVIDIA-A100-SXM4-40GB": "high",
    "NVIDIA-H100-80GB-HBM3": "high",
}


def generated_node(i: int, spec: dict[str, Any]) -> dict[str, Any]:
    """A node as GPU Feature Discovery (or a hand, for count-only replicas and bogus classes) labels it."""
    product, gpus = spec["product"], spec["gpus"]
    label = CLASS_OF[product] if spec["label"] == "same" else spec["label"]
    labels = {"topology.kubernetes.io/zone": spec["zone"]}
    if spec["sharing"] == "suffixed":
        product, gpus = f"{product}-SHARED", gpus * 2
        labels |= {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    elif spec["sharing"] == "count-only":
        labels["nvidia.com/gpu.replicas"], gpus = "2", gpus * 2
    elif spec["sharing"] == "strategy-only":
        labels["nvidia.com/gpu.sharing-strategy"] = "mps"
    if spec["mig"] == "single" and "A100" in product and spec["sharing"] is None:
        product, gpus = f"{product}-MIG-1g.5gb", gpus * 7
        labels |= {"nvidia.com/gpu.memory": "4864", "nvidia.com/gpu.count": str(gpus)}
    elif spec["mig"] not in (None, "single"):
        labels["nvidia.com/mig.config.state"] = spec["mig"]
    return gpu_node(
        f"n{i}", product, gpus, gpu_class=label, labels=labels, taints=[GPU_TAINT] if spec["taint"] else None
    )


REQUIREMENT = st.sampled_from(
    [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]},
        {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["a"]},
        {"key": "gpu.accelerator/class", "operator": "Exists"},
        {"key": "gpu.accelerator/class", "operator": "DoesNotExist"},
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4", "NVIDIA-L4"]},
        {"key": "nvidia.com/gpu.replicas", "operator": "Gt", "values": ["1"]},
    ]
)
TERM = st.one_of(
    st.lists(REQUIREMENT, min_size=1, max_size=2).map(lambda r: {"matchExpressions": r}),
    st.integers(0, 11).map(
        lambda i: {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [f"n{i}"]}]}
    ),
)
POD = st.fixed_dictionaries(
    {
        "class": st.sampled_from([None, "medium", "high", "medium,high"]),
        "device": st.sampled_from([None, None, "shared", "mig,gpu", "gpu,shared"]),
        "count": st.sampled_from([None, "1", "2"]),
        "selector": st.sampled_from([None, {"topology.kubernetes.io/zone": "b"}, {"gpu.accelerator/class": "medium"}]),
        "terms": st.one_of(st.none(), st.lists(TERM, min_size=1, max_size=3)),
        "tolerate": st.booleans(),
    }
)


def generated_pod(spec: dict[str, Any]) -> dict[str, Any]:
    annotations = {"gpupool.io/fallback": "true"}
    for key, name in (("class", "gpu-class"), ("device", "device"), ("count", "gpu-count")):
        if spec[key] is not None:
            annotations[f"gpupool.io/{name}"] = spec[key]
    obj = pod(
        annotations=annotations,
        node_selector=spec["selector"],
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}] if spec["tolerate"] else None,
    )
    if spec["terms"] is not None:
        obj["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": spec["terms"]}}
        }
    return obj


KUBECTL_CHECKS = {"left": 25}  # kubectl patch --local costs a process: check the first examples with it too


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=st.lists(NODE, min_size=1, max_size=12), spec=POD)
def test_a_patched_pod_reaches_exactly_the_pools_nodes_that_it_allows(
    fleet: list[dict[str, Any]], spec: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Random mixes of labelled, unlabelled and wrongly labelled nodes, shared replicas with and without
    the suffix, MIG instances and MIG layouts being changed, and Pods with and without their own
    nodeSelector and affinity terms: wherever the Pod is placed, the nodes it can be scheduled on (by
    Kubernetes' rules, after the patch as kube-apiserver's own JSON patch code applies it) are the chosen
    pool's nodes intersected with what the Pod itself required — never a node outside — the patched Pod
    is a valid Pod, and its patch on a second call is empty."""
    objects = [generated_node(i, node) for i, node in enumerate(fleet)]
    obj = generated_pod(spec)
    pol = policy()
    index = index_of(objects, pol)
    result = evaluate(obj, "ml", pol, index)
    if result.placement is None or not result.patch:
        return
    patched = apply(obj, result.patch)
    if KUBECTL_CHECKS["left"] > 0:
        KUBECTL_CHECKS["left"] -= 1
        assert kubectl_patch(obj, list(result.patch), tmp_path_factory.mktemp("kubectl")) == patched
    validate_pod(patched)
    offering = nodes_of(objects, result.placement.resource)
    members = {n.name for n in index.capacity.members(result.placement.pool)}
    assert scheduling.reachable(patched, offering) == members & scheduling.reachable(obj, offering), (
        f"{result.placement.pool}: {result.placement.constraint.text()}"
    )
    again = evaluate(patched, "ml", pol, index)
    assert again.patch == () and again.placement is not None and again.placement.pool == result.placement.pool


# --- Pods that bypass placement: every node any term reaches (issue 17, finding 5) ------------------------

BYPASS_POLICY = """
namespaces:
  students: {allowedClasses: [low, medium]}
  team-b: {}
"""


def daemonset_pod(namespace: str, terms: list[dict[str, Any]], controller: bool | None = True) -> dict[str, Any]:
    obj = pod("agent-x7", namespace, gpus=1, tolerations=[GPU_TOLERATION])
    owner: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent"}
    if controller is not None:
        owner["controller"] = controller
    obj["metadata"]["ownerReferences"] = [owner]
    obj["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    return obj


NAMES_RTX = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ws-rtx3060-01"]}]}
ASKS_H100 = {
    "matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]
}
NAMES_UNKNOWN = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["not-a-node"]}]}


def test_a_term_that_names_a_node_does_not_hide_another_that_asks_for_an_h100() -> None:
    """The scheduler ORs terms: a students DaemonSet Pod naming an RTX workstation in one term and asking
    for an H100 in another may run on the H100, so it is checked there and refused."""
    obj = daemonset_pod("students", [NAMES_RTX, ASKS_H100])
    result = evaluate(obj, "students", demo_policy(), shared_demo_index())
    assert (result.allowed, result.reason) == (False, "bound-node"), result.message
    assert "class high is not allowed in namespace students" in result.message
    alone = evaluate(daemonset_pod("students", [NAMES_RTX]), "students", demo_policy(), shared_demo_index())
    assert alone.allowed and alone.patch == ()


def test_an_unknown_node_is_no_exemption_from_the_namespaces_quota() -> None:
    """team-b's tutorial quota (`nvidia.com/gpu: 4`): a DaemonSet Pod naming a node gpupool does not know
    was "not checked" and skipped it. It is held to it now: asking one GPU past the quota is refused,
    and within it allowed with a note that the class could not be checked."""
    index = shared_demo_index()
    used = index.usage.requested("team-b", "nvidia.com/gpu")
    obj = daemonset_pod("team-b", [NAMES_UNKNOWN])
    obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(4 - used + 1)
    result = evaluate(obj, "team-b", demo_policy(), index)
    assert (result.allowed, result.reason) == (False, "quota"), result.message
    assert "exceeded quota compute-resources in namespace team-b" in result.message
    obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    within = evaluate(obj, "team-b", demo_policy(), index)
    assert within.allowed and within.patch == () and "class not checked" in within.warnings[0]


@pytest.mark.parametrize("controller", [False, None], ids=["controller-false", "no-controller-field"])
@pytest.mark.parametrize(
    "terms",
    [[ASKS_H100], [NAMES_RTX, ASKS_H100], [NAMES_UNKNOWN]],
    ids=["h100-term", "names-rtx-or-h100", "names-unknown-node"],
)
def test_a_daemonset_reference_that_is_not_the_controller_gets_placed_like_any_pod(
    controller: bool | None, terms: list[dict[str, Any]]
) -> None:
    """`controller: false` (or no controller field) is no DaemonSet's Pod: gpupool places it, so a term
    naming an RTX workstation (which got such a Pod allowed unchanged, its H100 term unseen) cannot take
    a students Pod to a high GPU. An H100 term alone, or an unknown node, was placed or refused before
    too and stays so."""
    obj = daemonset_pod("students", terms, controller=controller)
    result = evaluate(obj, "students", demo_policy(), shared_demo_index())
    assert not result.allowed or result.patch, result.message
    if result.allowed:
        assert result.placement is not None and result.placement.pool.gpu_class != "high"


# --- only Pods that could run hold capacity (issue 17, finding 9) -----------------------------------------


def a100_fleet() -> list[dict[str, Any]]:
    return [gpu_node(f"a100-{i}", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high") for i in range(2)]


@pytest.mark.parametrize(
    "impossible",
    [
        {"nodeSelector": {"topology.kubernetes.io/zone": "nowhere"}},
        {"cpu": "10000"},
        {"gpus": 16},
    ],
    ids=["nodeselector-no-node-has", "cpu-beyond-any-node", "more-gpus-than-any-node"],
)
def test_pods_that_can_never_be_scheduled_hold_no_gpus(impossible: dict[str, Any]) -> None:
    """13 Pods pinned to the A100 pool that no node can ever take (a label no node has, cpu: 10000, more
    GPUs than a node has) took its free count from 16 to 0 and kept it. Now they hold nothing: the
    pool stays free, and real A100 Pods are placed under onNoCapacity: deny."""
    pol = policy("defaults: {onNoCapacity: deny}\n")
    stuck = []
    for i in range(13):
        obj = pod(f"stuck-{i}", "ml", gpus=impossible.get("gpus", 1), annotations={"gpupool.io/pool": str(A100)},
                  node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "gpu.accelerator/class": "high",
                                 **impossible.get("nodeSelector", {})}, tolerations=[GPU_TOLERATION])  # fmt: skip
        if "cpu" in impossible:
            obj["spec"]["containers"][0]["resources"]["requests"] = {"cpu": impossible["cpu"]}
        stuck.append(obj)
    index = index_of([*a100_fleet(), *stuck], pol)
    (stats,) = [s for s in index.capacity.pool_stats() if s.pool == A100]
    assert (stats.gpus_free, stats.pending) == (16, 0)
    admitter = Admitter(pol, SnapshotInventory(index, "test"))
    placed = [admitter.admit(pod(f"real-{i}", "ml", annotations={"gpupool.io/gpu-class": "high"}), namespace="ml")
              for i in range(16)]  # fmt: skip
    assert all(r.allowed and r.placement is not None and r.placement.pool == A100 for r in placed)


DEDICATED = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "case",
    ["memory-beyond-any-node", "affinity-no-node-matches", "taint-not-tolerated", "taint-tolerated"],
)
def test_whether_a_pinned_pod_holds_follows_memory_affinity_and_taints(case: str) -> None:
    """The rest of what the scheduler asks of a node: a memory request over every node's allocatable
    (128Gi), a required node-affinity term no node matches, a NoSchedule taint the Pod does not
    tolerate. Such Pods hold nothing in the pool; tolerating the taint, the same Pod holds its 2 GPUs."""
    fleet = a100_fleet()
    tolerations = [GPU_TOLERATION]
    if case.startswith("taint"):
        for node in fleet:
            node["spec"]["taints"] = [DEDICATED]
        if case == "taint-tolerated":
            tolerations.append({**DEDICATED, "operator": "Equal"})
    pins = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "gpu.accelerator/class": "high"}
    placed = {"gpupool.io/pool": str(A100)}
    obj = pod("w", "ml", gpus=2, annotations=placed, tolerations=tolerations, node_selector=pins)
    if case == "memory-beyond-any-node":
        obj["spec"]["containers"][0]["resources"]["requests"] = {"memory": "200Gi"}
    elif case == "affinity-no-node-matches":
        term = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["nowhere"]}]}
        obj["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    index = index_of([*fleet, obj])
    (stats,) = [s for s in index.capacity.pool_stats() if s.pool == A100]
    held = 2 if case == "taint-tolerated" else 0
    assert (stats.gpus_free, stats.pending) == (16 - held, held)


def test_a_pod_that_becomes_schedulable_holds_again() -> None:
    """The same Pod holds as soon as a node that can take it joins, and stops when it goes."""
    obj = pod("w", "ml", gpus=2, annotations={"gpupool.io/pool": str(A100)}, tolerations=[GPU_TOLERATION],
              node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "zone": "z"})  # fmt: skip
    index = index_of([*a100_fleet(), obj])
    assert sum(s.pending for s in index.capacity.pool_stats()) == 0
    zoned = gpu_node("a100-z", "NVIDIA-A100-SXM4-40GB", 8, memory_mib=40960, gpu_class="high", labels={"zone": "z"})
    index.upsert_node(node_from_obj(zoned, index.policy.gpu_resources, index.policy.partition_prefixes))
    assert sum(s.pending for s in index.capacity.pool_stats()) == 2
    index.remove_node("a100-z")
    assert sum(s.pending for s in index.capacity.pool_stats()) == 0
