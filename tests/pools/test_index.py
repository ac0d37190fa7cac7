"""The pool index: a façade whose view depends only on the objects it holds, never on the order they came
in, and stays right through every change (the capacity index and the ledger kept in step)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import decision_view, fleet, gpu_node, index_of, pod, quota
from tests.pools.probes import POLICY, RES, T4, T4_SELECTOR, feed, free_per_node, stats
from webhook.domain.policy import Defaults, load_policy, load_policy_text
from webhook.pools import capacity as capacity_module
from webhook.pools import pool as pool_module
from webhook.pools.index import ADMISSION_ONLY_DEFAULTS, Group, Pool, PoolIndex, PoolStats, pooling
from webhook.pools.kubeobj import node_from_obj, pod_from_obj, quota_from_obj
from webhook.pools.reservations import Reservation


def test_the_index_names_the_records_its_callers_read() -> None:
    """Decisions, metrics and the inventory command import Group, Pool and PoolStats from the index."""
    assert (Group, Pool, PoolStats) == (pool_module.Group, pool_module.Pool, capacity_module.PoolStats)


def test_pod_seen_before_its_node_is_counted_when_the_node_arrives() -> None:
    """Watch events arrive in any order; usage is kept per node name."""
    index = PoolIndex(POLICY)
    index.upsert_pod(pod_from_obj(pod("a", gpus=3, node="t4-a", phase="Running"), RES))
    index.upsert_node(node_from_obj(gpu_node("t4-a"), RES))
    assert free_per_node(index, T4) == {"t4-a": 1}


def test_quotas_are_kept_per_namespace() -> None:
    """Quotas are looked up by namespace and replaced or removed by name."""
    index = index_of(
        [*fleet(), quota("gpu", "team", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "1"})]
    )
    assert [q.name for q in index.quotas.of("team")] == ["gpu"]
    index.upsert_quota(quota_from_obj(quota("gpu", "team", {"requests.nvidia.com/gpu": "8"}), RES))
    assert index.quotas.of("team")[0].hard == {"requests.nvidia.com/gpu": 8}
    index.upsert_quota(None, "team", "gpu")
    assert index.quotas.of("team") == []


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
    for pool in index.capacity.pools():
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
            index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=arg), now=0.0)
        _check_free_gpus(index, nodes, pods)
    index.expire(now=10**9)
    final = [*nodes.values(), *pods.values()]
    shuffled = data.draw(st.permutations(final))
    for order in (final, final[::-1], shuffled):
        assert view(index) == view(feed(PoolIndex(POLICY), order))


def _apply_batch(index: PoolIndex, kind: str, args: list[Any]) -> None:
    """One page's worth of changes of one kind, as the live inventory applies a list page."""
    if kind == "node":
        index.upsert_nodes(node_from_obj(arg, RES) for arg in args)
    elif kind == "del-node":
        index.remove_nodes(args)
    elif kind in ("pod", "del-pod"):
        index.upsert_pods(
            [((a["metadata"]["namespace"], a["metadata"]["name"]), pod_from_obj(a, RES)) for a in args]
            if kind == "pod"
            else [(key, None) for key in args]
        )
    else:
        for gpus in args:
            index.reserve(Reservation(namespace="ml", pool=T4, selector=T4_SELECTOR, gpus=gpus), now=0.0)


@settings(max_examples=300, deadline=None)
@given(ops_st, st.data())
def test_a_batch_of_changes_is_the_same_as_its_changes_one_by_one(
    ops: list[tuple[str, Any]], data: st.DataObject
) -> None:
    """Nodes and Pods applied a batch at a time (`upsert_nodes`, `remove_nodes`, `upsert_pods`: a page
    of a list, settled once) leave what decisions read as applying them one by one does, after every
    batch, and the free GPUs right."""
    cuts = data.draw(st.lists(st.booleans(), min_size=len(ops), max_size=len(ops)))
    batched, single = PoolIndex(POLICY), PoolIndex(POLICY)
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[Any, dict[str, Any]] = {}
    batch: list[Any] = []
    for i, (kind, arg) in enumerate(ops):
        if kind == "node":
            nodes[arg["metadata"]["name"]] = arg
        elif kind == "pod":
            pods[(arg["metadata"]["namespace"], arg["metadata"]["name"])] = arg
        elif kind == "del-node":
            nodes.pop(arg, None)
        elif kind == "del-pod":
            pods.pop(arg, None)
        _apply_batch(single, kind, [arg])
        batch.append(arg)
        if i == len(ops) - 1 or cuts[i] or ops[i + 1][0] != kind:
            _apply_batch(batched, kind, batch)
            batch = []
            _check_free_gpus(batched, nodes, pods)
            assert view(batched) == view(single)


def test_a_pod_that_holds_nothing_changes_nothing() -> None:
    """A GPU-less Pod (None) the index never held, the bulk of every list page, leaves the view as it was;
    one it held is taken out."""
    index = index_of([*fleet(), pod("a", gpus=1, node="t4-a", phase="Running")])
    before = view(index)
    index.upsert_pods([(("ml", f"cpu-{i}"), None) for i in range(100)])
    assert view(index) == before
    index.upsert_pods([(("ml", "a"), None)])
    assert ("ml", "a") not in index.usage.pod_keys()


# --- the view does not depend on the order objects arrive in (issue 12) ---------------------------------


def test_pinned_pod_seen_before_its_pools_nodes_holds_gpus_once_they_arrive() -> None:
    """A Pending Pod pinned to T4 listed before the nodes holds its GPUs on them once they arrive: the
    pool shows the same free GPUs as when the nodes came first (issue 12: 4 free instead of 3)."""
    nodes = [gpu_node("t4-a"), gpu_node("t4-b")]
    pods = [
        pod("run", gpus=4, node="t4-a", phase="Running"),
        pod("wait", annotations={"gpupool.io/pool": str(T4)}, gpus=1, node_selector=dict(T4_SELECTOR)),
    ]
    nodes_first = feed(PoolIndex(POLICY), [*nodes, *pods])
    pods_first = feed(PoolIndex(POLICY), [*pods, *nodes])
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
        index = feed(PoolIndex(POLICY), order)
        (group,) = next(p for p in index.capacity.pools() if p.key == T4).groups.values()
        assert (group.max_free(), group.free_total) == (4, 4)


def test_pod_bound_to_a_node_not_yet_seen_counts_once_the_node_arrives() -> None:
    """A bound Pod listed before its node takes the node's GPUs and its class when the node comes."""
    index = PoolIndex(POLICY)
    index.upsert_pod(pod_from_obj(pod("a", gpus=3, node="t4-a", phase="Running"), RES))
    assert index.usage.class_used("ml", "medium") == 0  # no node, no class yet
    index.upsert_node(node_from_obj(gpu_node("t4-a"), RES))
    assert (stats(index, T4).gpus_free, index.usage.class_used("ml", "medium")) == (1, 3)


def another(value: Any) -> Any:
    """A value of the same type that differs from `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    return (*value, "x") if isinstance(value, tuple) else f"{value}x"


class TestPooling:
    """`pooling`: which policy changes keep an index (webhook.serving.policyfile switches without reading
    the cluster again) and which need one built anew."""

    @pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Defaults)])
    def test_only_the_defaults_admission_reads_keep_the_index(self, name: str) -> None:
        """Changing a default admission alone reads keeps the pooling; changing any other default,
        including one added later and not yet listed, changes it, so the index is rebuilt: exact unless
        known to be safe."""
        base = load_policy(None)
        changed = dataclasses.replace(
            base, defaults=dataclasses.replace(base.defaults, **{name: another(getattr(base.defaults, name))})
        )
        assert (pooling(changed) == pooling(base)) is (name in ADMISSION_ONLY_DEFAULTS)

    def test_namespace_rules_keep_the_index_and_the_product_table_does_not(self) -> None:
        base = load_policy_text("namespaces: {ml: {allowedClasses: [medium]}}")
        assert pooling(
            load_policy_text("namespaces: {ml: {allowedClasses: [high], classQuota: {high: 2}}}")
        ) == pooling(base)
        assert pooling(load_policy_text("defaultVendor: amd")) == pooling(base)
        assert pooling(load_policy_text("products: [{match: T4, class: high}]")) != pooling(base)
        assert pooling(load_policy_text("classLabel: example.com/class")) != pooling(base)


def test_what_a_namespace_holds_moves_only_when_a_pod_s_claim_does() -> None:
    """The queue's parked answers read a namespace's usage by `namespace_changes`: a Pod queued behind
    gpupool's gate (it holds nothing) arriving, a running Pod's status update and a queued Pod's update
    leave it as it was; a Pod that starts holding GPUs, or stops, moves it."""
    index = index_of([gpu_node("t4-a", "Tesla-T4", 4)], load_policy_text("namespaces:\n  q: {placement: queue}\n"))
    seen = index.namespace_changes("q")
    queued = pod("waits", "q", gpus=1)
    queued["spec"]["schedulingGates"] = [{"name": "gpupool.io/queue"}]
    feed(index, [queued])
    running = pod("runs", "q", gpus=1, node="t4-a", phase="Running")
    assert index.namespace_changes("q") == seen
    feed(index, [running])
    assert index.namespace_changes("q") == seen + 1
    feed(index, [running, queued])  # the same again: a status update, a label on the waiting Pod
    assert index.namespace_changes("q") == seen + 1
    index.remove_pod(("q", "runs"))
    assert index.namespace_changes("q") == seen + 2
