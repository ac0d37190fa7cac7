"""Tests for webhook.admission.versions: the policy version the mutating call writes on a Pod, and the
policy the validating call checks the stored Pod by, while replicas hold different policies."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from tests.builders import fleet, index_of, pod, policy
from webhook.admission.core import Admitter
from webhook.admission.validation import Trusted, Validator
from webhook.admission.versions import PREVIOUS_SECONDS, PREVIOUS_VERSIONS, STAMP
from webhook.domain.model import QUEUE_GATE
from webhook.domain.policy import Policy
from webhook.sources.snapshot import SnapshotInventory

Obj = dict[str, Any]
NOW = policy("namespaces:\n  q: {placement: now}\n")
QUEUE = policy("namespaces:\n  q: {placement: queue}\n")
AUDIT = policy("namespaces:\n  q: {placement: now, enforcement: audit}\n")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Replica:
    def __init__(self, pol: Policy) -> None:
        self.clock = Clock()
        self.admitter = Admitter(pol, SnapshotInventory(index_of(fleet(), pol), "test"), clock=self.clock)
        self.validator = Validator(self.admitter, Trusted.of("gpupool-system", "gpupool-webhook"))

    def mutate(self, obj: Obj) -> Obj:
        result = self.admitter.admit(copy.deepcopy(obj), namespace="q")
        assert result.allowed, result.message
        stored: Obj = jsonpatch.apply_patch(copy.deepcopy(obj), list(result.patch))
        return stored

    def validates(self, stored: Obj) -> bool:
        return self.validator.validate_create(stored, namespace="q", dry_run=True).verdict.allowed


def medium(name: str = "train", **annotations: str) -> Obj:
    return pod(name, "q", annotations={"gpupool.io/gpu-class": "medium", **annotations}, gpus=1)


def gated(obj: Obj) -> bool:
    return any(g.get("name") == QUEUE_GATE for g in obj["spec"].get("schedulingGates") or ())


def test_equal_content_is_one_version_and_other_content_another() -> None:
    """The version is of the content: the same rules written another way read the same."""
    same = policy("namespaces: {q: {placement: now}}")
    assert NOW.digest == same.digest
    assert len({NOW.digest, QUEUE.digest, AUDIT.digest}) == 3


def test_the_mutating_call_writes_its_version_on_placed_and_queued_pods_replacing_the_pods_own() -> None:
    """Placed or queued, the stored Pod carries the version of the policy that answered it, whatever
    value the Pod came with; an audited Pod is left as it was sent."""
    for pol in (NOW, QUEUE):
        for obj in (medium(), medium(**{STAMP: AUDIT.digest}), pod("bare", "q", gpus=1)):
            stored = Replica(pol).mutate(obj)
            assert stored["metadata"]["annotations"][STAMP] == pol.digest
    audited = Replica(AUDIT).mutate(medium())
    assert STAMP not in audited["metadata"]["annotations"]


def test_a_pod_stamped_by_a_previous_version_is_checked_by_that_version() -> None:
    """Placed under `now`, validated by a replica that has since switched q to `queue`: allowed; a Pod
    the queue version produced is allowed there too."""
    replica = Replica(NOW)
    placed = replica.mutate(medium())
    replica.admitter.use(QUEUE)
    assert replica.validates(placed)
    assert replica.validates(replica.mutate(medium("queued")))


def test_previous_versions_are_bounded_in_time_and_number() -> None:
    """An audited Pod (no version written) is allowed by the replica that has just switched q from audit
    to enforce, but not once that version was replaced more than PREVIOUS_SECONDS ago, nor once it is more
    than PREVIOUS_VERSIONS changes back."""
    replica = Replica(AUDIT)
    audited = replica.mutate(medium())
    replica.admitter.use(NOW)
    assert replica.validates(audited)
    replica.clock.now += PREVIOUS_SECONDS + 1
    assert not replica.validates(audited)
    replica = Replica(AUDIT)
    for i in range(PREVIOUS_VERSIONS):
        replica.admitter.use(policy(f"namespaces:\n  q: {{placement: now}}\n  other{i}: {{}}\n"))
    assert replica.validates(audited)
    replica.admitter.use(NOW)
    assert not replica.validates(audited)


def test_a_version_this_replica_does_not_know_is_held_to_what_does_not_depend_on_it() -> None:
    """A replica still on `now` validates what a replica on `queue` produced (gated: allowed), and a
    replica on `queue` what one on `now` produced (placed: allowed); neither lets in a GPU Pod that is
    neither gated nor placed, whatever version it names (an audited Pod of a policy it does not know)."""
    queued = Replica(QUEUE).mutate(medium())
    placed = Replica(NOW).mutate(medium())
    assert gated(queued) and not gated(placed)
    assert Replica(NOW).validates(queued)
    assert Replica(QUEUE).validates(placed)
    for forged in ("0123456789abcdef", AUDIT.digest, NOW.digest):
        bare = medium(**{STAMP: forged})
        assert not Replica(QUEUE).validates(bare)
        assert not Replica(NOW).validates(bare)
