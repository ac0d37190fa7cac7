"""Pods being deleted are never released, through the API simulator as kube-apiserver keeps them: a
tenant's DELETE of a queued Pod its own finalizer keeps sets the Pod's deletionTimestamp and leaves it
stored, gated, and the queue's leader passes over it; the room goes to the Pods behind it.

Two `gpupool serve` replicas against the simulator (tests/queue/replicas.py); the tenant deletes through
the real `kubernetes` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from tests.builders import pod
from tests.conftest import SIM_TIMEOUT, wait_until
from tests.queue.helpers import GPU_TOLERATION
from tests.queue.replicas import WAIT, Pair, one_t4_node, replicas

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue}
  v: {placement: queue}
"""


def queued(name: str, namespace: str, gpus: int, finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    annotations = {"gpupool.io/gpu-class": "medium", "gpupool.io/gpu-count": str(gpus)}
    obj = pod(name, namespace, annotations=annotations, tolerations=[GPU_TOLERATION])
    if finalizers:
        obj["metadata"]["finalizers"] = list(finalizers)
    return obj


@pytest.fixture
def pair(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    with replicas(tmp_path, cert_dir, POLICY, one_t4_node()) as pair:
        yield pair


@pytest.fixture
def tenant(pair: Pair, tmp_path: Path) -> Iterator[kubernetes.client.CoreV1Api]:
    path = pair.sim.write_kubeconfig(tmp_path / "tenant.kubeconfig")
    with kubernetes.config.new_client_from_config(config_file=str(path)) as client:
        yield kubernetes.client.CoreV1Api(api_client=client)


def test_queued_pods_deleted_while_a_finalizer_keeps_them_are_never_released(
    pair: Pair, tenant: kubernetes.client.CoreV1Api
) -> None:
    """The T4s are taken by a running service; two queued 4-GPU Pods of q, kept by q's own finalizer,
    are deleted, then a 1-GPU Pod of v queues behind them. Once the service ends, the leader releases v's
    Pod and neither of q's, which stay stored, gated, being deleted."""
    pair.sim.add(pod("service", "svc", gpus=4, node="t4-a", phase="Running"))
    for k in range(2):
        pair.create(queued(f"big-{k}", "q", 4, ("example.com/keep",)), replica=k)
        tenant.delete_namespaced_pod(f"big-{k}", "q", _request_timeout=SIM_TIMEOUT)
    pair.create(queued("small", "v", 1), replica=0)
    for k in range(2):
        assert pair.pod("q", f"big-{k}")["metadata"]["deletionTimestamp"]
    pair.sim.delete("Pod", "svc", "service")
    wait_until(lambda: pair.released("v", "small"), WAIT, "v's Pod released into the room the service left")
    for k in range(2):
        assert not pair.released("q", f"big-{k}")
        assert pair.pod("q", f"big-{k}")["metadata"]["deletionTimestamp"]
