"""The Lease as a fence (issue 26, item 1): a release that commits after its leader's term is refused.

Two `gpupool serve` replicas, each with its own credentials, against the API simulator, which calls
gpupool's validating webhook on every Pod update as kube-apiserver would (the shipped matchConditions,
the review encoded as Go encodes it, over HTTPS to both replicas in turn) at the moment the write
commits, and can hold back one replica's writes as a partition would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.queue.helpers import GPU_TOLERATION
from tests.queue.replicas import WAIT, Pair, one_t4_node, replicas

pytestmark = pytest.mark.slow

LEASE_SECONDS = 6  # the replicas' --lease-duration: the test waits for the held leader's Lease to run out
POLICY = """
namespaces:
  q: {placement: queue, classQuota: {medium: 1}}
"""


def pod(name: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "q", "annotations": {"gpupool.io/gpu-class": "medium"}},
        "spec": {
            "containers": [{"name": "main", "image": "cuda"}],
            "priority": priority,
            "tolerations": [GPU_TOLERATION],
        },
    }


@pytest.fixture
def pair(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    with replicas(tmp_path, cert_dir, POLICY, one_t4_node(), lease_seconds=LEASE_SECONDS) as pair:
        yield pair


def test_a_release_held_past_its_leaders_term_is_refused(pair: Pair) -> None:
    """The leader's writes are held (a partition) while it releases q/low; its Lease runs out, the other
    replica takes it and releases q/high, which came later with a higher priority; then the held release
    arrives. It is refused: exactly classQuota {medium: 1} Pods of q are released, not two."""
    old = pair.leader()
    assert old is not None
    new = 1 - old
    token = Pair.token(old)
    # Its Pod writes first (the release's record in the charges Lease goes through, webhook.queue.records),
    # then every write once the release is held, so its Lease runs out.
    pair.sim.hold_writes(token, resource="pods")
    pair.create(pod("low", 0), replica=new)
    wait_until(lambda: pair.sim.held_writes(token)[0] >= 1, WAIT, "the leader's release of q/low, held")
    pair.sim.hold_writes(token)
    pair.create(pod("high", 1000), replica=new)
    wait_until(lambda: pair.leader() == new, WAIT, "the other replica taking the Lease")
    assert pair.sim.get("leases", "gpupool-system", "gpupool")["spec"]["leaseDurationSeconds"] == LEASE_SECONDS
    wait_until(lambda: pair.released("q", "high"), WAIT, "the new leader's release of q/high")
    assert not pair.released("q", "low")
    denied = pair.hook.denied
    held, _ = pair.sim.held_writes(token)
    assert held >= 1
    pair.sim.release_writes(token)
    answered = lambda: pair.sim.held_writes(token)[0] == 0 and pair.sim.held_writes(token)[1] >= held  # noqa: E731
    wait_until(answered, WAIT, "the held writes to arrive and be answered")
    assert [pair.released("q", "low"), pair.released("q", "high")] == [False, True]
    # The held release reached the validating webhook (the Pod was unchanged: the resourceVersion
    # precondition passed) and was refused there.
    assert pair.hook.denied > denied
    high = pair.sim.get("Pod", "q", "high")
    assert high is not None
    holder = pair.sim.get("leases", "gpupool-system", "gpupool")["spec"]
    assert high["metadata"]["annotations"]["gpupool.io/released-by"] == (
        f"{holder['holderIdentity']}/{holder['leaseTransitions']}"
    )
