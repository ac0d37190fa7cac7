"""The queue benchmark's judge (bench/queueaudit/): overbooking, quotas and release latency worked out
from the simulator's writes alone."""

from __future__ import annotations

from typing import Any

import pytest

from bench.queueaudit import GPU, QUEUE_GATE, Auditor, QuotaRule

T4 = "Tesla-T4"
POOL = f"nvidia/medium/{T4}"


def node(name: str, gpus: int = 2, *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": T4, "nvidia.com/gpu.memory": "15360"}},
        "spec": {},
        "status": {
            "allocatable": {GPU: str(gpus), "cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(name: str, namespace: str = "q", *, node: str = "", phase: str = "Pending", gated: bool = False,  # noqa: PLR0913 (a test builder: each field a keyword)
        gpus: int = 1, pool: str = "") -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {GPU: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": QUEUE_GATE}]
    else:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": T4}
    annotations = {"gpupool.io/pool": pool} if pool else {}
    return {"metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "spec": spec,
            "status": {"phase": phase}}  # fmt: skip


class Log:
    """Writes as the audit log has them, at chosen store times."""

    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor
        self.rv = 100

    def write(self, at: float, obj: dict[str, Any], kind: str = "Pod", type_: str = "MODIFIED") -> None:
        self.rv += 1
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]
        self.auditor.apply({"rv": self.rv, "at": at, "type": type_, "kind": kind, "key": key, "object": obj})


def full_cluster(rules: list[QuotaRule] | None = None) -> tuple[Auditor, Log]:
    """Two T4 nodes of 2 GPUs, every GPU held by a Running filler."""
    fillers = [pod(f"fill-{n}", "other", node=n, phase="Running", gpus=2) for n in ("t4-a", "t4-b")]
    auditor = Auditor([node("t4-a"), node("t4-b")], fillers, rules or [], ["q"], {T4: "medium"})
    return auditor, Log(auditor)


class TestLatency:
    def test_room_appears_when_a_pod_finishes_and_the_release_is_timed_from_then(self) -> None:
        auditor, log = full_cluster()
        log.write(1.0, pod("a", gated=True), type_="ADDED")
        log.write(2.0, pod("fill-t4-a", "other", node="t4-a", phase="Succeeded", gpus=2))
        log.write(2.25, pod("a", pool=POOL))
        log.write(2.5, pod("a", node="t4-a", phase="Running", pool=POOL))
        (release,) = auditor.releases
        assert release.latency == pytest.approx(0.25) and release.short_capacity == 0
        assert auditor.binds == [(2.25, 2.5)] and auditor.overbooking.peak == 0

    def test_a_pod_created_after_the_room_is_timed_from_its_creation(self) -> None:
        auditor, log = full_cluster()
        log.write(1.0, pod("fill-t4-a", "other", node="t4-a", phase="Succeeded", gpus=2))
        log.write(5.0, pod("a", gated=True), type_="ADDED")
        log.write(5.1, pod("a", pool=POOL))
        assert auditor.releases[0].latency == pytest.approx(0.1)

    def test_the_oldest_room_goes_first(self) -> None:
        """Two GPUs free at 2.0, two more at 3.0: the third release takes room of 3.0."""
        auditor, log = full_cluster()
        for name in "abc":
            log.write(1.0, pod(name, gated=True), type_="ADDED")
        log.write(2.0, pod("fill-t4-a", "other", node="t4-a", phase="Succeeded", gpus=2))
        log.write(3.0, pod("fill-t4-b", "other", node="t4-b", phase="Succeeded", gpus=2))
        for i, name in enumerate("abc"):
            log.write(4.0 + i, pod(name, pool=POOL))
        assert [r.room_at for r in auditor.releases] == [2.0, 2.0, 3.0]


class TestOverbooking:
    def test_a_release_without_room_is_overbooked_until_room_appears(self) -> None:
        auditor, log = full_cluster()
        log.write(1.0, pod("a", gated=True), type_="ADDED")
        log.write(2.0, pod("a", pool=POOL))
        log.write(4.0, pod("fill-t4-b", "other", node="t4-b", phase="Succeeded", gpus=2))
        assert auditor.releases[0].short_capacity == 1
        book = auditor.overbooking
        assert (book.peak, book.writes_over) == (1, 1) and book.gpu_seconds == pytest.approx(2.0)

    def test_room_a_pod_outside_the_queue_takes_first_leaves_the_released_one_overbooked(self) -> None:
        auditor, log = full_cluster()
        log.write(1.0, pod("a", gated=True), type_="ADDED")
        log.write(2.0, pod("fill-t4-a", "other", node="t4-a", phase="Succeeded", gpus=2))
        log.write(2.1, pod("a", pool=POOL))
        log.write(2.2, pod("other", "other", node="t4-a", phase="Running", gpus=2), type_="ADDED")
        assert auditor.overbooking.peak == 1

    def test_a_node_that_is_not_ready_is_no_room(self) -> None:
        auditor = Auditor([node("t4-a", ready=False)], [], [], ["q"], {T4: "medium"})
        log = Log(auditor)
        log.write(1.0, pod("a", gated=True), type_="ADDED")
        log.write(2.0, pod("a", pool=POOL))
        assert auditor.overbooking.peak == 1


class TestQuotas:
    def test_every_form_is_counted_from_released_and_bound_pods(self) -> None:
        rules = [QuotaRule("q", "gpus", "nvidia.com/gpu", 1), QuotaRule("q", "class", "medium", 1),
                 QuotaRule("q", "memory", "gpu-memory", 15360)]  # fmt: skip
        auditor, log = full_cluster(rules)
        log.write(1.0, pod("fill-t4-a", "other", node="t4-a", phase="Succeeded", gpus=2))
        for name in "ab":
            log.write(2.0, pod(name, gated=True), type_="ADDED")
        log.write(3.0, pod("a", pool=POOL))
        assert [w.used for w in auditor.quotas] == [1, 1, 15360]
        assert all(w.excess_peak == 0 and w.at_limit_writes == 1 for w in auditor.quotas)
        log.write(4.0, pod("b", pool=POOL))
        assert [w.excess_peak for w in auditor.quotas] == [1, 1, 15360]
        assert auditor.releases[1].short_quota == 1 + 1 + 15360
        log.write(5.0, pod("a", node="t4-a", phase="Succeeded", pool=POOL))
        assert [w.used for w in auditor.quotas] == [1, 1, 15360]

    def test_a_finished_pod_is_quota_room_for_the_next(self) -> None:
        auditor, log = full_cluster([QuotaRule("q", "gpus", "nvidia.com/gpu", 1)])
        log.write(1.0, pod("fill-t4-a", "other", node="t4-a", phase="Succeeded", gpus=2))
        for name in "ab":
            log.write(1.5, pod(name, gated=True), type_="ADDED")
        log.write(2.0, pod("a", pool=POOL))
        log.write(2.1, pod("a", node="t4-a", phase="Running", pool=POOL))
        log.write(3.0, pod("a", node="t4-a", phase="Succeeded", pool=POOL))
        log.write(3.5, pod("b", pool=POOL))
        assert auditor.releases[1].room_at == 3.0 and auditor.quotas[0].excess_peak == 0


def lease(name: str, holder: str, transitions: int) -> dict[str, Any]:
    spec = {"holderIdentity": holder, "leaseTransitions": transitions} if holder else {"leaseTransitions": transitions}
    return {"metadata": {"name": name, "namespace": "gpupool-system"}, "spec": spec}


class TestLeader:
    def test_the_holder_and_term_are_the_queue_leases_whatever_other_lease_is_written(self) -> None:
        """The leader writes the charges Lease (no holder) with each pass that releases: the snapshot's
        holder and term stay the queue's Lease's, so the benchmark finds the leader to kill."""
        auditor, log = full_cluster()
        log.write(1.0, lease("gpupool", "replica-a", 3), kind="Lease")
        log.write(2.0, lease("gpupool-charges", "", 0), kind="Lease")
        snap = auditor.snapshot()
        assert (snap["holder"], snap["term"]) == ("replica-a", 3)
        log.write(3.0, lease("gpupool", "", 3), kind="Lease")  # handed back
        assert auditor.snapshot()["holder"] == ""
