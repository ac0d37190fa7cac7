"""The pool index: free GPUs per node, kept right through every change, and burst-safe reservations."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import GPU_TAINT, decision_view, fleet, gpu_node, index_of, pod, policy, quota
from webhook.admission.core import evaluate
from webhook.domain.model import PoolKey
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj, quota_from_obj

POLICY = policy()
RES = POLICY.gpu_resources
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
T4_SELECTOR = (("gpu.accelerator/class", "medium"), ("nvidia.com/gpu.product", "Tesla-T4"))


def stats(index: PoolIndex, key: PoolKey):  # type: ignore[no-untyped-def]
    return next(s for s in index.pool_stats() if s.pool == key)


def free_per_node(index: PoolIndex, key: PoolKey) -> dict[str, int]:
    """Each usable node's own free GPUs: allocatable minus the Pods bound to it."""
    pool = next(p for p in index.pools() if p.key == key)
    return {n: f for g in pool.groups.values() for n, f in g.own_free.items()}


def free_counts(index: PoolIndex, key: PoolKey) -> Counter[int]:
    """How many usable nodes of the pool have each number of free GPUs once its holds are placed."""
    pool = next(p for p in index.pools() if p.key == key)
    return sum((Counter(g.buckets) for g in pool.groups.values()), Counter())


def free(index: PoolIndex, key: PoolKey) -> int:
    return stats(index, key).gpus_free


def test_free_gpus_are_allocatable_minus_running_pods() -> None:
    """Pods on a node take its GPUs; finished Pods and Pods elsewhere do not."""
    index = index_of(
        [
            *fleet(),
            pod("a", gpus=3, node="t4-a", phase="Running"),
            pod("b", gpus=1, node="t4-a", phase="Succeeded"),
            pod("c", gpus=1, node="t4-b", phase="Failed"),
        ]
    )
    assert free_per_node(index, T4) == {"t4-a": 1, "t4-b": 4}
    s = stats(index, T4)
    assert (s.gpus_total, s.gpus_allocated, s.gpus_free, s.nodes, s.usable_nodes) == (8, 3, 5, 2, 2)


def test_pod_finishing_frees_its_gpus() -> None:
    """A Running Pod turning Succeeded gives its GPUs back; deleting it does too."""
    index = index_of(fleet())
    index.upsert_pod(pod_from_obj(pod("a", gpus=4, node="t4-a", phase="Running"), RES))
    assert free_per_node(index, T4)["t4-a"] == 0
    index.upsert_pod(pod_from_obj(pod("a", gpus=4, node="t4-a", phase="Succeeded"), RES))
    assert free_per_node(index, T4)["t4-a"] == 4
    index.upsert_pod(pod_from_obj(pod("a", gpus=4, node="t4-a", phase="Running"), RES))
    index.remove_pod(("ml", "a"))
    assert free_per_node(index, T4)["t4-a"] == 4


def test_pod_seen_before_its_node_is_counted_when_the_node_arrives() -> None:
    """Watch events arrive in any order; usage is kept per node name."""
    index = PoolIndex(POLICY)
    index.upsert_pod(pod_from_obj(pod("a", gpus=3, node="t4-a", phase="Running"), RES))
    index.upsert_node(node_from_obj(gpu_node("t4-a"), RES))
    assert free_per_node(index, T4) == {"t4-a": 1}


def test_cordon_uncordon_and_removal_change_the_pool() -> None:
    """A cordoned node stops offering GPUs, comes back when uncordoned, and removal drops it."""
    index = index_of(fleet())
    index.upsert_node(node_from_obj(gpu_node("t4-a", unschedulable=True), RES))
    assert "t4-a" not in free_per_node(index, T4)
    assert (stats(index, T4).nodes, stats(index, T4).usable_nodes) == (2, 1)
    index.upsert_node(node_from_obj(gpu_node("t4-a"), RES))
    assert free_per_node(index, T4)["t4-a"] == 4
    index.remove_node("t4-a")
    index.remove_node("t4-b")
    assert T4 not in {s.pool for s in index.pool_stats()}


def test_relabelled_node_moves_pool_keeping_its_usage() -> None:
    """A node relabelled to another class moves with the Pods running on it."""
    index = index_of([*fleet(), pod("a", gpus=2, node="t4-a", phase="Running")])
    index.upsert_node(node_from_obj(gpu_node("t4-a", gpu_class="low"), RES))
    assert free_per_node(index, PoolKey("nvidia", "low", "Tesla-T4")) == {"t4-a": 2}
    assert free_per_node(index, T4) == {"t4-b": 4}


def test_nodes_are_grouped_by_selector_and_taints() -> None:
    """Nodes the scheduler can tell apart (other labels or taints) are separate groups of one pool."""
    index = index_of(
        [
            gpu_node("a", gpu_class=None),
            gpu_node("b"),
            gpu_node("c", taints=[GPU_TAINT]),
        ]
    )
    pool = next(index.pools())
    assert len(pool.groups) == 3
    assert len(pool.by_selector()) == 2


def test_pending_pinned_pod_is_placed_virtually_on_best_fit_node() -> None:
    """A Pending Pod pinned by gpupool holds GPUs on the fullest node that still fits it."""
    index = index_of([*fleet(), pod("run", gpus=2, node="t4-a", phase="Running")])
    waiting = pod("w", annotations={"gpupool.io/pool": str(T4)}, gpus=2, node_selector=dict(T4_SELECTOR))
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_counts(index, T4) == {0: 1, 4: 1}
    assert stats(index, T4).pending == 2
    assert index.class_used("ml", "medium") == 4  # the running Pod's 2 on a medium node, and these 2
    # Scheduled: the virtual hold is replaced by the real one on the chosen node.
    waiting["spec"]["nodeName"] = "t4-b"
    index.upsert_pod(pod_from_obj(waiting, RES))
    assert free_per_node(index, T4) == {"t4-a": 2, "t4-b": 2}
    assert free_counts(index, T4) == {2: 2}
    assert stats(index, T4).pending == 0
    assert index.class_used("ml", "medium") == 4


def test_reservations_hold_capacity_until_the_pod_shows_up_or_expires() -> None:
    """An admitted Pod counts against its pool until the watch shows it, then only once."""
    index = index_of(fleet())
    for _ in range(8):
        index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0)
    assert free(index, T4) == 0
    assert index.reserved("ml", "nvidia.com/gpu") == 8
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node="t4-a", phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert (index.reservations, free(index, T4)) == (7, 0)
    index.upsert_pod(pod_from_obj(seen, RES))  # the same Pod again settles nothing more
    assert index.reservations == 7
    assert index.expire(now=POLICY.defaults.reservation_seconds + 1) == 7
    assert free(index, T4) == 7
    assert index.reserved("ml", "nvidia.com/gpu") == 0
    assert index.class_used("ml", "medium") == 1


@pytest.mark.parametrize("landed_on", ["t4-a", "t4-b"])
def test_pod_landing_where_holds_were_guessed_moves_the_holds(landed_on: str) -> None:
    """Virtual holds are guesses: when a Pod really lands on a node they filled, they move elsewhere,
    so the pool's free count stays exact whichever node the scheduler picked."""
    index = index_of(fleet())
    for _ in range(7):
        index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0)
    seen = pod("p1", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node=landed_on, phase="Running")
    index.upsert_pod(pod_from_obj(seen, RES))
    assert index.reservations == 6
    assert free(index, T4) == 1
    assert stats(index, T4).pending == 6


def test_reservation_is_settled_only_by_a_matching_pod() -> None:
    """Another namespace, pool or size does not settle a reservation."""
    index = index_of(fleet())
    index.reserve("ml", T4, T4_SELECTOR, 2, now=0.0)
    for other in (
        pod("x", namespace="other", annotations={"gpupool.io/pool": str(T4)}, gpus=2),
        pod("y", annotations={"gpupool.io/pool": "nvidia/medium/NVIDIA-L4"}, gpus=2),
        pod("z", annotations={"gpupool.io/pool": str(T4)}, gpus=1),
    ):
        index.upsert_pod(pod_from_obj(other, RES))
    assert index.reservations == 1


def test_a_reservation_is_settled_by_its_pods_name_or_generate_name() -> None:
    """A reservation that knows its Pod is taken over by that Pod when the watch shows it (a Pod made
    from a generateName by any Pod with that generateName, oldest reservation first), whatever the Pod
    carries: a Pod that named its node has no pool annotation at all."""
    index = index_of(fleet())
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, name="infer")
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, generate_name="train-")
    index.reserve("ml", T4, T4_SELECTOR, 2, now=0.0, name="bound", node="t4-b")
    assert free_per_node(index, T4)["t4-b"] == 2  # held on the node it names, not in the pool
    index.upsert_pod(pod_from_obj(pod("someone-else", gpus=1, node="t4-a", phase="Running"), RES))
    assert index.reservations == 3
    made = pod("train-x7k2p", gpus=1, node="t4-a", phase="Running")
    made["metadata"]["generateName"] = "train-"
    for shown in (pod("infer", gpus=1, node="t4-a", phase="Running"), made, pod("bound", gpus=2, node="t4-b")):
        before = index.reservations
        index.upsert_pod(pod_from_obj(shown, RES))
        assert index.reservations == before - 1, shown["metadata"]["name"]


def test_a_reinvocation_takes_back_only_its_own_unmatched_reservation() -> None:
    """take_echo finds the reservation of the same Pod, pool (or node) and GPUs, once: a second call, or
    another pool or size, finds none."""
    index = index_of(fleet())
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, name="infer")
    l4 = PoolKey("nvidia", "medium", "NVIDIA-L4")
    assert not index.take_echo("ml", "infer", "", pool=l4, node="", gpus=1)
    assert not index.take_echo("ml", "infer", "", pool=T4, node="", gpus=2)
    assert not index.take_echo("ml", "other", "", pool=T4, node="", gpus=1)
    assert index.take_echo("ml", "infer", "", pool=T4, node="", gpus=1)
    assert index.reservations == 0
    index.reserve("ml", T4, T4_SELECTOR, 1, now=0.0, name="infer", echoed=True)
    assert not index.take_echo("ml", "infer", "", pool=T4, node="", gpus=1)


def test_quotas_are_kept_per_namespace() -> None:
    """Quotas are looked up by namespace and replaced or removed by name."""
    index = index_of(
        [*fleet(), quota("gpu", "team", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "1"})]
    )
    assert [q.name for q in index.quotas("team")] == ["gpu"]
    index.upsert_quota(quota_from_obj(quota("gpu", "team", {"requests.nvidia.com/gpu": "8"}), RES))
    assert index.quotas("team")[0].hard == {"requests.nvidia.com/gpu": 8}
    index.upsert_quota(None, "team", "gpu")
    assert index.quotas("team") == []


def test_pod_usage_beyond_allocatable_never_goes_negative() -> None:
    """Overcommitted nodes (stale views) show zero free, not negative."""
    index = index_of([*fleet(), pod("a", gpus=6, node="t4-a", phase="Running")])
    assert free_per_node(index, T4)["t4-a"] == 0


# --- the index kept incrementally equals the index built from the final objects -------------------------

NODE_NAMES = ("n1", "n2", "n3")
POD_KEYS = (("ml", "p1"), ("ml", "p2"), ("ml", "p3"), ("other", "p1"))
POOLS = (
    "nvidia/medium/Tesla-T4",
    "nvidia/medium/NVIDIA-L4",
    "nvidia/high/NVIDIA-A100-SXM4-40GB",
    "nvidia/high/bogus",
    "not-a-pool",
)
SELECTORS = (
    {"nvidia.com/gpu.product": "Tesla-T4"},
    None,
    dict(T4_SELECTOR),
    {"gpu.accelerator/class": "high"},
    {"nvidia.com/gpu.product": "NVIDIA-L4", "topology.kubernetes.io/zone": "a"},
)
nodes_st = st.builds(
    lambda name, product, gpus, ready, cordoned, label: gpu_node(
        name, product, gpus, ready=ready, unschedulable=cordoned, gpu_class=label
    ),
    st.sampled_from(NODE_NAMES),
    st.sampled_from(["Tesla-T4", "Tesla-T4", "NVIDIA-L4", "Tesla-T4-SHARED", "NVIDIA-A100-SXM4-40GB"]),
    st.sampled_from([4, 8, 2, 0, 3]),  # sampled, not integers(): hypothesis favours 0 too much here
    st.sampled_from([True, True, True, False]),  # mostly usable: that is where holds go
    st.sampled_from([False, False, False, True]),
    st.sampled_from([None, "medium", "medium", "high", "low"]),
)
pods_st = st.builds(
    lambda key, node, gpus, phase, pool, selector: pod(
        key[1],
        namespace=key[0],
        gpus=gpus,
        node=node,
        phase=phase,
        annotations={"gpupool.io/pool": pool} if pool else None,
        node_selector=selector,
    ),
    st.sampled_from(POD_KEYS),
    st.sampled_from([None, None, *NODE_NAMES]),
    st.sampled_from([1, 2, 3, 4, 0]),
    st.sampled_from(["Pending", "Running", "Running", "Succeeded", "Failed"]),
    st.sampled_from([POOLS[0], None, *POOLS]),
    st.sampled_from(SELECTORS),
)
ops_st = st.lists(
    st.one_of(  # adds weighted up, so that the final objects are many enough to interact
        st.tuples(st.just("node"), nodes_st),
        st.tuples(st.just("node"), nodes_st),
        st.tuples(st.just("pod"), pods_st),
        st.tuples(st.just("pod"), pods_st),
        st.tuples(st.just("pod"), pods_st),
        st.tuples(st.just("del-node"), st.sampled_from(NODE_NAMES)),
        st.tuples(st.just("del-pod"), st.sampled_from(POD_KEYS)),
        st.tuples(st.just("reserve"), st.integers(1, 3)),
    ),
    max_size=30,
)


def view(index: PoolIndex) -> dict[str, Any]:
    return decision_view(index, sorted({ns for ns, _ in POD_KEYS}))


def _check_free_gpus(index: PoolIndex, nodes: dict[str, dict[str, Any]], pods: dict[Any, dict[str, Any]]) -> None:
    """A node's own free GPUs are its allocatable minus its live Pods' requests; what a group has left
    once holds are placed never exceeds that, and the pool never hides more than it holds."""
    used: Counter[str] = Counter()
    for p in pods.values():
        if p["spec"].get("nodeName") and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            used[p["spec"]["nodeName"]] += int(
                p["spec"]["containers"][0].get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
            )
    for pool in index.pools():
        hidden = 0
        for group in pool.groups.values():
            for name, own in group.own_free.items():
                allocatable = int(nodes[name]["status"]["allocatable"]["nvidia.com/gpu"])
                assert own == max(allocatable - used[name], 0)
            assert sum(group.buckets.values()) == len(group.own_free)
            assert group.free_total == sum(f * n for f, n in group.buckets.items())
            hidden += sum(group.own_free.values()) - group.free_total
        assert 0 <= hidden <= pool.pending


@settings(max_examples=300, deadline=None)
@given(ops_st, st.data())
def test_incremental_index_matches_a_rebuild_in_any_order(ops: list[tuple[str, Any]], data: st.DataObject) -> None:
    """Any sequence of watch events (Pods before their nodes included) and reservations, once the
    reservations expire, leaves what decisions read equal to an index built from the final objects in
    any order: nodes first as the snapshot reads them, nodes last, or shuffled."""
    index = PoolIndex(POLICY)
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[Any, dict[str, Any]] = {}
    for kind, arg in ops:
        if kind == "node":
            nodes[arg["metadata"]["name"]] = arg
            index.upsert_node(node_from_obj(arg, RES))
        elif kind == "pod":
            key = (arg["metadata"]["namespace"], arg["metadata"]["name"])
            pods[key] = arg
            index.upsert_pod(pod_from_obj(arg, RES), key=key)
        elif kind == "del-node":
            nodes.pop(arg, None)
            index.remove_node(arg)
        elif kind == "del-pod":
            pods.pop(arg, None)
            index.remove_pod(arg)
        else:
            index.reserve("ml", T4, T4_SELECTOR, arg, now=0.0)
        _check_free_gpus(index, nodes, pods)
    index.expire(now=10**9)
    final = [*nodes.values(), *pods.values()]
    shuffled = data.draw(st.permutations(final))
    for order in (final, final[::-1], shuffled):
        assert view(index) == view(_feed(PoolIndex(POLICY), order))


# --- the view does not depend on the order objects arrive in (issue 12) ---------------------------------


def _feed(index: PoolIndex, objects: list[dict[str, Any]]) -> PoolIndex:
    """Apply objects one at a time in the order given, as watch events would."""
    for obj in objects:
        if obj["kind"] == "Node":
            index.upsert_node(node_from_obj(obj, RES))
        else:
            meta = obj["metadata"]
            index.upsert_pod(pod_from_obj(obj, RES), key=(meta["namespace"], meta["name"]))
    return index


def test_pinned_pod_seen_before_its_pools_nodes_holds_gpus_once_they_arrive() -> None:
    """A Pending Pod pinned to T4 listed before the nodes holds its GPUs on them once they arrive: the
    pool shows the same free GPUs as when the nodes came first (issue 12: 4 free instead of 3)."""
    nodes = [gpu_node("t4-a"), gpu_node("t4-b")]
    pods = [
        pod("run", gpus=4, node="t4-a", phase="Running"),
        pod("wait", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node_selector=dict(T4_SELECTOR)),
    ]
    nodes_first = _feed(PoolIndex(POLICY), [*nodes, *pods])
    pods_first = _feed(PoolIndex(POLICY), [*pods, *nodes])
    assert (stats(nodes_first, T4).gpus_free, stats(nodes_first, T4).pending) == (3, 1)
    assert view(pods_first) == view(nodes_first)


def test_holds_move_to_where_room_is_when_nodes_arrive_one_by_one() -> None:
    """Pending GPUs are packed onto the fullest node that fits them whatever order nodes come in, so a
    4-GPU Pod still finds a whole free node when there is one."""
    nodes = [gpu_node("t4-a"), gpu_node("t4-b")]
    pods = [
        pod("run", gpus=2, node="t4-b", phase="Running"),
        pod("wait", annotations={"gpupool.io/pool": str(T4)}, gpus=2, node_selector=dict(T4_SELECTOR)),
    ]
    for order in ([*nodes, *pods], [*pods, *nodes], [pods[1], nodes[0], pods[0], nodes[1]]):
        index = _feed(PoolIndex(POLICY), order)
        (group,) = next(p for p in index.pools() if p.key == T4).groups.values()
        assert (group.max_free(), group.free_total) == (4, 4)


def test_reservation_on_a_full_pool_holds_gpus_on_a_node_that_joins() -> None:
    """An admission reserved while its pool was full is placed when the pool gains a node (or a node
    frees up): the new capacity is not offered twice."""
    index = index_of([*fleet(), pod("a", gpus=4, node="t4-a", phase="Running"), pod("b", gpus=4, node="t4-b")])
    index.reserve("ml", T4, T4_SELECTOR, 3, now=0.0)
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (0, 3)
    index.upsert_node(node_from_obj(gpu_node("t4-c"), RES))
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (1, 3)
    index.remove_node("t4-c")
    index.remove_pod(("ml", "b"))
    assert (stats(index, T4).gpus_free, stats(index, T4).pending) == (1, 3)


def test_pod_bound_to_a_node_not_yet_seen_counts_once_the_node_arrives() -> None:
    """A bound Pod listed before its node takes the node's GPUs and its class when the node comes."""
    index = PoolIndex(POLICY)
    index.upsert_pod(pod_from_obj(pod("a", gpus=3, node="t4-a", phase="Running"), RES))
    assert index.class_used("ml", "medium") == 0  # no node, no class yet
    index.upsert_node(node_from_obj(gpu_node("t4-a"), RES))
    assert (stats(index, T4).gpus_free, index.class_used("ml", "medium")) == (1, 3)


# --- class usage is counted from where the GPUs are (issue 13) ------------------------------------------

A100 = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
A100_SELECTOR = (("gpu.accelerator/class", "high"), ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"))
TRAIN = policy("namespaces: {train: {classQuota: {high: 20}}}")


def a100(name: str, gpu_class: str = "high") -> dict[str, Any]:
    return gpu_node(name, "NVIDIA-A100-SXM4-40GB", 8, gpu_class=gpu_class, taints=[GPU_TAINT])


def train_cluster() -> list[dict[str, Any]]:
    """16 high-class GPUs in use in `train` by Pods placed before gpupool was installed (no annotation)."""
    return [
        a100("a100-a"),
        a100("a100-b"),
        a100("a100-c"),
        pod("old-1", namespace="train", gpus=8, node="a100-a", phase="Running"),
        pod("old-2", namespace="train", gpus=8, node="a100-b", phase="Running"),
    ]


def test_bound_pods_count_against_their_nodes_class_without_the_annotation() -> None:
    """Pods on high-class nodes count 16 high GPUs for `train`, whatever their annotations say."""
    assert index_of(train_cluster(), TRAIN).class_used("train", "high") == 16


def test_class_quota_denies_a_pod_beyond_the_gpus_already_on_the_nodes() -> None:
    """`train` may hold 20 high GPUs and holds 16 on the nodes: a Pod asking for 8 more is denied naming
    the class quota, although a whole A100 node is free."""
    index = index_of(train_cluster(), TRAIN)
    ask = pod("more", namespace="train", annotations={"gpupool.io/gpu-class": "high", "gpupool.io/gpu-count": "8"})
    answer = evaluate(ask, "train", TRAIN, index)
    assert not answer.allowed
    assert answer.message == "class quota high in namespace train exceeded: used 16 + requested 8 > hard 20"
    four = pod("four", namespace="train", annotations={"gpupool.io/gpu-class": "high", "gpupool.io/gpu-count": "4"})
    assert evaluate(four, "train", TRAIN, index).allowed


def test_removing_the_pool_annotation_changes_no_usage() -> None:
    """A placed Pod whose gpupool.io/pool annotation is removed still counts the same, bound or not."""
    placed = {"gpupool.io/pool": str(A100)}
    bound = pod("b", namespace="train", gpus=8, node="a100-a", phase="Running", annotations=placed)
    waiting = pod("w", namespace="train", gpus=4, annotations=placed, node_selector=dict(A100_SELECTOR))
    index = index_of([a100("a100-a"), a100("a100-b"), bound, waiting], TRAIN)
    before = (index.class_used("train", "high"), stats(index, A100).pending, stats(index, A100).gpus_free)
    assert before == (12, 4, 4)
    for obj in (bound, waiting):
        del obj["metadata"]["annotations"]
        index.upsert_pod(pod_from_obj(obj, RES))
    assert (index.class_used("train", "high"), stats(index, A100).pending, stats(index, A100).gpus_free) == before


def test_relabelled_node_moves_the_class_usage_of_its_pods() -> None:
    """A node relabelled from high to medium takes its Pods' GPUs to medium, and back."""
    index = index_of(train_cluster(), TRAIN)
    index.upsert_node(node_from_obj(a100("a100-a", gpu_class="medium"), RES))
    assert (index.class_used("train", "high"), index.class_used("train", "medium")) == (8, 8)
    index.upsert_node(node_from_obj(a100("a100-a"), RES))
    assert (index.class_used("train", "high"), index.class_used("train", "medium")) == (16, 0)
    index.remove_node("a100-b")
    assert index.class_used("train", "high") == 8


def test_pod_list_before_node_list_gives_the_same_usage() -> None:
    """Usage does not depend on whether Pods or nodes were listed first."""
    objects = train_cluster()
    nodes_first = _feed(PoolIndex(TRAIN), objects)
    pods_first = _feed(PoolIndex(TRAIN), objects[::-1])
    assert pods_first.class_used("train", "high") == nodes_first.class_used("train", "high") == 16
    assert decision_view(pods_first, ["train"]) == decision_view(nodes_first, ["train"])


@pytest.mark.parametrize(
    ("annotation", "selector", "expected"),
    [
        # The nodeSelector gpupool wrote reaches one pool: that pool, whatever the annotation says.
        (None, dict(A100_SELECTOR), {"high": 4, "pending": 4}),
        (str(T4), {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, {"high": 4, "pending": 4}),
        # No nodeSelector on pool labels reaches several pools: the annotation's pool.
        (str(A100), None, {"high": 4, "pending": 4}),
        # The nodeSelector contradicts the annotation: the class of the pools it reaches (T4 and L4).
        (str(A100), {"gpu.accelerator/class": "medium"}, {"medium": 4}),
        # It contradicts the annotation and reaches no pool: not counted until bound.
        (str(A100), {"gpu.accelerator/class": "low", "nvidia.com/gpu.product": "Tesla-T4"}, {}),
        # The reachable pools share one class: that class, but no pool to hold GPUs in.
        (None, {"gpu.accelerator/class": "high"}, {"high": 4}),
        # Nothing says where it goes, and the pools it could go to differ in class.
        (None, None, {}),
    ],
)
def test_unbound_pod_counts_against_the_pool_it_is_pinned_to(
    annotation: str | None, selector: dict[str, str] | None, expected: dict[str, int]
) -> None:
    """An unbound Pod counts where its nodeSelector, else its gpupool.io/pool annotation, pins it."""
    h100 = gpu_node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, gpu_class="high", taints=[GPU_TAINT])
    index = index_of([*fleet(), h100, a100("a100-b")], TRAIN)
    waiting = pod(
        "w",
        namespace="train",
        gpus=4,
        annotations={"gpupool.io/pool": annotation} if annotation else None,
        node_selector=selector,
    )
    index.upsert_pod(pod_from_obj(waiting, RES))
    counted = {c: index.class_used("train", c) for c in POLICY.classes}
    counted["pending"] = sum(s.pending for s in index.pool_stats())
    assert {k: v for k, v in counted.items() if v} == expected
