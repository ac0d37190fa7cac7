"""The live inventory against the API simulator, through the real `kubernetes` client.

Issue 4's outcomes: changes to nodes and Pods reach decisions, 410 re-lists lose nothing, an API outage
keeps admissions answered from the last view and is flagged, quotas deny, and a burst of admissions
never oversubscribes a pool.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.builders import GPU_TAINT, decision_view, eventually, gpu_node, pod, policy, quota
from webhook.admission.core import Admitter
from webhook.domain.model import POOL_ANNOTATION, PoolKey
from webhook.domain.policy import Policy
from webhook.pools.index import PoolIndex
from webhook.pools.kubeobj import node_from_obj, pod_from_obj, quota_from_obj
from webhook.sources.live import InventoryConnectError, LiveInventory, context_namespace
from webhook.sources.reflector import ReflectorConfig
from webhook.sources.snapshot import build_index, parse_objects
from webhook.testing.kubesim import KubeSim
from webhook.testing.synthetic import iter_synthetic_cluster

pytestmark = pytest.mark.slow

FAST = ReflectorConfig(
    page_size=7,
    connect_timeout=1,
    list_timeout=3,
    watch_seconds=5,
    watch_read_timeout=3,
    backoff_initial=0.05,
    backoff_max=0.3,
)
T4 = PoolKey("nvidia", "medium", "Tesla-T4")
A100 = PoolKey("nvidia", "high", "NVIDIA-A100-SXM4-40GB")
POLICY = policy("defaults: {staleAfterSeconds: 1}\nnamespaces: {team-a: {classQuota: {high: 2}}}")


def cluster() -> list[dict[str, Any]]:
    return [
        gpu_node("t4-a", "Tesla-T4", 4),
        gpu_node("t4-b", "Tesla-T4", 4),
        gpu_node("t4-c", "Tesla-T4", 4),
        gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, gpu_class="high", taints=[GPU_TAINT]),
        pod("busy", gpus=2, node="t4-a", phase="Running"),
        *(pod(f"cpu-{i}", node="t4-b", phase="Running") for i in range(20)),
        quota("gpu-quota", "team-b", {"requests.nvidia.com/gpu": "2"}, {"requests.nvidia.com/gpu": "1"}),
    ]


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with KubeSim(bookmark_interval=0.2) as s:
        s.load(cluster())
        yield s
        assert s.handler_errors == []


@pytest.fixture
def live(sim: KubeSim, tmp_path: Path) -> Iterator[LiveInventory]:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    inventory = LiveInventory.connect(POLICY, str(kubeconfig), FAST).start()
    assert inventory.wait_ready(20)
    sim.wait_for_watches(3)
    yield inventory
    inventory.close()


def free(inventory: LiveInventory, key: PoolKey = T4) -> int:
    with inventory.read() as index:
        return next((s.gpus_free for s in index.capacity.pool_stats() if s.pool == key), -1)


def stats(inventory: LiveInventory) -> list[Any]:
    with inventory.read() as index:
        return [
            (s.pool, s.nodes, s.usable_nodes, s.gpus_total, s.gpus_allocated, s.gpus_free, s.pending)
            for s in index.capacity.pool_stats()
        ]


def same_as_snapshot(inventory: LiveInventory, objects: list[dict[str, Any]], pol: Policy = POLICY) -> bool:
    index = build_index(objects, pol)
    expected = [
        (s.pool, s.nodes, s.usable_nodes, s.gpus_total, s.gpus_allocated, s.gpus_free, s.pending)
        for s in index.capacity.pool_stats()
    ]
    return stats(inventory) == expected


def test_first_sync_equals_the_snapshot_of_the_same_objects(live: LiveInventory, sim: KubeSim) -> None:
    """Paginated list (page size 7) gives the same pools as reading the objects from a file, and is ready."""
    assert live.ready and live.age_seconds() == 0
    assert same_as_snapshot(live, cluster())
    assert sim.list_requests("pods") >= 3  # 21 Pods in pages of 7


def test_node_changes_reach_decisions(live: LiveInventory, sim: KubeSim) -> None:
    """Added, cordoned, tainted and removed nodes change the free GPUs the decision sees."""
    assert free(live) == 10
    sim.add(gpu_node("t4-d", "Tesla-T4", 4))
    eventually(lambda: free(live) == 14, what="added node")
    sim.modify(gpu_node("t4-d", "Tesla-T4", 4, unschedulable=True))
    eventually(lambda: free(live) == 10, what="cordoned node")
    for name in ("t4-b", "t4-c"):
        sim.modify(gpu_node(name, "Tesla-T4", 4, taints=[{"key": "maintenance", "effect": "NoSchedule"}]))
    admitter = Admitter(POLICY, live)
    big = pod("big", annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": "4"})
    eventually(lambda: admitter.admit(big, namespace="ml", dry_run=True).warnings != (), what="tainted nodes")
    sim.delete("Node", None, "t4-c")
    eventually(lambda: free(live) == 6, what="removed node")


def test_pod_finishing_frees_its_gpus(live: LiveInventory, sim: KubeSim) -> None:
    """A Pod that turns Succeeded, or is deleted, gives its GPUs back."""
    sim.add(pod("job", gpus=4, node="t4-c", phase="Running"))
    eventually(lambda: free(live) == 6)
    sim.modify(pod("job", gpus=4, node="t4-c", phase="Succeeded"))
    eventually(lambda: free(live) == 10)
    sim.delete("Pod", "ml", "busy")
    eventually(lambda: free(live) == 12)


def test_410_relists_and_loses_nothing(live: LiveInventory, sim: KubeSim) -> None:
    """History compacted while watches were cut: the re-list picks up every change, deletions included."""
    objects = cluster()
    sim.set_down(True)
    eventually(lambda: live.age_seconds() > 0, what="outage noticed")
    sim.delete("Pod", "ml", "busy")
    sim.add(gpu_node("t4-d", "Tesla-T4", 4))
    sim.add(pod("new", gpus=3, node="t4-d", phase="Running"))
    sim.compact()
    sim.set_down(False)
    objects = [o for o in objects if o["metadata"]["name"] != "busy"]
    objects += [gpu_node("t4-d", "Tesla-T4", 4), pod("new", gpus=3, node="t4-d", phase="Running")]
    eventually(lambda: same_as_snapshot(live, objects), what="re-synced state")
    assert live.reflectors["pods"].relists >= 2


def test_outage_keeps_answering_from_last_view_and_recovers(live: LiveInventory, sim: KubeSim) -> None:
    """API down: answers continue with a stale warning once past the threshold, readiness stays; recovery re-syncs."""
    admitter = Admitter(POLICY, live)
    medium = pod("p", annotations={"gpupool.io/gpu-class": "medium"})
    assert admitter.admit(medium, namespace="ml", dry_run=True).warnings == ()
    sim.set_down(True)
    eventually(lambda: live.age_seconds() > POLICY.defaults.stale_after_seconds, what="stale")
    answer = admitter.admit(medium, namespace="ml", dry_run=True)
    assert answer.allowed and answer.placement is not None and answer.placement.pool == T4
    assert any("stale" in w for w in answer.warnings)
    assert live.ready  # readiness is about the first sync; staleness is flagged, not hidden
    sim.add(gpu_node("t4-d", "Tesla-T4", 4))
    sim.set_down(False)
    eventually(lambda: live.age_seconds() == 0 and free(live) == 14, what="recovery")
    assert admitter.admit(medium, namespace="ml", dry_run=True).warnings == ()


def test_the_pod_view_is_current_since_the_watch_last_reconnected(live: LiveInventory, sim: KubeSim) -> None:
    """current_since (what lets a reservation whose Pod never shows go early) is set while the Pod
    watch is up, None while the API is down, and later than the outage once it is back."""
    first = live.current_since()
    assert first is not None
    sim.set_down(True)
    eventually(lambda: live.current_since() is None, what="the watch noticing the outage")
    sim.set_down(False)
    eventually(lambda: (live.current_since() or 0.0) > first, what="the watch back")


def test_stale_inventory_denies_when_policy_says_so(live: LiveInventory, sim: KubeSim) -> None:
    """onStale: deny refuses GPU Pods while the view is stale, with a 503 that says why."""
    strict = policy("defaults: {staleAfterSeconds: 1, onStale: deny}")
    admitter = Admitter(strict, live)
    sim.set_down(True)
    eventually(lambda: live.age_seconds() > 1, what="stale")
    answer = admitter.admit(pod("p", annotations={"gpupool.io/gpu-class": "medium"}), namespace="ml")
    assert (answer.allowed, answer.code) == (False, 503) and "stale" in answer.message
    sim.set_down(False)


def test_quota_and_class_quota_denials(live: LiveInventory, sim: KubeSim) -> None:
    """A ResourceQuota in the enforced form and a per-class quota from the policy both deny, naming the limit
    (and, for the class quota, the class the namespace may use that has room)."""
    admitter = Admitter(POLICY, live)
    two = pod("p", namespace="team-b", annotations={"gpupool.io/gpu-count": "2"})
    denied = admitter.admit(two, namespace="team-b")
    assert (
        not denied.allowed
        and "exceeded quota gpu-quota" in denied.message
        and "used 1 + requested 2 > hard 2" in denied.message
    )
    sim.add(
        pod("h", namespace="team-a", gpus=2, node="a100-a", phase="Running", annotations={"gpupool.io/pool": str(A100)})
    )
    high = pod("q", namespace="team-a", annotations={"gpupool.io/gpu-class": "high"})
    eventually(lambda: not admitter.admit(high, namespace="team-a", dry_run=True).allowed, what="class quota")
    assert admitter.admit(high, namespace="team-a").message == (
        "class quota high in namespace team-a exceeded: used 2 + requested 1 > hard 2. class medium fits 1 GPU and "
        "team-a allows it: set gpupool.io/gpu-class: medium"
    )


def test_burst_never_oversubscribes_a_pool(live: LiveInventory, sim: KubeSim) -> None:
    """16 concurrent admissions, 10 free T4 GPUs, fallback on: exactly 10 go to T4, the rest fall back;
    when the Pods show up in the watch their reservations end and nothing is counted twice."""
    admitter = Admitter(POLICY, live)
    results: list[Any] = []
    lock = threading.Lock()

    def admit(i: int) -> None:
        answer = admitter.admit(
            pod(f"w-{i}", annotations={"gpupool.io/gpu-class": "medium", "gpupool.io/fallback": "true"}), namespace="ml"
        )
        with lock:
            results.append(answer)

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pools = [r.placement.pool for r in results if r.placement is not None]
    assert pools.count(T4) == 10 and pools.count(A100) == 6
    assert free(live) == 0
    # The Pods are created and scheduled: reservations settle, and the real usage takes over.
    placed_t4 = ("t4-a", "t4-a", "t4-b", "t4-b", "t4-b", "t4-b", "t4-c", "t4-c", "t4-c", "t4-c")
    for i, node in enumerate(placed_t4):
        sim.add(pod(f"w-{i}", gpus=1, node=node, phase="Running", annotations={"gpupool.io/pool": str(T4)}))
    eventually(lambda: free(live) == 0 and _reservations(live) == 6, what="settled reservations")


def test_a_jobs_burst_stays_on_one_pool_before_and_after_the_watch_shows_it(tmp_path: Path) -> None:
    """Two pools the ranking cannot tell apart. 16 Pods of one Job are admitted back to back (from 16
    threads) before the watch shows any: all on one pool, held by the reservations that carry the group.
    Then the Pods are created and bound as the scheduler would: the watch shows them, their reservations
    end, and the Pods themselves keep the group there: the Job's next Pod follows them, although the
    other pool now has far more free GPUs."""
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([*(gpu_node(f"a10-{i}", "NVIDIA-A10", 8, memory_mib=23034) for i in range(3)),
                  *(gpu_node(f"l4-{i}", "NVIDIA-L4", 8, memory_mib=23034) for i in range(3))])  # fmt: skip
        live = LiveInventory.connect(POLICY, str(sim.write_kubeconfig(tmp_path / "kc")), FAST).start()
        try:
            assert live.wait_ready(20)
            admitter = Admitter(POLICY, live)
            owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u", "controller": True}]

            def job_pod(i: int) -> dict[str, Any]:
                obj = pod(f"train-{i}", annotations={"gpupool.io/gpu-class": "medium"})
                obj["metadata"]["ownerReferences"] = owner
                return obj

            results: dict[int, Any] = {}

            def admit(i: int) -> None:
                results[i] = admitter.admit(job_pod(i), namespace="ml")

            threads = [threading.Thread(target=admit, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            pools = {r.placement.pool for r in results.values() if r.placement is not None}
            assert len(pools) == 1 and all(not r.warnings for r in results.values())
            (home,) = pools
            prefix = "a10" if home.product == "NVIDIA-A10" else "l4"
            for i, result in results.items():  # created as admitted, then bound by the scheduler
                seen = jsonpatch.apply_patch(job_pod(i), list(result.patch))
                seen["spec"]["nodeName"] = f"{prefix}-{i // 8}"
                seen["status"] = {"phase": "Running"}
                sim.add(seen)
            eventually(lambda: _reservations(live) == 0, what="the Pods taking over their reservations")
            with live.read() as index:
                assert index.usage.group_pools("ml", "Job/train") == {home: 16}
            nxt = admitter.admit(job_pod(16), namespace="ml")
            assert nxt.placement is not None and nxt.placement.pool == home and not nxt.warnings
        finally:
            live.close()
        assert sim.handler_errors == []


# --- the order lists and events arrive in (issue 12) ------------------------------------------------------

DEMO = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"


DEMO_NAMESPACES = ("default", "kube-system", "ml-train", "research", "team-a", "team-b")


class _UnusedApi:
    """A CoreV1Api stand-in for driving LiveInventory's sink by hand: its reflectors are never started."""

    def _never(self, **kwargs: Any) -> Any:
        raise AssertionError("the reflectors of this inventory are not started")

    list_node = list_pod_for_all_namespaces = list_resource_quota_for_all_namespaces = _never


def demo_lists() -> dict[str, list[dict[str, Any]]]:
    """The demo cluster as the three lists the reflectors would get (list items carry no kind)."""
    lists: dict[str, list[dict[str, Any]]] = {"nodes": [], "pods": [], "resourcequotas": []}
    kinds = {"Node": "nodes", "Pod": "pods", "ResourceQuota": "resourcequotas"}
    for obj in parse_objects(DEMO.read_text("utf-8"), str(DEMO)):
        lists[kinds[obj["kind"]]].append({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
    return lists


def view(inventory: LiveInventory | None, objects: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What decisions read, from the inventory or from a snapshot of `objects`."""
    if inventory is None:
        assert objects is not None
        return decision_view(build_index(objects, POLICY), DEMO_NAMESPACES)
    with inventory.read() as index:
        return decision_view(index, DEMO_NAMESPACES)


def pages(items: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def relist(inventory: LiveInventory, kind: str, items: list[dict[str, Any]], size: int = 3) -> None:
    """A complete list of `kind` in pages, as the reflector hands it to the sink."""
    chunks = pages(items, size)
    for i, chunk in enumerate(chunks):
        inventory.replace(kind, chunk, first=i == 0, final=i == len(chunks) - 1)


@pytest.mark.parametrize(
    "order",
    [("nodes", "pods", "resourcequotas"), ("pods", "nodes", "resourcequotas"), ("pods", "resourcequotas", "nodes")],
)
def test_the_view_does_not_depend_on_which_list_arrives_first(order: tuple[str, ...]) -> None:
    """Whichever of the three lists completes first, the view equals the snapshot of the same objects:
    the Pending Pod pinned to T4 holds one of its GPUs (3 free, not 4) even when listed before the nodes."""
    lists = demo_lists()
    live = LiveInventory(POLICY, _UnusedApi())
    for kind in order:
        relist(live, kind, lists[kind])
    expected = view(None, _with_kinds(lists))
    assert view(live) == expected
    t4 = next(s for s in expected["stats"] if s.pool == T4)
    assert (t4.gpus_free, t4.pending) == (3, 1)


def test_a_failed_list_in_between_leaves_the_same_view() -> None:
    """A Pod list and a node list that each fail after their first page, then list again from the
    start (the nodes after the Pods): the view equals the snapshot."""
    lists = demo_lists()
    live = LiveInventory(POLICY, _UnusedApi())
    live.replace("pods", lists["pods"][-5:], first=True, final=False)  # then the connection drops
    live.replace("nodes", lists["nodes"][:4], first=True, final=False)  # and this one too
    relist(live, "pods", lists["pods"])
    relist(live, "resourcequotas", lists["resourcequotas"])
    relist(live, "nodes", lists["nodes"][::-1])
    assert view(live) == view(None, _with_kinds(lists))


def test_watch_events_in_any_order_leave_the_same_view() -> None:
    """ADDED events with every Pod before any node, then nodes in reverse order, give the snapshot's view."""
    lists = demo_lists()
    live = LiveInventory(POLICY, _UnusedApi())
    for kind in ("pods", "resourcequotas", "nodes"):
        for obj in lists[kind][::-1]:
            live.apply(kind, "ADDED", obj)
    assert view(live) == view(None, _with_kinds(lists))


def _with_kinds(lists: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    kinds = {"nodes": "Node", "pods": "Pod", "resourcequotas": "ResourceQuota"}
    return [{**obj, "kind": kinds[kind]} for kind, items in lists.items() for obj in items]


def _reservations(inventory: LiveInventory) -> int:
    with inventory.read() as index:
        return index.usage.reservations


def test_the_contexts_namespace_is_kubectls(tmp_path: Path) -> None:
    """The namespace kubectl would use: the current context's, another context's, `default` for a
    context without one or no kubeconfig at all; an unknown context is an error naming it."""
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncurrent-context: a\ncontexts:\n"
        "- {name: a, context: {cluster: c, user: u, namespace: team-a}}\n- {name: b, context: {cluster: c, user: u}}\n"
    )
    assert context_namespace(str(kubeconfig)) == "team-a"
    assert context_namespace(str(kubeconfig), "b") == "default"
    assert context_namespace(str(tmp_path / "missing")) == "default"
    with pytest.raises(InventoryConnectError, match="context 'nope' is not in the kubeconfig"):
        context_namespace(str(kubeconfig), "nope")


# --- the screen: a list page's GPU-less Pods are read no further than their resource names -----------------


def _eager_index(lists: dict[str, list[dict[str, Any]]], pol: Policy) -> PoolIndex:
    """The index of the same objects, every Pod read whole (no screen), one object at a time."""
    index = PoolIndex(pol)
    resources, prefixes = pol.gpu_resources, pol.partition_prefixes
    for obj in lists["nodes"]:
        index.upsert_node(node_from_obj(obj, resources, prefixes))
    for obj in lists["pods"]:
        meta = obj["metadata"]
        index.upsert_pod(pod_from_obj(obj, resources, prefixes, screen=False), (meta["namespace"], meta["name"]))
    for obj in lists["resourcequotas"]:
        meta = obj["metadata"]
        index.upsert_quota(quota_from_obj(obj, resources, prefixes), meta["namespace"], meta["name"])
    return index


def _synthetic_lists(partitioned: float) -> dict[str, list[dict[str, Any]]]:
    lists: dict[str, list[dict[str, Any]]] = {"nodes": [], "pods": [], "resourcequotas": []}
    kinds = {"Node": "nodes", "Pod": "pods", "ResourceQuota": "resourcequotas"}
    for obj in iter_synthetic_cluster(40, 2400, seed=11, partitioned=partitioned):
        lists[kinds[obj["kind"]]].append({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
    return lists


def _changed(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a re-list after a 410 may find: a third of the Pods gone, some finished, a placement written on
    GPU-less Pods and taken off placed ones."""
    result = []
    for i, listed in enumerate(pods):
        if i % 3 == 0:
            continue
        obj = copy.deepcopy(listed)
        annotations = obj["metadata"].setdefault("annotations", {})
        if i % 5 == 1:
            obj.setdefault("status", {})["phase"] = "Succeeded"
        elif i % 7 == 2:
            annotations[POOL_ANNOTATION] = "nvidia/medium/Tesla-T4"
        elif i % 7 == 3:
            annotations.pop(POOL_ANNOTATION, None)
        result.append(obj)
    return result


@pytest.mark.parametrize("partitioned", [0.0, 0.3], ids=["whole-gpus", "partitioned"])
def test_pages_screened_hold_what_reading_every_pod_whole_holds_and_a_relist_converges(partitioned: float) -> None:
    """A synthetic cluster listed in pages (GPU-less Pods screened out by their resource names) gives the
    index that reading every Pod whole gives, the same Pods held; a re-list of a changed cluster (Pods
    gone, finished, placed, unplaced) gives the index of the changed cluster."""
    lists = _synthetic_lists(partitioned)
    namespaces = sorted({o["metadata"]["namespace"] for o in lists["pods"]})
    live = LiveInventory(POLICY, _UnusedApi())
    for kind in ("pods", "nodes", "resourcequotas"):
        relist(live, kind, lists[kind], size=50)
    eager = _eager_index(lists, POLICY)
    with live.read() as index:
        assert 0 < len(index.usage.pod_keys()) < len(lists["pods"]) / 2
        assert (index.usage.pod_keys(), decision_view(index, namespaces)) == (
            eager.usage.pod_keys(),
            decision_view(eager, namespaces),
        )
    lists["pods"] = _changed(lists["pods"])
    relist(live, "pods", lists["pods"], size=50)
    eager = _eager_index(lists, POLICY)
    with live.read() as index:
        assert (index.usage.pod_keys(), decision_view(index, namespaces)) == (
            eager.usage.pod_keys(),
            decision_view(eager, namespaces),
        )


def test_before_its_first_list_a_worker_refuses_gpu_pods_as_unavailable_not_as_unplaceable(
    sim: KubeSim, tmp_path: Path
) -> None:
    """A worker that starts (or is restarted by gunicorn's master while its Pod is still in the Service)
    answers before its first list is in. An empty index would say "no GPU pool matches the Pod" (403), a
    false and final-sounding refusal; the mutating and the validating call refuse with 503 (gpupool cannot
    decide yet) and say why. Once the list is in, the same Pod is placed."""
    from webhook.admission.validation import Trusted, Validator  # noqa: PLC0415

    sim.stall(3.0)
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    live = LiveInventory.connect(POLICY, str(kubeconfig), FAST).start()
    try:
        assert not live.ready
        admitter = Admitter(POLICY, live)
        gpu_pod = pod("p", annotations={"gpupool.io/gpu-class": "medium"})
        answer = admitter.admit(copy.deepcopy(gpu_pod), namespace="ml")
        assert (answer.allowed, answer.code) == (False, 503) and "still loading" in answer.message
        validator = Validator(admitter, Trusted.of("gpupool-system", "gpupool-webhook"))
        checked = validator.validate_create(copy.deepcopy(gpu_pod), namespace="ml")
        assert (checked.verdict.allowed, checked.verdict.code) == (False, 503)
        assert admitter.admit(pod("web"), namespace="ml").allowed  # not gpupool's business: never held up
        assert live.wait_ready(20)
        assert admitter.admit(copy.deepcopy(gpu_pod), namespace="ml").allowed
    finally:
        live.close()
