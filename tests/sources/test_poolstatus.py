"""The writer of the pools' GPUPool objects (webhook/sources/poolstatus.py), against the API simulator:
it creates what is missing, then writes only statuses, only when they change, within its rate limit; it
deletes its own objects of pools that are gone and leaves everyone else's alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.conftest import wait_until
from webhook.sources import poolstatus
from webhook.sources.poolstatus import MANAGED_BY, SUMMARY, PoolStatusWriter, Write, next_write
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow  # the writer's tests serve HTTP from the simulator

WAIT = 20.0
L4, T4 = "nvidia-medium-nvidia-l4", "nvidia-medium-tesla-t4"


def status(free: int, queued: int = 0, pool: str = "nvidia/medium/NVIDIA-L4") -> dict[str, Any]:
    return {"pool": pool, "free": free, "queued": queued}


def pools(sim: KubeSim) -> dict[str, Any]:
    """Each GPUPool's status as the API has it (None before its first status write)."""
    return {o["metadata"]["name"]: o.get("status") for o in sim.objects("GPUPool")}


@pytest.fixture
def sim() -> Iterator[KubeSim]:
    with KubeSim(bookmark_interval=0.2) as running:
        yield running
        assert running.handler_errors == []


@pytest.fixture
def api_client(sim: KubeSim, tmp_path: Path) -> Iterator[Any]:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    with kubernetes.config.new_client_from_config(config_file=str(path)) as api:
        yield api


@pytest.fixture
def writer(api_client: Any) -> Iterator[PoolStatusWriter]:
    running = PoolStatusWriter(api_client).start()
    yield running
    running.stop()


class TestNextWrite:
    def test_creates_and_statuses_first_then_deletions(self) -> None:
        """A missing object is created, a changed status written, an object of a pool gone deleted, and
        a foreign object (not gpupool's) never written."""
        wanted = {"a": status(1), "b": status(2), "c": status(3)}
        written: dict[str, dict[str, Any] | None] = {"b": status(0), "c": status(3), "z": status(9)}
        assert next_write(wanted, written, set()) == Write("create", "a", status(1))
        assert next_write(wanted, written, {"a"}) == Write("status", "b", status(2))
        assert next_write(wanted, {**written, "a": status(1), "b": status(2)}, set()) == Write("delete", "z")
        assert next_write(wanted, {"a": status(1), "b": status(2), "c": status(3)}, set()) is None


class TestWriter:
    def test_a_pool_appears_with_its_status_and_changes_with_it(self, sim: KubeSim, writer: PoolStatusWriter) -> None:
        """Published: the object is created, labelled gpupool's, with spec.pool and the status; a new
        figure is written to the status."""
        writer.publish({L4: status(3)})
        wait_until(lambda: pools(sim) == {L4: status(3)}, WAIT, "the L4 pool's object")
        obj = sim.get("GPUPool", None, L4)
        assert obj is not None
        assert obj["metadata"]["labels"] == dict([MANAGED_BY])
        assert obj["spec"] == {"pool": "nvidia/medium/NVIDIA-L4"}
        writer.publish({L4: status(2, queued=1)})
        wait_until(lambda: pools(sim) == {L4: status(2, queued=1)}, WAIT, "the new status")

    def test_only_a_change_is_written(self, sim: KubeSim, writer: PoolStatusWriter) -> None:
        """The same statuses published again and again make no write."""
        writer.publish({L4: status(3)})
        wait_until(lambda: pools(sim) == {L4: status(3)}, WAIT, "the L4 pool's object")
        patches = sim.write_requests("patch", "gpupools")
        for _ in range(20):
            writer.publish({L4: status(3)})
        time.sleep(0.5)
        assert sim.write_requests("patch", "gpupools") == patches == 1
        assert sim.write_requests("create", "gpupools") == 1

    def test_the_objects_of_pools_gone_are_deleted_but_not_others(self, sim: KubeSim, writer: PoolStatusWriter) -> None:
        """A pool no longer published loses its object; a GPUPool someone else made (no managed-by
        label) of a pool published is neither written nor deleted."""
        sim.add({"kind": "GPUPool", "metadata": {"name": "someone-elses"}, "spec": {"pool": "x"}})
        sim.add({"kind": "GPUPool", "metadata": {"name": T4}, "spec": {"pool": "by hand"}})
        writer.publish({L4: status(3), T4: status(1, pool="nvidia/medium/Tesla-T4")})
        wait_until(lambda: pools(sim).get(L4) == status(3), WAIT, "the L4 pool's object")
        writer.publish({})
        wait_until(lambda: L4 not in pools(sim), WAIT, "the L4 pool's object deleted")
        assert pools(sim) == {"someone-elses": None, T4: None}

    def test_an_object_deleted_by_hand_comes_back(self, sim: KubeSim, api_client: Any) -> None:
        """An object deleted by hand is created again: at once when its status changes (the write finds
        no object), and, unchanged, at the next list (every RESYNC_SECONDS)."""
        now = [0.0]
        writer = PoolStatusWriter(api_client, lambda: now[0]).start()
        try:
            writer.publish({L4: status(3), T4: status(1)})
            wait_until(lambda: pools(sim) == {L4: status(3), T4: status(1)}, WAIT, "both objects")
            sim.delete("GPUPool", None, L4)
            sim.delete("GPUPool", None, T4)
            writer.publish({L4: status(2), T4: status(1)})
            wait_until(lambda: pools(sim) == {L4: status(2)}, WAIT, "the changed one written again")
            now[0] = poolstatus.RESYNC_SECONDS
            writer.publish({L4: status(2), T4: status(1)})
            wait_until(lambda: pools(sim) == {L4: status(2), T4: status(1)}, WAIT, "the other, once listed again")
        finally:
            writer.stop()

    def test_a_new_writer_carries_on_from_what_it_lists(self, sim: KubeSim, api_client: Any) -> None:
        """A new leader's writer lists the objects first: an unchanged pool is not written again, and the
        object of a pool gone (written by the last leader) is deleted."""
        first = PoolStatusWriter(api_client).start()
        first.publish({L4: status(3), T4: status(1)})
        wait_until(lambda: pools(sim) == {L4: status(3), T4: status(1)}, WAIT, "both objects")
        first.forget()
        first.stop()
        writes = sim.write_requests("patch", "gpupools") + sim.write_requests("create", "gpupools")
        second = PoolStatusWriter(api_client).start()
        try:
            second.publish({L4: status(3)})
            wait_until(lambda: pools(sim) == {L4: status(3)}, WAIT, "the T4 object deleted")
            assert sim.write_requests("patch", "gpupools") + sim.write_requests("create", "gpupools") == writes
        finally:
            second.stop()

    def test_a_writer_that_no_longer_leads_writes_nothing(self, sim: KubeSim, writer: PoolStatusWriter) -> None:
        """After `forget` (leadership lost) nothing is written, whatever was published before."""
        writer.publish({L4: status(3)})
        wait_until(lambda: pools(sim) == {L4: status(3)}, WAIT, "the L4 pool's object")
        writer.forget()
        time.sleep(0.3)
        assert pools(sim) == {L4: status(3)}

    def test_writes_keep_to_the_rate_limit(self, sim: KubeSim, api_client: Any) -> None:
        """With a burst of 4 and 1 write a second (on a clock the test moves), 10 new pools (20 writes)
        get 4 writes at once, then none until the clock moves, then one a second."""
        now = [0.0]
        limited = PoolStatusWriter(api_client, lambda: now[0], qps=1.0, burst=4).start()
        try:
            limited.publish({f"pool-{k}": status(k) for k in range(10)})
            wait_until(lambda: limited.writes >= 4, WAIT, "the burst's writes")
            time.sleep(0.3)
            assert limited.writes == 4
            now[0] = 2.0
            wait_until(lambda: limited.writes >= 6, WAIT, "two more writes once two seconds went by")
            time.sleep(0.3)
            assert limited.writes == 6
        finally:
            limited.stop()

    def test_a_failing_api_is_waited_out(self, sim: KubeSim, api_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """A list answered 404 (as by an API without the CRD), then 500, is logged, waited out and tried
        again; the queue is never held up (publish returns at once)."""
        monkeypatch.setattr(poolstatus, "RETRY_SECONDS", 0.2)
        monkeypatch.setattr(poolstatus, "MISSING_SECONDS", 0.2)
        sim.fail_next(1, 404, verb="list")
        limited = PoolStatusWriter(api_client).start()
        try:
            limited.publish({L4: status(3)})
            wait_until(lambda: sim.list_requests("gpupools") >= 1, WAIT, "the first list")
            sim.fail_next(1, 500, verb="list")
            wait_until(lambda: pools(sim) == {L4: status(3)}, WAIT, "the object once the list works")
        finally:
            limited.stop()


def summaries(sim: KubeSim) -> dict[str, Any]:
    """Each namespace's ConfigMap gpupool-queue: its data, and whether gpupool owns it."""
    return {
        o["metadata"]["namespace"]: (o.get("data"), o["metadata"].get("labels") == dict([MANAGED_BY]))
        for o in sim.objects("ConfigMap")
        if o["metadata"]["name"] == SUMMARY
    }


class TestQueueSummaries:
    def test_a_namespace_with_pods_waiting_gets_its_configmap_and_loses_it_when_none_wait(
        self, sim: KubeSim, writer: PoolStatusWriter
    ) -> None:
        """Published: the namespace's ConfigMap gpupool-queue is created, labelled gpupool's, with the data;
        new data replaces it whole (a key left out goes); no Pod waiting any more: it is deleted."""
        writer.publish_queues({"ml": {"summary": "2 wait", "pods.yaml": "- a\n- b\n"}})
        wait_until(
            lambda: summaries(sim) == {"ml": ({"summary": "2 wait", "pods.yaml": "- a\n- b\n"}, True)}, WAIT, "it"
        )
        writer.publish_queues({"ml": {"summary": "1 waits"}})
        wait_until(lambda: summaries(sim) == {"ml": ({"summary": "1 waits"}, True)}, WAIT, "the new data")
        writer.publish_queues({})
        wait_until(lambda: summaries(sim) == {}, WAIT, "the ConfigMap deleted")

    def test_a_configmap_of_that_name_gpupool_does_not_own_is_left_alone(
        self, sim: KubeSim, writer: PoolStatusWriter
    ) -> None:
        """A ConfigMap gpupool-queue someone else made is neither written nor deleted; the others are."""
        sim.add({"kind": "ConfigMap", "metadata": {"name": SUMMARY, "namespace": "team"}, "data": {"mine": "yes"}})
        writer.publish_queues({"team": {"summary": "1 waits"}, "ml": {"summary": "1 waits"}})
        wait_until(lambda: "ml" in summaries(sim), WAIT, "the ml ConfigMap")
        writer.publish_queues({})
        wait_until(lambda: "ml" not in summaries(sim), WAIT, "the ml ConfigMap deleted")
        assert summaries(sim) == {"team": ({"mine": "yes"}, False)}
