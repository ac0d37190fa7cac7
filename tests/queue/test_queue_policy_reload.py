"""The queue across changes of the policy file, without a restart (queueing.LeaderQueue, in the leader process):
`gpupool serve` against the API simulator, its --policy file mounted the way the kubelet mounts a
ConfigMap, and changed step by step:

1. a namespace starts queueing: its Pods are gated and released, by the queue that ran already;
2. a rule the queue reads changes (a classQuota raised, same pools): a Pod waiting for it is released;
3. the pools change (the product table makes the T4s class high): the queue follows the inventory read
   again for them, the same process still leading, and releases onto the new pools.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ApiServerClient, ServerProcess, free_port, serve_argv, server_env, wait_until
from tests.queue.e2e import WAIT, Cluster, node, pod
from tests.serving.configmaps import ConfigMapVolume
from tests.serving.running import metric
from webhook.testing import KubeSim

pytestmark = pytest.mark.slow

PLACED_NOW = "namespaces: {team-q: {classQuota: {medium: 1}}}\n"
QUEUED = "namespaces: {team-q: {placement: queue, classQuota: {medium: 1}}}\n"
QUEUED_ROOM_FOR_TWO = "namespaces: {team-q: {placement: queue, classQuota: {medium: 2}}}\n"
QUEUED_T4_IS_HIGH = (
    "namespaces: {team-q: {placement: queue, classQuota: {high: 4}}}\n"
    "products: [{match: T4, class: high, memory: 16Gi}]\n"
)


@contextmanager
def one_replica(
    sim: KubeSim, policy: ConfigMapVolume, cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> Iterator[tuple[Cluster, int]]:
    """`gpupool serve` on the simulator as replica-a, its --policy the mounted file: the cluster as the
    tests drive it, and the server's health port; the client closed and the server stopped after."""
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    port, health_port = free_port(), free_port()
    argv = serve_argv(cert_dir, port, health_port, "--kubeconfig", str(kubeconfig), "--policy", policy.path)
    server = start_server(argv, health_port, env=server_env(POD_NAME="replica-a", POD_NAMESPACE="gpupool-system"))
    client = ApiServerClient(port, cert_dir / "ca.crt")
    try:
        yield Cluster(sim, [server], [client]), health_port
    finally:
        client.close()
        server.stop()


def test_the_queue_follows_the_policy_file(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    volume = ConfigMapVolume(tmp_path / "policy", PLACED_NOW)
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([node("t4-a", "Tesla-T4", gpu_class=None), node("t4-b", "Tesla-T4", gpu_class=None)])
        with one_replica(sim, volume, cert_dir, tmp_path, start_server) as (cluster, health_port):
            reloads = 0

            def change(text: str) -> None:
                nonlocal reloads
                volume.update(text)
                reloads += 1
                wait_until(lambda: metric(health_port, 'gpupool_policy_reloads_total{result="success"}') == reloads,
                           60, "the new policy in use")  # fmt: skip

            # The queue runs before any namespace queues (Pods gated under an earlier policy are released).
            wait_until(lambda: sim.get("leases", "gpupool-system", "gpupool") is not None, WAIT, "the election")
            lists = sim.list_requests("pods")

            # 1. team-q queues from now on: the same inventory (its queue holds every gated Pod already);
            #    the leader releases the first Pod; the second waits for the classQuota.
            change(QUEUED)
            cluster.create("first", "team-q")
            wait_until(lambda: cluster.released("team-q", "first"), WAIT, "the first release")
            assert cluster.pool("team-q", "first") == "nvidia/medium/Tesla-T4"
            assert sim.list_requests("pods") == lists
            leader = cluster.leader()
            assert leader == "replica-a"  # the Pod's leader process, identity POD_NAME
            cluster.create("second", "team-q")
            wait_until(lambda: {e["reason"] for e in sim.events("team-q", about="second")} >= {"Queued"}, WAIT,
                       "the second told it waits")  # fmt: skip
            assert not cluster.released("team-q", "second")

            # 2. Room for two: the same inventory, and the waiting Pod goes.
            change(QUEUED_ROOM_FOR_TWO)
            wait_until(lambda: cluster.released("team-q", "second"), WAIT, "the release under the new quota")
            assert sim.list_requests("pods") == lists

            # 3. New pools: the inventory is read again and the queue moves onto it, the same process leading.
            change(QUEUED_T4_IS_HIGH)
            cluster.create("third", "team-q", cls="high")
            wait_until(lambda: cluster.released("team-q", "third"), WAIT, "a release onto the new pools")
            assert cluster.pool("team-q", "third") == "nvidia/high/Tesla-T4"
            assert sim.list_requests("pods") == lists + 2  # the worker's and the leader process's
            assert cluster.leader() == leader
            assert sim.handler_errors == []


def test_a_pod_gated_under_an_earlier_policy_is_released_after_a_restart(
    cert_dir: Path, tmp_path: Path, start_server: Callable[..., ServerProcess]
) -> None:
    """team-q queued; the policy was changed to place at admission and gpupool restarted, with one Pod
    still gated: no namespace queues now, but that Pod is released (by the rules in use), not stranded."""
    volume = ConfigMapVolume(tmp_path / "policy", PLACED_NOW)
    gated = pod("left-behind", "team-q")
    gated["spec"]["schedulingGates"] = [{"name": "gpupool.io/queue"}]
    gated["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load([node("t4-a", "Tesla-T4", gpu_class=None), gated])
        with one_replica(sim, volume, cert_dir, tmp_path, start_server) as (cluster, _):
            try:
                wait_until(lambda: cluster.released("team-q", "left-behind"), WAIT, "the release of the stranded Pod")
            except AssertionError:
                print(cluster.replicas[0].log())
                raise
            assert cluster.pool("team-q", "left-behind") == "nvidia/medium/Tesla-T4"
        assert sim.handler_errors == []
