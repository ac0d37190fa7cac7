"""End to end: `gpupool serve` on the API simulator runs the queue's leader in a process of its own beside
the admission workers (webhook.serving.leaderproc): the Lease is held as POD_NAME by that process, which
releases, and never by an admission worker; a killed leader process is restarted and the queue carries
on under a new term; a hung one (SIGSTOP) is killed and restarted; the master logs and counts how each
one ended; SIGTERM hands the Lease back."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ApiServerClient, ServerProcess, free_port, serve_argv, server_env, wait_until
from tests.queue.e2e import Cluster, node
from tests.serving.running import metric, readyz
from webhook.admission.fence import RELEASED_BY
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow

POLICY = "namespaces:\n  team-q: {placement: queue}\n"
WAIT = 40.0
HUNG_SECONDS = 3.0  # GPUPOOL_LEADER_HUNG_SECONDS for the replica (60 s by default)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory, cert_dir: Path) -> Iterator[Cluster]:
    """One replica, `replica-a`, with one admission worker, ready and leading; a leader process whose
    loop has not gone round for HUNG_SECONDS is hung. Started once for the module (each start is most of
    a test's time): each test counts restarts and terms from what it finds, and the last one stops it."""
    tmp_path = tmp_path_factory.mktemp("leaderproc")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, "utf-8")
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([node("t4-a", "Tesla-T4")])
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
        port, health = free_port(), free_port()
        argv = serve_argv(cert_dir, port, health, "--kubeconfig", str(kubeconfig), "--policy", str(policy))
        env = server_env(
            POD_NAME="replica-a", POD_NAMESPACE="gpupool-system", GPUPOOL_LEADER_HUNG_SECONDS=str(HUNG_SECONDS)
        )
        server = ServerProcess(argv, tmp_path / "server.log", env, health).start()
        client = ApiServerClient(port, cert_dir / "ca.crt")
        try:
            server.wait_ready()
            cluster = Cluster(sim, [server], [client])
            wait_until(lambda: cluster.leader() == "replica-a", WAIT, "replica-a leading")
            yield cluster
            assert sim.handler_errors == []
        finally:
            client.close()
            server.stop(timeout=30)


def health_port(cluster: Cluster) -> int:
    port = cluster.replicas[0].health_port
    assert port is not None
    return port


def leader_detail(cluster: Cluster) -> dict[str, Any]:
    return dict(readyz(health_port(cluster))[1]["leader"])


def lease(cluster: Cluster) -> dict[str, Any]:
    found = cluster.sim.get("leases", "gpupool-system", "gpupool")
    assert found is not None
    return dict(found["spec"])


def released_by(cluster: Cluster, name: str) -> str:
    return str(cluster.pod("team-q", name)["metadata"]["annotations"].get(RELEASED_BY, ""))


def restarts(port: int, reason: str) -> float:
    """The leader process's restarts counted with `reason`, scraped until the health port answers (on a
    loaded machine one scrape may time out, which `metric` reads as absent)."""
    got: list[float | None] = []
    sample = f'gpupool_queue_leader_restarts_total{{reason="{reason}"}}'
    wait_until(lambda: got.append(metric(port, sample)) or got[-1] is not None, 15, f"the {reason} restarts")
    return got[-1] or 0.0


def exits(port: int, cause: str) -> float:
    """The leader process's ends counted with `cause`, scraped as `restarts` is."""
    got: list[float | None] = []
    sample = f'gpupool_queue_leader_exits_total{{cause="{cause}"}}'
    wait_until(lambda: got.append(metric(port, sample)) or got[-1] is not None, 15, f"the {cause} exits")
    return got[-1] or 0.0


def ended(cluster: Cluster, pid: int) -> str:
    """The master's line on how the leader process `pid` ended (waited for)."""
    server = cluster.replicas[0]
    assert isinstance(server, ServerProcess)
    prefix = f"the leader process (pid {pid}) "
    lines: list[str] = []

    def logged() -> bool:
        lines[:] = [line for line in server.log().splitlines() if prefix in line and "restarting it" in line]
        return bool(lines)

    wait_until(logged, 15, f"the master's line on how {pid} ended")
    return lines[-1]


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_leader_is_a_process_of_its_own_beside_the_workers(replica: Cluster) -> None:
    """The Lease holder is POD_NAME, and the process that holds it and releases is neither the master nor
    an admission worker: gpupool_queue_leader is 1 for the leader process's pid, and 0 (or nothing) for every worker."""
    status, ready = readyz(health_port(replica))
    assert status == 200
    workers = {int(pid) for pid in ready["workers"]}
    leader = ready["leader"]
    assert leader["running"] and leader["inventoryReady"]
    assert replica.replicas[0].proc is not None
    assert leader["pid"] not in workers | {replica.replicas[0].proc.pid}

    replica.create("first", "team-q")
    wait_until(lambda: replica.released("team-q", "first"), WAIT, "the release")
    assert released_by(replica, "first") == f"replica-a/{lease(replica)['leaseTransitions']}"
    port = health_port(replica)
    wait_until(lambda: metric(port, f'gpupool_queue_leader{{pid="{leader["pid"]}"}}') == 1.0, 15, "the metric")
    for pid in workers:
        assert metric(port, f'gpupool_queue_leader{{pid="{pid}"}}') in (None, 0.0)


def test_a_hung_leader_process_is_killed_and_restarted_and_counted_as_hung(replica: Cluster) -> None:
    """SIGSTOP the leader process (alive, but its loop goes round no more): within the bound the master
    kills it and starts another, which leads and releases; the restart is counted with reason hung."""
    port = health_port(replica)
    before = leader_detail(replica)
    time.sleep(HUNG_SECONDS + 2)  # idle, its loop still goes round (every second): it is not hung
    assert leader_detail(replica)["pid"] == before["pid"]
    assert restarts(port, "hung") == 0.0
    os.kill(before["pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        wait_until(lambda: not running(before["pid"]), HUNG_SECONDS + 10, "the hung leader process killed")
    finally:
        if running(before["pid"]):
            os.kill(before["pid"], signal.SIGCONT)
    took = time.monotonic() - stopped_at
    assert HUNG_SECONDS - 1 <= took <= HUNG_SECONDS + 5, f"killed {took:.1f} s after it hung"

    def restarted() -> bool:
        now = leader_detail(replica)
        return bool(now["running"] and now["pid"] != before["pid"] and now["restarts"] == before["restarts"] + 1)

    wait_until(restarted, WAIT, "a new leader process")
    assert (restarts(port, "hung"), restarts(port, "died")) == (1.0, 0.0)
    assert exits(port, "hung") == 1.0
    assert "was killed by SIGKILL" in (line := ended(replica, before["pid"]))
    assert "its supervisor killed it (SIGKILL): its heartbeat had stopped for" in line
    replica.create("after-hang", "team-q")
    wait_until(lambda: replica.released("team-q", "after-hang"), WAIT, "a release by the new leader process")
    assert released_by(replica, "after-hang").startswith("replica-a/")


def test_a_killed_leader_process_is_restarted_and_the_queue_carries_on(replica: Cluster) -> None:
    """SIGKILL the leader process: the master starts another, which takes its Pod's Lease over at once as
    a new term (a release the dead one had in flight is fenced off), and releases what is queued."""
    before = leader_detail(replica)
    term = lease(replica)["leaseTransitions"]
    os.kill(before["pid"], signal.SIGKILL)
    killed_at = time.monotonic()

    def restarted() -> bool:
        now = leader_detail(replica)
        return bool(now["running"] and now["pid"] != before["pid"] and now["restarts"] == before["restarts"] + 1)

    wait_until(restarted, WAIT, "a new leader process")
    replica.create("after", "team-q")
    wait_until(lambda: replica.released("team-q", "after"), WAIT, "a release by the new leader process")
    took = time.monotonic() - killed_at
    assert lease(replica)["holderIdentity"] == "replica-a"
    assert lease(replica)["leaseTransitions"] == term + 1
    assert released_by(replica, "after") == f"replica-a/{term + 1}"
    assert took < 20.0, f"the queue was without a leader for {took:.1f} s"
    # The dead process's live gauges are gone from /metrics.
    assert metric(health_port(replica), f'gpupool_queue_leader{{pid="{before["pid"]}"}}') is None
    # How it ended is not lost to gunicorn's arbiter, which reaps every child of the master.
    assert "was killed by SIGKILL" in (line := ended(replica, before["pid"]))
    assert "not by its supervisor" in line
    assert exits(health_port(replica), "killed") == 1.0


def test_a_leader_process_stopped_by_another_process_is_told_with_the_sender(replica: Cluster) -> None:
    """SIGTERM to the leader process alone, not from its master (a person, a tool): it stops, handing the
    Lease back; the master logs the signal and the sender's pid, counts it as stopped, and starts another."""
    before = leader_detail(replica)
    os.kill(before["pid"], signal.SIGTERM)  # from this test's process, not the master
    line = ended(replica, before["pid"])
    assert "exited with code 0" in line
    assert f"it stopped on SIGTERM from pid {os.getpid()}" in line and "not its master" in line
    assert exits(health_port(replica), "stopped") == 1.0

    def restarted() -> bool:
        now = leader_detail(replica)
        return bool(now["running"] and now["pid"] != before["pid"])

    wait_until(restarted, WAIT, "a new leader process")
    wait_until(lambda: lease(replica).get("holderIdentity") == "replica-a", WAIT, "the new one leading")


def test_sigterm_hands_the_lease_back_and_ends_the_leader_process(replica: Cluster) -> None:
    pid = leader_detail(replica)["pid"]
    assert replica.replicas[0].stop(timeout=30) == 0
    assert lease(replica).get("holderIdentity", "") == ""
    assert not running(pid)
