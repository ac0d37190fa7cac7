"""The scheduler and kubelet stand-in (webhook/testing/kubescheduler.py).

Driven round by round on a store (`Scheduler.step(now)`), so nothing depends on timing; the last tests
run its thread through KubeSim and the real client: a queued Pod released by a patch is bound.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import kubernetes
import orjson
import pytest

from tests.conftest import SIM_TIMEOUT as TIMEOUT
from tests.conftest import wait_until
from webhook.testing import KubeSim, synthetic_cluster
from webhook.testing.kubefit import why_unfit
from webhook.testing.kubescheduler import RUN_SECONDS, Scheduler
from webhook.testing.kubestore import Store, kind_of

PODS = kind_of("pods")
GPU = "nvidia.com/gpu"
Obj = dict[str, Any]


def gpu_node(name: str, gpus: int = 4, product: str = "Tesla-T4", cpu: str = "8") -> Obj:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "32Gi", "pods": "110", GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(name: str, gpus: int = 1, *, priority: int = 0, created: str = "2026-01-01T00:00:00Z", **extra: Any) -> Obj:
    meta: Obj = {"name": name, "namespace": "team-a", "creationTimestamp": created}
    if "annotations" in extra:
        meta["annotations"] = extra.pop("annotations")
    container = {"name": "main", "image": "cuda", "resources": {"limits": {GPU: str(gpus)}, "requests": {"cpu": "1"}}}
    return {
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [container], "priority": priority, **extra},
        "status": {"phase": "Pending"},
    }


def stored(store: Store, name: str) -> Obj:
    body = store.get(PODS, "team-a", name)
    assert body is not None
    pod: Obj = orjson.loads(body)
    return pod


def placed(store: Store, *names: str) -> list[str | None]:
    return [stored(store, n)["spec"].get("nodeName") for n in names]


class TestBinding:
    def test_pods_that_may_be_scheduled_are_bound_and_started_in_one_write(self) -> None:
        store = Store()
        store.load(
            [gpu_node("t4-a"), gpu_pod("free"), gpu_pod("queued", schedulingGates=[{"name": "gpupool.io/queue"}])]
        )
        scheduler = Scheduler(store)
        before = store.rv
        scheduler.step(0.0)
        free = stored(store, "free")
        assert (free["spec"]["nodeName"], free["status"]["phase"]) == ("t4-a", "Running")
        assert stored(store, "queued")["spec"].get("nodeName") is None
        assert store.rv == before + 1  # one write: one watch event
        assert scheduler.stats()["bind"] == 1

    def test_a_released_pod_is_bound_at_the_next_round(self) -> None:
        store = Store()
        store.load([gpu_node("t4-a"), gpu_pod("queued", schedulingGates=[{"name": "gpupool.io/queue"}])])
        scheduler = Scheduler(store)
        scheduler.step(0.0)
        ungated = stored(store, "queued")
        del ungated["spec"]["schedulingGates"]
        store.put({"kind": "Pod", **ungated}, exists=True)
        scheduler.step(0.01)
        assert placed(store, "queued") == ["t4-a"]

    def test_what_it_binds_fits_every_filter(self) -> None:
        """On a synthetic fleet (taints, selectors, full nodes, cordoned and NotReady ones): every bind passes
        why_unfit beside the Pods bound before it."""
        store = Store()
        cluster = synthetic_cluster(nodes=40, pods=400, seed=11)
        store.load(cluster)
        pending = [p for p in cluster if p["kind"] == "Pod" and p["status"]["phase"] == "Pending"]
        assert pending
        nodes = {n["metadata"]["name"]: n for n in cluster if n["kind"] == "Node"}
        pods_before = {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in cluster if p["kind"] == "Pod"
        }
        Scheduler(store).step(0.0)
        snap = store.snapshot(PODS)
        after = {k: orjson.loads(b) for k, b in zip(snap.keys, snap.bodies, strict=True)}
        bound = [
            k for k, p in after.items() if p["spec"].get("nodeName") and not pods_before[k]["spec"].get("nodeName")
        ]
        assert bound
        others = [p for k, p in after.items() if k not in bound]
        for i, key in enumerate(bound):
            pod = after[key]
            beside = others + [after[k] for k in bound[:i]]
            assert why_unfit(pods_before[key], nodes[pod["spec"]["nodeName"]], beside) is None, key

    def test_higher_priority_first_then_older(self) -> None:
        store = Store()
        store.load(
            [
                gpu_node("t4-a", gpus=1),
                gpu_pod("old-low", created="2026-01-01T00:00:00Z"),
                gpu_pod("new-high", priority=100, created="2026-01-02T00:00:00Z"),
                gpu_pod("new-low", created="2026-01-02T00:00:00Z"),
            ]
        )
        Scheduler(store).step(0.0)
        assert placed(store, "new-high", "old-low", "new-low") == ["t4-a", None, None]

    def test_a_pod_goes_to_the_least_allocated_node(self) -> None:
        store = Store()
        busy = gpu_pod("busy", gpus=0, nodeName="t4-a")
        busy["status"]["phase"] = "Running"
        busy["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "6"}
        store.load([gpu_node("t4-a"), gpu_node("t4-b"), busy, gpu_pod("p")])
        Scheduler(store).step(0.0)
        assert placed(store, "p") == ["t4-b"]

    def test_most_allocated_scoring_packs_pods_onto_the_node_that_uses_most_of_the_scored_resource(self) -> None:
        """NodeResourcesFit's MostAllocated strategy on the GPU resource: the Pod goes where GPUs are in
        use already, though that node has the least cpu left; without it, to the emptier node."""
        busy = gpu_pod("busy", gpus=3, nodeName="t4-a")
        busy["status"]["phase"] = "Running"
        busy["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "6"}
        for scoring, scored, expected in (
            ("MostAllocated", (GPU,), "t4-a"),
            ("LeastAllocated", ("cpu", "memory"), "t4-b"),
        ):
            store = Store()
            store.load([gpu_node("t4-a"), gpu_node("t4-b"), busy, gpu_pod("p")])
            Scheduler(store, scoring=scoring, scored=scored).step(0.0)
            assert placed(store, "p") == [expected], scoring

    def test_other_schedulers_pods_are_left_and_bound_pods_are_started(self) -> None:
        store = Store()
        store.load(
            [
                gpu_node("t4-a"),
                gpu_pod("theirs", schedulerName="volcano"),
                gpu_pod("direct", nodeName="t4-a"),
            ]
        )
        scheduler = Scheduler(store)
        scheduler.step(0.0)
        assert placed(store, "theirs") == [None]
        assert stored(store, "direct")["status"]["phase"] == "Running"
        assert scheduler.stats()["start"] == 1


class TestRoom:
    def test_a_pod_waits_until_a_finished_pod_makes_room(self) -> None:
        """Run times come from the annotation; the waiting Pod binds once the first one finished (and its
        backoff has passed), to the node it freed."""
        store = Store()
        store.load(
            [
                gpu_node("t4-a", gpus=4),
                gpu_pod("short", gpus=2, annotations={RUN_SECONDS: "5"}, created="2026-01-01T00:00:00Z"),
                gpu_pod("long", gpus=2, created="2026-01-01T00:00:01Z"),
                gpu_pod("waiting", gpus=2, created="2026-01-01T00:00:02Z"),
            ]
        )
        scheduler = Scheduler(store)
        scheduler.step(100.0)
        assert placed(store, "short", "long", "waiting") == ["t4-a", "t4-a", None]
        scheduler.step(104.0)
        assert stored(store, "short")["status"]["phase"] == "Running"
        scheduler.step(105.0)
        assert stored(store, "short")["status"]["phase"] == "Succeeded"
        assert [
            c["state"]["terminated"]["exitCode"] for c in stored(store, "short")["status"]["containerStatuses"]
        ] == [0]
        scheduler.step(105.01)
        assert placed(store, "waiting") == ["t4-a"]
        assert scheduler.stats()["finish"] == 1

    def test_a_pod_that_fits_nowhere_is_not_tried_until_room_appears(self) -> None:
        store = Store()
        store.load([gpu_node("t4-a", gpus=1), gpu_pod("huge", gpus=8)])
        scheduler = Scheduler(store)
        scheduler.step(0.0)
        tries = Counter[str]()
        original = scheduler._choose  # white box: count the searches, the cost being bounded here

        def counting(need: Any) -> Any:
            tries["choose"] += 1
            return original(need)

        scheduler._choose = counting  # type: ignore[method-assign]
        for second in range(1, 30):
            scheduler.step(float(second))
        assert tries["choose"] == 0
        store.put(gpu_node("t4-b", gpus=8), exists=False)  # a node joins: room
        scheduler.step(31.0)
        assert tries["choose"] == 1 and placed(store, "huge") == ["t4-b"]

    def test_a_finish_rate_finishes_that_many_running_pods_a_second(self) -> None:
        store = Store()
        running = []
        for i in range(40):
            pod = gpu_pod(f"r{i}", gpus=0, nodeName="t4-a")
            pod["status"]["phase"] = "Running"
            running.append(pod)
        store.load([gpu_node("t4-a"), *running])
        scheduler = Scheduler(store, finish_rate=10.0, seed=3)
        scheduler.step(0.0)
        for tick in range(1, 11):
            scheduler.step(tick / 10)
        assert scheduler.stats()["finish"] == 10
        phases = Counter(stored(store, f"r{i}")["status"]["phase"] for i in range(40))
        assert phases == {"Running": 30, "Succeeded": 10}

    def test_a_finish_filter_limits_what_the_rate_finishes(self) -> None:
        store = Store()
        pods = []
        for i, gpus in enumerate((0, 1, 0, 1)):
            pod = gpu_pod(f"r{i}", gpus=gpus, nodeName="t4-a")
            pod["status"]["phase"] = "Running"
            pods.append(pod)
        store.load([gpu_node("t4-a"), *pods])

        def uses_gpus(pod: Obj) -> bool:
            return bool(pod["spec"]["containers"][0]["resources"]["limits"].get(GPU, "0") != "0")

        scheduler = Scheduler(store, finish_rate=100.0, finish_filter=uses_gpus)
        scheduler.step(0.0)
        scheduler.step(1.0)
        assert [stored(store, f"r{i}")["status"]["phase"] for i in range(4)] == [
            "Running",
            "Succeeded",
            "Running",
            "Succeeded",
        ]

    def test_bad_arguments_are_refused(self) -> None:
        with pytest.raises(ValueError, match="finish_rate"):
            Scheduler(Store(), finish_rate=-1)
        with pytest.raises(ValueError, match="run_seconds"):
            Scheduler(Store(), run_seconds=-1)
        with pytest.raises(ValueError, match="scoring must be LeastAllocated or MostAllocated, not 'Packed'"):
            Scheduler(Store(), scoring="Packed")


@pytest.mark.slow
class TestThroughKubeSim:
    @pytest.mark.empty_cluster
    def test_a_queued_pod_released_by_a_patch_is_bound_and_watchers_see_it(
        self, sim: KubeSim, api: kubernetes.client.CoreV1Api
    ) -> None:
        sim.add(gpu_node("t4-a"))
        scheduler = sim.scheduler()
        with pytest.raises(RuntimeError, match="already"):
            sim.scheduler()
        body = gpu_pod("q", schedulingGates=[{"name": "gpupool.io/queue"}])
        del body["metadata"]["creationTimestamp"]
        created = api.create_namespaced_pod("team-a", body, _request_timeout=TIMEOUT)
        time.sleep(0.2)  # a few rounds: the gated Pod stays unbound
        assert api.read_namespaced_pod("q", "team-a", _request_timeout=TIMEOUT).spec.node_name is None
        stream = kubernetes.watch.Watch().stream(
            api.list_namespaced_pod,
            "team-a",
            resource_version=created.metadata.resource_version,
            timeout_seconds=TIMEOUT,
        )
        patch = {"spec": {"schedulingGates": [{"name": "gpupool.io/queue", "$patch": "delete"}]}}
        api.patch_namespaced_pod("q", "team-a", patch, _request_timeout=TIMEOUT)
        events = [next(stream), next(stream)]
        assert [(e["type"], e["object"].spec.node_name, e["object"].status.phase) for e in events] == [
            ("MODIFIED", None, "Pending"),
            ("MODIFIED", "t4-a", "Running"),
        ]
        assert scheduler.errors == [] and scheduler.stats()["bind"] == 1

    def test_the_churn_leaves_binding_to_the_scheduler(self) -> None:
        with KubeSim() as sim:
            sim.load(synthetic_cluster(nodes=20, pods=200, seed=8))
            scheduler = sim.scheduler()
            churn = sim.churn(300)
            wait_until(lambda: churn.stats().get("add", 0) >= 20, 20, "the churn's first adds")
            assert "bind" not in churn.stats()
            wait_until(lambda: scheduler.stats().get("bind", 0) > 0, 20, "the scheduler's binds")
