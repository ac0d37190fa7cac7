"""A waiting Pod's long node-affinity lists are kept cut to the values the nodes carry (webhook.domain.cut),
and the cut stays exact: a node that appears with a value the Pod names, that no node carried when it
was cut, has the Pod read again in full from the API (webhook.sources.rereads) before anything is decided
by it. The Pod is never released to a pool only by nodes its full affinity refuses, nor kept from one whose
node it allows."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from tests.admission.demo import apply, kubectl_patch, validate_pod
from tests.builders import eventually, gpu_node, policy
from webhook.domain.cut import CUT_AT
from webhook.domain.model import QUEUE_GATE
from webhook.queue.release import plan
from webhook.queue.waiting import Waiting
from webhook.sources.live import LiveInventory
from webhook.sources.reflector import ReflectorConfig
from webhook.testing.kubefit import why_unfit
from webhook.testing.kubesim import KubeSim
from webhook.testing.kubevalidate import validate_pod_update

POLICY = policy("namespaces:\n  q: {placement: queue}\n")
RACK = "topology.example.com/rack"
VALUES = [f"rack-{i:04d}-{'x' * 16}" for i in range(256)]  # 5.6 K characters: cut


class _Api:
    """A CoreV1Api stand-in that answers GETs of Pods from `stored`; the reflectors are never started."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0

    def _never(self, **kwargs: Any) -> Any:
        raise AssertionError("the reflectors of this inventory are not started")

    list_node = list_pod_for_all_namespaces = list_resource_quota_for_all_namespaces = _never

    def read_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.gets += 1
        if (namespace, name) not in self.stored:
            raise ApiException(status=404, reason="Not Found")
        return type("Response", (), {"data": orjson.dumps(self.stored[(namespace, name)])})()


def queued_pod(operator: str, terms: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    expression = {"key": RACK, "operator": operator, "values": VALUES}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "job", "namespace": "q", "uid": "u-1", "resourceVersion": "7",
            "creationTimestamp": "2026-12-01T10:00:00Z", "annotations": {"gpupool.io/gpu-class": "medium"},
        },
        "spec": {
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "schedulingGates": [{"name": QUEUE_GATE}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms or [{"matchExpressions": [expression]}]}}},
        },
        "status": {"phase": "Pending"},
    }  # fmt: skip


def setup(
    operator: str, nodes: list[dict[str, Any]], terms: list[dict[str, Any]] | None = None, *, cut: bool = True
) -> tuple[LiveInventory, Waiting, _Api]:
    api = _Api()
    live, waiting = LiveInventory(POLICY, api), Waiting(POLICY)
    if cut:
        live.observe(waiting)
    else:
        live._observers.append(waiting)  # the queue as it was: nothing cut
    for node in nodes:
        live.apply("nodes", "ADDED", node)
    pod = queued_pod(operator, terms)
    api.stored[("q", "job")] = pod
    live.apply("pods", "ADDED", orjson.loads(orjson.dumps(pod)))
    return live, waiting, api


def released(live: LiveInventory, waiting: Waiting) -> list[str]:
    with live.read() as index:
        return [r.queued.key[1] for r in plan(waiting.ordered(), index, POLICY).releases]


def rack_node(name: str, rack: str) -> dict[str, Any]:
    return gpu_node(name, gpus=1, labels={RACK: rack})


def test_the_pod_is_kept_cut() -> None:
    assert sum(map(len, VALUES)) > CUT_AT
    live, waiting, _ = setup("In", [rack_node("t4-a", "rack-elsewhere")])
    (q,) = waiting.ordered()
    assert q.cut is not None and len(repr(q.view.shape)) < 2048  # not its 256 values
    with live.read() as index:
        assert index.usage.pod_info(("q", "job")).cut is not None  # type: ignore[union-attr]


def test_a_node_that_appears_with_a_value_its_in_names_lets_the_pod_go() -> None:
    """`rack In (256 values)`, no node carries any: the cut keeps none and the Pod goes nowhere. A node
    with one of them appears: once read again the Pod is released to it (not kept from it)."""
    live, waiting, api = setup("In", [rack_node("t4-a", "rack-elsewhere")])
    assert released(live, waiting) == []
    live.apply("nodes", "ADDED", rack_node("t4-b", VALUES[7]))
    eventually(lambda: live.rereads.done >= 1, what="the cut Pod read again")
    assert api.gets == 1
    assert released(live, waiting) == ["job"]


def test_a_node_that_appears_with_a_value_its_notin_names_takes_no_release() -> None:
    """`rack NotIn (256 values)`, the one node carries one of them: nothing goes. A free node appears that
    carries another: its full affinity refuses that node too, so it is still not released (a cut that
    dropped the value, which no node carried, would have released it there)."""
    live, waiting, _ = setup("NotIn", [rack_node("t4-a", VALUES[3])])
    assert released(live, waiting) == []
    live.apply("nodes", "ADDED", rack_node("t4-b", VALUES[7]))
    assert released(live, waiting) == []  # while it is not read again, nothing is decided by its cut
    eventually(lambda: live.rereads.done >= 1, what="the cut Pod read again")
    assert released(live, waiting) == []
    live.apply("nodes", "ADDED", rack_node("t4-c", "rack-other"))  # one it allows: it goes there
    eventually(lambda: live.rereads.done >= 2, what="the cut Pod read again")
    assert released(live, waiting) == ["job"]


def test_a_pod_deleted_before_its_read_is_not_brought_back() -> None:
    live, waiting, api = setup("In", [rack_node("t4-a", "rack-elsewhere")])
    del api.stored[("q", "job")]
    live.apply("pods", "DELETED", queued_pod("In"))
    live.apply("nodes", "ADDED", rack_node("t4-b", VALUES[7]))
    with live.read() as index:
        assert index.usage.pod_info(("q", "job")) is None
    assert len(waiting) == 0 and api.gets == 0


TWO_TERMS = [
    {"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["t4-0", "t4-1"]},
        {"key": RACK, "operator": "NotIn", "values": VALUES},
    ]},
    {"matchExpressions": [{"key": RACK, "operator": "In", "values": [*VALUES[:8], "rack-b"]}]},
]  # fmt: skip


def test_a_cut_pods_release_is_the_full_pods_and_kube_apiserver_takes_it(tmp_path: Path) -> None:
    """t4-0 kept from new Pods: the release of a cut Pod appends `hostname NotIn [t4-0]` to each of its
    two terms exactly as the release of the same Pod kept whole does, and kube-apiserver's patch engine
    and validation take it; the patched Pod fits t4-1 (its first term) and t4-2 (its second), never t4-0."""
    nodes = [rack_node("t4-0", "rack-a"), rack_node("t4-1", "rack-a"), rack_node("t4-2", "rack-b")]
    ops = []
    for cut in (True, False):
        live, waiting, api = setup("In", nodes, TWO_TERMS, cut=cut)
        assert (waiting.ordered()[0].cut is not None) is cut
        with live.read() as index:
            index.exclude_nodes("test", {"t4-0"})
            (release,) = plan(waiting.ordered(), index, POLICY).releases
        ops.append(release.patch)
    assert ops[0] == ops[1]
    stored = api.stored[("q", "job")]
    after = kubectl_patch(stored, ops[0], tmp_path)
    assert after == apply(stored, ops[0])
    assert validate_pod_update(copy.deepcopy(after), stored) == []
    validate_pod(after)
    for node in nodes:
        node["status"]["allocatable"]["pods"] = "110"
    assert {n["metadata"]["name"]: why_unfit(after, n) is None for n in nodes} == {
        "t4-0": False, "t4-1": True, "t4-2": True,
    }  # fmt: skip


def test_through_the_api_simulator_a_cut_pod_is_read_again_and_released(tmp_path: Path) -> None:
    """The same as the `In` case through the real client and watches: the watch shows the new node, the
    inventory GETs the Pod from the API, and the Pod goes to the node its full affinity allows."""
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([rack_node("t4-a", "rack-elsewhere"), queued_pod("In")])
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        live, waiting = LiveInventory.connect(POLICY, str(kubeconfig), ReflectorConfig(page_size=7)), Waiting(POLICY)
        live.observe(waiting)
        live.start()
        try:
            assert live.wait_ready(20)
            # (queued, and decided by its cut: a Pod listed before the node it is cut against is read again)
            eventually(lambda: len(waiting.ordered()) == 1, what="the Pod queued")
            assert waiting.ordered()[0].cut is not None and released(live, waiting) == []
            reads = live.rereads.done  # (1 when the Pod was listed before t4-a)
            sim.add(rack_node("t4-b", VALUES[7]))

            def read_again() -> bool:
                with live.read() as index:
                    seen = index.capacity.node("t4-b") is not None
                return seen and live.rereads.done > reads and len(waiting.ordered()) == 1

            eventually(read_again, what="the Pod read again once t4-b was seen")
            assert released(live, waiting) == ["job"]
        finally:
            live.close()
        assert sim.handler_errors == []


def test_a_pod_projected_while_a_node_gained_its_value_is_read_again() -> None:
    """A list page is projected outside the inventory's lock: a node that gains one of its values before
    the page is applied has the Pod read again all the same (the index's cut was made before the value)."""
    api = _Api()
    live, waiting = LiveInventory(POLICY, api), Waiting(POLICY)
    live.observe(waiting)
    live.apply("nodes", "ADDED", rack_node("t4-a", "rack-elsewhere"))
    pod = queued_pod("In")
    api.stored[("q", "job")] = pod
    projected = live.project_page("pods", [pod])
    live.apply("nodes", "ADDED", rack_node("t4-b", VALUES[7]))
    live.apply_page("pods", [pod], projected, first=True, final=True)
    eventually(lambda: live.rereads.done >= 1, what="the cut Pod read again")
    with live.read() as index:
        info = index.usage.pod_info(("q", "job"))
        assert info is not None and info.cut is not None and not index.labels.stale(info.cut)
    assert released(live, waiting) == ["job"]
