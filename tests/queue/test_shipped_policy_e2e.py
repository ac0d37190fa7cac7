"""End to end with the policy as shipped: two `gpupool serve` replicas against the API simulator, each
serving `manifests/base/policy.yaml` unchanged (the gpupool-policy ConfigMap, also the built-in default),
as `manifests/base` installs them. A GPU Pod in a namespace the policy does not mention queues, and a
burst through both replicas never grants more than a quota only gpupool enforces."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ApiServerClient, wait_until
from tests.queue.e2e import WAIT, Cluster, admit, delete_every_pod, node, pod, resource_quota, two_replicas

pytestmark = pytest.mark.slow

SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "manifests" / "base" / "policy.yaml"
GATE = {"name": "gpupool.io/queue"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, cert_dir: Path) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("shipped")
    nodes = [node("t4-a", "Tesla-T4"), node("t4-b", "Tesla-T4"), node("l4-a", "NVIDIA-L4", memory_mib=23034)]
    with two_replicas(work, cert_dir, SHIPPED_POLICY, nodes) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def no_pods_left(cluster: Cluster) -> Iterator[None]:
    yield
    delete_every_pod(cluster)


def test_a_gpu_pod_in_a_namespace_the_policy_does_not_mention_queues(cluster: Cluster) -> None:
    """The shipped policy names no namespace: a GPU Pod in `research` is admitted gated, with no pool
    pinned, and the leader releases it to a pool with room, where the scheduler binds it."""
    stored = cluster.create("train", "research", run=600)
    assert stored["spec"].get("schedulingGates") == [GATE]
    assert "nodeSelector" not in stored["spec"]
    assert "gpupool.io/pool" not in stored["metadata"]["annotations"]
    wait_until(lambda: cluster.released("research", "train"), WAIT, "the release by the leader")
    assert cluster.pool("research", "train").startswith("nvidia/medium/")
    wait_until(lambda: bool(cluster.pod("research", "train")["spec"].get("nodeName")), WAIT, "the bind")


def test_a_burst_through_both_replicas_never_grants_more_than_the_tutorial_quota(cluster: Cluster) -> None:
    """The tutorial's ResourceQuota `nvidia.com/gpu: 2` (which Kubernetes never enforces for an extended
    resource: gpupool is the only guard), 24 one-GPU Pods from 8 concurrent clients spread over both
    replicas, room for all of them on the nodes: exactly 2 GPUs are granted, the rest wait."""
    cluster.sim.add(resource_quota("tutorial", {"nvidia.com/gpu": "2"}))
    time.sleep(1.0)  # both replicas' watches have the quota
    clients, per_client = 8, 3
    start = threading.Barrier(clients)

    def burst(c: int) -> None:
        ports = [client.port for client in cluster.clients]
        ca = cluster.clients[0].ca_file
        own = [ApiServerClient(port, ca) for port in ports]
        try:
            start.wait()
            for i in range(per_client):
                admit(cluster.sim, own[(c + i) % len(own)], pod(f"b-{c}-{i}", "tutorial", run=600))
        finally:
            for client in own:
                client.close()

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(burst, range(clients)))
    time.sleep(6.0)  # the leader's passes, had it room in the quota

    def granted() -> int:
        pods = cluster.sim.objects("Pod", "tutorial")
        return sum(1 for p in pods if not p["spec"].get("schedulingGates"))

    assert granted() == 2
