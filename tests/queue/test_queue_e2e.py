"""End to end: two `gpupool serve` replicas against the API simulator, a scheduler stand-in binding what
is released. Pods are created as kube-apiserver creates them: the AdmissionReview goes to one replica or
the other, its patch is applied, the Pod is stored; the simulator checks every write the leader makes
against kube-apiserver's rules for gated Pods."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.queue.e2e import REPLICAS, WAIT, Cluster, delete_every_pod, node, resource_quota, running, two_replicas
from tests.serving.running import readyz

pytestmark = pytest.mark.slow

LEASE_SECONDS = 6  # the replicas' --lease-duration: the failover waits for the killed leader's Lease to run out
POLICY = """
namespaces:
  team-q: {placement: queue}
  team-u: {placement: queue}
  team-v: {placement: queue, classQuota: {medium: 4}}
  team-g: {placement: queue}
  team-w: {placement: queue, memoryQuota: 45Gi}
  team-x: {placement: queue}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, cert_dir: Path) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("queue")
    policy = work / "policy.yaml"
    policy.write_text(POLICY, "utf-8")
    nodes = [node("t4-a", "Tesla-T4"), node("t4-b", "Tesla-T4"), node("l4-a", "NVIDIA-L4", memory_mib=23034)]
    with two_replicas(work, cert_dir, policy, nodes, lease_seconds=LEASE_SECONDS) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def no_pods_left(cluster: Cluster) -> Iterator[None]:
    """Each test starts on an empty cluster, also after one before it failed half-way (the replicas are
    shared by the module; a Pod left behind would fill the GPUs the next test counts on)."""
    yield
    delete_every_pod(cluster)


def test_a_waiting_pod_goes_to_the_pool_that_frees_first(cluster: Cluster) -> None:
    """Every medium GPU busy; the Pod waits gated with no pool. When an L4 frees, it goes to the L4
    (not pinned to the T4s it was first compared with), and the scheduler binds it there."""
    fill = [running(f"fill-{n}", "other", n, 4) for n in ("t4-a", "t4-b", "l4-a")]
    for obj in fill:
        cluster.sim.add(obj)
    cluster.create("late", "team-q")
    time.sleep(2.0)
    assert not cluster.released("team-q", "late") and cluster.pool("team-q", "late") == ""
    cluster.sim.delete("Pod", "other", "fill-l4-a")
    wait_until(lambda: cluster.released("team-q", "late"), WAIT, "the release")
    assert cluster.pool("team-q", "late") == "nvidia/medium/NVIDIA-L4"
    wait_until(lambda: cluster.pod("team-q", "late")["spec"].get("nodeName") == "l4-a", WAIT, "the bind")
    # The Events go out from a thread of their own, after the release: wait for them, do not race them.
    reasons = lambda: {e["reason"] for e in cluster.sim.events("team-q", about="late")}  # noqa: E731
    wait_until(lambda: {"Queued", "Released"} <= reasons(), WAIT, "the Queued and Released events")


def test_a_burst_through_both_replicas_never_exceeds_a_quota(cluster: Cluster) -> None:
    """team-u's tutorial quota (`nvidia.com/gpu: 2`) and team-x's `limits.nvidia.com/gpu: 1` (which only
    gpupool enforces), team-v's classQuota (medium: 4) and team-w's memoryQuota (45Gi: three 15Gi T4s):
    Pods created through both replicas at once, room for all. Exactly 2, 1, 4 and 3 are released."""
    for namespace, hard in (("team-u", {"nvidia.com/gpu": "2"}), ("team-x", {"limits.nvidia.com/gpu": "1"})):
        cluster.sim.add(resource_quota(namespace, hard))
    time.sleep(1.0)  # both replicas' watches have the quotas
    wanted = {"team-u": 2, "team-v": 4, "team-w": 3, "team-x": 1}
    products = {"team-v": "L4"}  # room for all: the classQuota's four on the L4s, the other six on the T4s
    for i in range(6):
        for namespace in wanted:
            extra = {"gpupool.io/gpu-product": products.get(namespace, "T4")}
            cluster.create(f"b-{i}", namespace, run=600, extra=extra)
    time.sleep(6.0)
    got = {ns: sum(cluster.released(ns, f"b-{i}") for i in range(6)) for ns in wanted}
    assert got == wanted


def test_priority_decides_who_gets_the_one_free_gpu(cluster: Cluster) -> None:
    for n in ("t4-a", "t4-b"):
        cluster.sim.add(running(f"fill-{n}", "other", n, 4))
    cluster.sim.add(running("fill-l4-a", "other", "l4-a", 3))
    time.sleep(1.0)
    # Created while nothing is free (the free L4 is taken first by a placeholder), then room appears.
    cluster.sim.add(running("hold", "other", "l4-a", 1))
    uids = {cluster.create(name, "team-q", priority=p)["metadata"]["uid"] for name, p in (("low", 0), ("high", 1000))}
    told = lambda: {e["involvedObject"].get("uid") for e in cluster.sim.events("team-q")} >= uids  # noqa: E731
    wait_until(told, WAIT, "the leader telling both Pods they wait")
    cluster.sim.delete("Pod", "other", "hold")
    wait_until(lambda: cluster.released("team-q", "high"), WAIT, "the high-priority release")
    time.sleep(2.0)
    assert not cluster.released("team-q", "low")
    for name in ("fill-t4-a", "fill-t4-b", "fill-l4-a"):
        cluster.sim.delete("Pod", "other", name)
    wait_until(lambda: cluster.released("team-q", "low"), WAIT, "the low-priority release")


def test_a_gang_is_released_whole(cluster: Cluster) -> None:
    """A group of three with group-size 3: nothing goes while two exist; all three go once the third is
    created, to one pool."""
    gang = {"gpupool.io/group": "sweep", "gpupool.io/group-size": "3"}
    for i in range(2):
        cluster.create(f"g-{i}", "team-g", gpus=2, extra=gang, run=600)
    time.sleep(3.0)
    assert not any(cluster.released("team-g", f"g-{i}") for i in range(2))
    cluster.create("g-2", "team-g", gpus=2, extra=gang, run=600)
    wait_until(lambda: all(cluster.released("team-g", f"g-{i}") for i in range(3)), WAIT, "the gang")
    assert len({cluster.pool("team-g", f"g-{i}") for i in range(3)}) == 1


def test_after_the_leader_is_killed_the_other_replica_releases(cluster: Cluster) -> None:
    """SIGKILL the leading replica whole (its master and its leader process, as a node that dies takes
    them): the other takes over within the Lease's duration (and its catch-up), and releases what is
    queued; nothing is released twice."""
    leader = cluster.leader()
    killed = cluster.replicas[REPLICAS.index(leader)]
    assert killed.proc is not None and killed.health_port is not None
    leader_pid = readyz(killed.health_port)[1]["leader"]["pid"]
    os.kill(killed.proc.pid, signal.SIGKILL)
    os.kill(leader_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = 1 - REPLICAS.index(leader)
    cluster.create("after", "team-q", replica=survivor)
    wait_until(lambda: cluster.released("team-q", "after"), 45.0, "a release by the new leader")
    took = time.monotonic() - killed_at
    assert cluster.leader() == REPLICAS[survivor]
    lease = cluster.sim.get("leases", "gpupool-system", "gpupool")
    assert lease is not None and lease["spec"]["leaseDurationSeconds"] == LEASE_SECONDS
    assert took < 30.0, f"failover took {took:.1f} s"
    patches = cluster.sim.write_requests("patch", "pods")
    assert patches >= 1
