"""Pods that name their node, in a namespace whose Pods are queued, through two replicas: their quota is
exact across replicas, kept in the API (webhook.admission.charging), not in one replica's memory, and the
queue's leader counts their charges as admission does.

Two `gpupool serve` replicas against the API simulator; each CREATE goes through one replica's mutating
webhook and then the validating webhook (on the replicas in turn), as kube-apiserver makes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import wait_until
from tests.queue.helpers import GPU_TOLERATION
from tests.queue.replicas import WAIT, Pair, one_t4_node, replicas

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue, classQuota: {medium: 2}}
"""


# One medium GPU for q; a charge lives CHARGE_SECONDS (reservationSeconds) when its Pod never shows up.
CHARGE_SECONDS = 8
ONE = f"""
defaults: {{reservationSeconds: {CHARGE_SECONDS}}}
namespaces:
  q: {{placement: queue, classQuota: {{medium: 1}}}}
"""


def queued(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "q", "annotations": {"gpupool.io/gpu-class": "medium"}},
        "spec": {"containers": [{"name": "main", "image": "cuda"}], "tolerations": [GPU_TOLERATION]},
    }


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


@pytest.fixture
def pair_one(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    with replicas(tmp_path, cert_dir, ONE, one_t4_node()) as pair:
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


def test_the_leader_releases_nothing_into_a_charge_its_watch_has_not_shown(pair_one: Pair) -> None:
    """A 1-GPU Pod naming its node is charged through the replica that does not lead, and no watch ever
    shows it (its creation failed after the validating call); then a queued 1-GPU Pod, against classQuota
    {medium: 1}. The leader counts the charge as admission does: the queued Pod stays gated while the
    charge counts, and is released once it has expired (reservationSeconds)."""
    pair = pair_one
    leader = pair.leader()
    assert leader is not None
    allowed, message = pair.submit(bound("charged"), replica=1 - leader, stored=False)
    assert allowed, message
    lease = pair.sim.get("leases", "gpupool-system", "gpupool-charges")
    assert lease is not None
    ((_, name, _, _, expires),) = orjson.loads(lease["metadata"]["annotations"]["gpupool.io/charges"])
    assert name == "charged"
    pair.create(queued("job"), replica=leader)
    while time.time() < expires - 0.5:
        assert not pair.released("q", "job"), "released into the quota of a charge that still counts"
        time.sleep(0.2)
    wait_until(lambda: pair.released("q", "job"), WAIT, "the queued Pod released once the charge expired")


def test_a_pod_naming_its_node_counts_a_release_its_replicas_watch_has_not_shown(pair_one: Pair) -> None:
    """The replica that does not lead has a late Pod watch (it shows nothing); the leader releases a
    queued 1-GPU Pod against classQuota {medium: 1}, then a 1-GPU Pod naming its node is created through
    the late replica, both its calls there. It counts the release the leader recorded with the charges:
    refused naming the quota (before: admitted, 2 GPUs bound against a quota of 1)."""
    pair = pair_one
    leader = pair.leader()
    assert leader is not None
    late = 1 - leader
    pair.sim.hold_watches(pair.token(late), "pods")
    try:
        pair.create(queued("job"), replica=leader)
        wait_until(lambda: pair.released("q", "job"), WAIT, "the queued Pod released")
        pair.hook.pin(late)
        allowed, message = pair.submit(bound("late"), replica=late)
        assert not allowed and "class quota medium in namespace q exceeded" in message, message
        assert [p["metadata"]["name"] for p in pair.sim.objects("Pod", "q")] == ["job"]
    finally:
        pair.hook.pin(None)
        pair.sim.release_watches(pair.token(late))
