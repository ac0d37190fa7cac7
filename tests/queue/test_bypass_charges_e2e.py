"""Pods that name their node, in a namespace whose Pods are queued, through two replicas: their quota is
exact across replicas, kept in the API (webhook.admission.charging), not in one replica's memory.

Two `gpupool serve` replicas against the API simulator; each CREATE goes through one replica's mutating
webhook and then the validating webhook (on the replicas in turn), as kube-apiserver makes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.queue.replicas import WAIT, Pair, one_t4_node, replicas

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue, classQuota: {medium: 2}}
"""


def bound(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "q"},
        "spec": {
            "nodeName": "t4-a",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


@pytest.fixture
def pair(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    with replicas(tmp_path, cert_dir, POLICY, one_t4_node()) as pair:
        yield pair


def test_concurrent_pods_that_name_their_node_get_exactly_the_class_quota(pair: Pair) -> None:
    """Four 1-GPU Pods with spec.nodeName, created at once, two through each replica, against
    classQuota {medium: 2}: exactly two are admitted, the others refused naming the quota; once the
    watches show the two, a fifth is refused too."""
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: pair.submit(bound(f"p{i}"), replica=i % 2), range(4)))
    assert sorted(allowed for allowed, _ in answers) == [False, False, True, True]
    for allowed, message in answers:
        assert allowed or "class quota medium in namespace q exceeded" in message, message
    assert len(pair.sim.objects("Pod", "q")) == 2
    charges = pair.sim.get("leases", "gpupool-system", "gpupool-charges")
    assert charges is not None and "gpupool.io/charges" in charges["metadata"]["annotations"]
    wait_until(lambda: pair.sim.watch_requests("pods") >= 2, WAIT, "both replicas watching Pods")
    for replica in (0, 1):
        allowed, message = pair.submit(bound(f"late{replica}"), replica=replica)
        assert not allowed and "class quota medium in namespace q exceeded" in message, message
