"""The validating webhook while two replicas hold different policies (a policy ConfigMap change reaches
each replica's volume at its own time): the Pod carries the policy its mutating call applied
(gpupool.io/policy), and the validating call checks it against that one, whichever replica it reaches.

Both replicas start on a policy under which namespace q places now; then replica a's file alone is
rewritten so that q queues. Replica a knows both versions; replica b only the first.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest

from tests.builders import gpu_node, pod
from tests.conftest import ApiServerClient, ServerProcess, admission_review, wait_until
from tests.serving.running import start_serving
from webhook.testing.kubesim import KubeSim

pytestmark = pytest.mark.slow

NOW = "namespaces:\n  q: {placement: now}\n"
QUEUE = "namespaces:\n  q: {placement: queue}\n"
STAMP = "gpupool.io/policy"
GATE = "gpupool.io/queue"
Obj = dict[str, Any]


def call(client: ApiServerClient, path: str, review: Obj) -> Obj:
    reply = client.post(orjson.dumps(review), path=f"{path}?timeout=5s")
    assert reply.status == 200, reply.body
    answer: Obj = reply.json()["response"]
    return answer


def mutated(client: ApiServerClient, obj: Obj) -> Obj:
    answer = call(client, "/mutate", admission_review(obj, namespace="q"))
    assert answer["allowed"], answer
    if "patch" not in answer:
        return obj
    out: Obj = jsonpatch.apply_patch(copy.deepcopy(obj), orjson.loads(base64.b64decode(answer["patch"])))
    return out


def gated(obj: Obj) -> bool:
    return any(g.get("name") == GATE for g in obj["spec"].get("schedulingGates") or ())


def gpu_pod(name: str, annotations: dict[str, str] | None = None) -> Obj:
    return pod(name, "q", annotations={"gpupool.io/gpu-class": "medium", **(annotations or {})}, gpus=1)


class Replicas:
    def __init__(self, a: ApiServerClient, b: ApiServerClient) -> None:
        self.a, self.b = a, b

    def create(self, name: str, mutate: ApiServerClient, validate: ApiServerClient, **ann: str) -> tuple[Obj, Obj]:
        stored = mutated(mutate, gpu_pod(name, ann or None))
        return stored, call(validate, "/validate", admission_review(stored, namespace="q"))


@pytest.fixture(scope="module")
def replicas(
    cert_dir: Path, start_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("policies")
    with KubeSim(bookmark_interval=0.5) as sim:
        sim.load([gpu_node("t4-a", "Tesla-T4", 8, memory_mib=15360)])
        kubeconfig = sim.write_kubeconfig(tmp / "kubeconfig")
        files = [tmp / "a.yaml", tmp / "b.yaml"]
        started = []
        for file in files:  # side by side, each ready before the first review
            file.write_text(NOW, "utf-8")
            flags = ("--kubeconfig", str(kubeconfig), "--policy", str(file))
            started.append(start_serving(start_server, cert_dir, *flags, wait=False))
        for server, _, _ in started:
            server.wait_ready()
        a, b = (client for _, client, _ in started)
        assert not gated(mutated(a, gpu_pod("probe")))
        files[0].write_text(QUEUE, "utf-8")  # the ConfigMap's new version reaches replica a only
        wait_until(lambda: gated(mutated(a, gpu_pod("probe"))), 30, "replica a on the queueing policy")
        try:
            yield Replicas(a, b)
        finally:
            a.close()
            b.close()


def test_queued_by_the_new_policy_validated_by_a_replica_on_the_old_one(replicas: Replicas) -> None:
    """Mutated by replica a (q queues: gated), validated by replica b (q places now, and b has not seen
    the new policy): allowed, as the queued Pod a's policy made it."""
    stored, answer = replicas.create("queued", replicas.a, replicas.b)
    assert gated(stored)
    assert answer["allowed"], answer


def test_placed_by_the_old_policy_validated_by_a_replica_on_the_new_one(replicas: Replicas) -> None:
    """Mutated by replica b (q places now), validated by replica a (q queues now, the old policy its
    previous version): allowed, as the placed Pod b's policy made it."""
    stored, answer = replicas.create("placed", replicas.b, replicas.a)
    assert not gated(stored)
    assert stored["metadata"]["annotations"]["gpupool.io/pool"]
    assert answer["allowed"], answer


def test_each_replica_still_refuses_what_no_policy_in_effect_produced(replicas: Replicas) -> None:
    """A GPU Pod neither gated nor placed (a later webhook undid gpupool's answer) is refused by both."""
    for client in (replicas.a, replicas.b):
        bare = gpu_pod("bare")
        answer = call(client, "/validate", admission_review(bare, namespace="q"))
        assert not answer["allowed"], answer


def test_a_forged_policy_annotation_gains_nothing(replicas: Replicas) -> None:
    """A tenant writes gpupool.io/policy naming the version under which q placed now (the one both
    replicas know), or a version no replica knows: replica a's mutating call stamps its own version,
    so the Pod is gated all the same; and a Pod that reaches the validating call ungated and unplaced
    with a forged stamp is refused by both replicas."""
    _, placed = replicas.create("placed-for-stamp", replicas.b, replicas.b)
    assert placed["allowed"], placed
    old = mutated(replicas.b, gpu_pod("stamp"))["metadata"]["annotations"][STAMP]
    for forged in (old, "0123456789abcdef"):
        stored, answer = replicas.create("forged", replicas.a, replicas.b, **{STAMP: forged})
        assert gated(stored), stored
        assert stored["metadata"]["annotations"][STAMP] != forged
        assert answer["allowed"], answer
        for client in (replicas.a, replicas.b):
            bare = gpu_pod("forged-bare", {STAMP: forged})
            refused = call(client, "/validate", admission_review(bare, namespace="q"))
            assert not refused["allowed"], refused
