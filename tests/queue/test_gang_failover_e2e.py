"""A leader killed part way through a gang's releases: the next leader completes the gang on its
siblings' pool, with an Event, and the released members' dead leader's late writes are fenced off.

Two `gpupool serve` replicas against the API simulator (tests/queue/replicas.py). The simulator lets the
first two of the leader's four release PATCHes through and holds the other two back; then the leader
process is SIGKILLed, and its replica's master starts another, which takes the Lease over at once with a
new term (webhook.queue.leader). A `now` Pod created during the failover through its mutating call only
(the one pool) takes the room the two waiting members need, so the gang waits, told so by `GangRepair`,
and completes once that room frees; created as kube-apiserver creates it, with a second pool, it counts
the killed leader's recorded releases (webhook.queue.records) and goes to the other pool.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import gpu_node
from tests.conftest import wait_until
from tests.queue.helpers import GPU_TOLERATION
from tests.queue.replicas import WAIT, Pair, one_t4_node, replicas
from tests.serving.running import readyz

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue}
  n: {placement: now}
"""
SIZE = 4


def member(k: int) -> dict[str, Any]:
    annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/group": "g", "gpupool.io/group-size": str(SIZE)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"g-{k}", "namespace": "q", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "cuda"}], "tolerations": [GPU_TOLERATION]},
    }


def now_pod(gpus: int) -> dict[str, Any]:
    annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "now", "namespace": "n", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "cuda"}], "tolerations": [GPU_TOLERATION]},
    }


@pytest.fixture
def pair(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    with replicas(tmp_path, cert_dir, POLICY, one_t4_node()) as pair:
        yield pair


def leader_process(pair: Pair, replica: int) -> dict[str, Any]:
    port = pair.servers[replica].health_port
    assert port is not None
    return dict(readyz(port)[1]["leader"])


def term(pair: Pair) -> int:
    lease = pair.sim.get("leases", "gpupool-system", "gpupool")
    assert lease is not None
    return int(lease["spec"]["leaseTransitions"])


def reasons(pair: Pair, name: str) -> list[str]:
    return [e["reason"] for e in pair.sim.events("q", about=name)]


def test_a_gang_half_released_by_a_killed_leader_is_completed_by_the_next(pair: Pair) -> None:
    leader = pair.leader()
    assert leader is not None
    token, first_term = Pair.token(leader), term(pair)
    pair.sim.hold_writes(token, resource="pods", after=2)
    for k in range(SIZE):
        pair.create(member(k), replica=1 - leader)
    wait_until(lambda: pair.sim.held_writes(token)[0] == SIZE - 2, WAIT, "two releases through, two held")
    wait_until(lambda: sum(pair.released("q", f"g-{k}") for k in range(SIZE)) == 2, WAIT, "two releases committed")
    released = [k for k in range(SIZE) if pair.released("q", f"g-{k}")]
    waiting = [k for k in range(SIZE) if k not in released]
    dead = leader_process(pair, leader)
    os.kill(dead["pid"], signal.SIGKILL)
    # During the failover a `now` Pod is admitted into the two GPUs the gang's waiting members need.
    pair.create(now_pod(2), replica=1 - leader)
    wait_until(lambda: term(pair) > first_term, WAIT, "the restarted leader process's new term")
    wait_until(lambda: all("GangRepair" in reasons(pair, f"g-{k}") for k in waiting), WAIT, "GangRepair on the waiting")
    pair.sim.release_writes(token)  # the dead process's two held releases arrive: fenced off, or stale
    pair.sim.delete("Pod", "n", "now")
    wait_until(lambda: all(pair.released("q", f"g-{k}") for k in range(SIZE)), WAIT, "the gang completed")
    pools = {pair.pod("q", f"g-{k}")["metadata"]["annotations"]["gpupool.io/pool"] for k in range(SIZE)}
    assert len(pools) == 1
    new_term = term(pair)
    for k in waiting:
        released_by = pair.pod("q", f"g-{k}")["metadata"]["annotations"]["gpupool.io/released-by"]
        assert released_by.endswith(f"/{new_term}"), released_by


@pytest.fixture
def two_pools(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    """A 4-T4 node and a 4-L4 node: two medium pools."""
    l4 = gpu_node("l4-a", "NVIDIA-L4", 4)
    l4["status"]["allocatable"]["pods"] = "110"
    with replicas(tmp_path, cert_dir, POLICY, [*one_t4_node(), l4]) as pair:
        yield pair


def test_a_now_pod_during_the_failover_does_not_take_the_room_a_half_released_gang_waits_for(
    two_pools: Pair,
) -> None:
    """The same half-released gang, with a second medium pool, and the `now` Pod created as kube-apiserver
    creates it, its validating call included: that call counts the releases the killed leader recorded
    with the charges before its first PATCH (webhook.queue.records), the two waiting members' included,
    so the `now` Pod goes to the other pool (before: into the gang's room, and the gang waited for it);
    the next leader completes the gang."""
    pair = two_pools
    leader = pair.leader()
    assert leader is not None
    token = Pair.token(leader)
    pair.sim.hold_writes(token, resource="pods", after=2)
    for k in range(SIZE):
        pair.create(member(k), replica=1 - leader)
    wait_until(lambda: pair.sim.held_writes(token)[0] == SIZE - 2, WAIT, "two releases through, two held")
    wait_until(lambda: sum(pair.released("q", f"g-{k}") for k in range(SIZE)) == 2, WAIT, "two releases committed")
    os.kill(leader_process(pair, leader)["pid"], signal.SIGKILL)
    pools = {pair.pod("q", f"g-{k}")["metadata"]["annotations"].get("gpupool.io/pool") for k in range(SIZE)} - {None}
    allowed, message = pair.submit(now_pod(2), replica=1 - leader)
    assert allowed, message
    assert pair.pod("n", "now")["metadata"]["annotations"]["gpupool.io/pool"] not in pools
    pair.sim.release_writes(token)  # the dead process's two held releases arrive: fenced off, or stale
    wait_until(lambda: all(pair.released("q", f"g-{k}") for k in range(SIZE)), WAIT, "the gang completed")
    assert {pair.pod("q", f"g-{k}")["metadata"]["annotations"]["gpupool.io/pool"] for k in range(SIZE)} == pools
