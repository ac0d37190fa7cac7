"""The validating webhook through real `gpupool serve` processes (two replicas, TLS, a live inventory on the
API simulator), called as kube-apiserver calls it.

A CREATE is played as kube-apiserver plays it: POST /mutate, its patch applied, the name generated from
generateName, whatever a mutating webhook called after gpupool's does, then POST /validate with that
object, to the same replica or to the other one. An UPDATE is a review with oldObject and the caller in
userInfo. Quota room is probed with dry runs, which reserve nothing.
"""

from __future__ import annotations

import base64
import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest

from tests.builders import gpu_node, pod, quota
from tests.conftest import (
    ApiServerClient,
    ServerProcess,
    admission_review,
    wait_until,
)
from tests.serving.running import SETTLE, gpu_quotas, metric, start_serving
from webhook.testing.kubesim import KubeSim

pytestmark = pytest.mark.slow

GPUPOOL = "system:serviceaccount:gpupool-system:gpupool-webhook"
QUEUE_GATE = "gpupool.io/queue"
QUOTAS = {"team-v": 2, "team-w": 1, "team-x": 2, "team-y": 1}  # requests.nvidia.com/gpu
Obj = dict[str, Any]


class Replica:
    def __init__(self, server: ServerProcess, client: ApiServerClient, health_port: int) -> None:
        self.server, self.client, self.health_port = server, client, health_port

    def call(self, path: str, review: Obj) -> Obj:
        reply = self.client.post(orjson.dumps(review), path=f"{path}?timeout=5s")
        assert reply.status == 200, reply.body
        answer: Obj = reply.json()["response"]
        assert answer["uid"] == review["request"]["uid"]
        return answer

    def probe(self, namespace: str, gpus: int = 1) -> bool:
        """Whether a dry run of another Pod of `gpus` GPUs is admitted now (its namespace's quota has room)."""
        review = admission_review(pod("probe", namespace, gpus=gpus), namespace=namespace, dry_run=True)
        return bool(self.call("/mutate", review)["allowed"])

    def update(self, old: Obj, new: Obj, user: str, groups: tuple[str, ...] = ("system:authenticated",)) -> Obj:
        review = admission_review(new, operation="UPDATE", namespace=new["metadata"]["namespace"])
        review["request"]["oldObject"] = old
        review["request"]["userInfo"] = {"username": user, "groups": list(groups)}
        return self.call("/validate", review)

    def metric(self, name: str, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        value = metric(self.health_port, f"{name}{{{want}}}" if labels else name)
        return 0.0 if value is None else value


class Cluster:
    def __init__(self, sim: KubeSim, a: Replica, b: Replica) -> None:
        self.sim, self.a, self.b = sim, a, b

    def create(
        self,
        namespace: str,
        gpus: int | None = None,
        *,
        later: Callable[[Obj], None] | None = None,
        validated_by: Replica | None = None,
        generate_name: str = "train-",
    ) -> tuple[Obj, Obj]:
        """A Pod CREATE as kube-apiserver runs it: mutated by replica a, then (after `later`, a mutating
        webhook called after gpupool's) validated by `validated_by` (a by default). The stored Pod and
        the validating answer."""
        obj = pod("", namespace, annotations={"gpupool.io/gpu-class": "medium"}, gpus=gpus)
        del obj["metadata"]["name"]
        obj["metadata"]["generateName"] = generate_name
        mutated = self.a.call("/mutate", admission_review(obj, namespace=namespace))
        assert mutated["allowed"], mutated
        stored: Obj = jsonpatch.apply_patch(obj, orjson.loads(base64.b64decode(mutated["patch"])))
        stored["metadata"]["name"] = generate_name + "x7k2p"
        if later is not None:
            later(stored)
        answer = (validated_by or self.a).call("/validate", admission_review(stored, namespace=namespace))
        return stored, answer


def start_replica(start: Callable[..., ServerProcess], cert_dir: Path, kubeconfig: Path) -> Replica:
    flags = ("--kubeconfig", str(kubeconfig), "--trusted-groups", "oncall")
    return Replica(*start_serving(start, cert_dir, *flags, wait=False))


@pytest.fixture(scope="module")
def cluster(
    cert_dir: Path, start_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("validate")
    with KubeSim(bookmark_interval=0.5) as sim:
        sim.load([
            gpu_node("t4-a", "Tesla-T4", 8, memory_mib=15360),
            gpu_node("t4-b", "Tesla-T4", 8, memory_mib=15360),
            *gpu_quotas(QUOTAS),
        ])  # fmt: skip
        kubeconfig = sim.write_kubeconfig(tmp / "kubeconfig")
        a, b = (start_replica(start_server, cert_dir, kubeconfig) for _ in range(2))
        for replica in (a, b):  # started side by side, each ready before the first test
            replica.server.wait_ready()
        try:
            yield Cluster(sim, a, b)
        finally:
            a.client.close()
            b.client.close()


# --- CREATE -------------------------------------------------------------------------------------------


def raise_count(p: Obj) -> None:
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"


def drop_limit(p: Obj) -> None:
    del p["spec"]["containers"][0]["resources"]


def drop_selector(p: Obj) -> None:
    del p["spec"]["nodeSelector"]


def add_term(p: Obj) -> None:
    p["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": ["t4-a"]}]}]}}}  # fmt: skip
    del p["spec"]["nodeSelector"]


@pytest.mark.parametrize(
    ("later", "words"),
    [
        (raise_count, "requests.nvidia.com/gpu used 0 + requested 3 > hard 2"),
        (drop_limit, "lacks what keeps it in pool nvidia/medium/Tesla-T4: limit nvidia.com/gpu: 1 on container main"),
        (drop_selector, "it lacks what keeps it in pool nvidia/medium/Tesla-T4: nodeSelector gpu.accelerator/class=me"),
        (add_term, "it lacks what keeps it in pool nvidia/medium/Tesla-T4: nodeSelector"),
    ],
    ids=["gpu-count-raised", "gpu-limit-removed", "node-selector-removed", "selector-swapped-for-affinity"],
)  # fmt: skip
def test_a_later_webhooks_change_of_gpu_requests_or_constraints_is_refused_and_frees_the_quota(
    cluster: Cluster, later: Callable[[Obj], None], words: str
) -> None:
    """A mutating webhook that runs after gpupool's one reinvocation raises the GPU count past the quota,
    takes the GPU limit away, or takes away the nodeSelector that keeps the Pod in its pool: the stored
    Pod is refused (403) saying why, and the mutating call's reservation goes with it at once (team-v's
    quota has room for 2 GPUs right after, not 5 s later)."""
    _, answer = cluster.create("team-v", later=later)
    assert (answer["allowed"], answer["status"]["code"]) == (False, 403)
    assert words in answer["status"]["message"]
    assert cluster.a.probe("team-v", gpus=2)


def test_the_pod_as_placed_is_allowed_and_its_reservation_counts_from_the_validating_call(cluster: Cluster) -> None:
    """The Pod gpupool left is allowed. Its reservation, confirmed 3 s after the mutating call, still
    holds team-w's one GPU 6 s after it (past the 5 s a reservation settles in when the Pod never shows
    up), and goes once the validating call is 5 s old with no Pod in the watch."""
    mutated_at = time.monotonic()
    stored = pod("", "team-w", annotations={"gpupool.io/gpu-class": "medium"})
    del stored["metadata"]["name"]
    stored["metadata"]["generateName"] = "infer-"
    answer = cluster.a.call("/mutate", admission_review(stored, namespace="team-w"))
    stored = jsonpatch.apply_patch(stored, orjson.loads(base64.b64decode(answer["patch"])))
    stored["metadata"]["name"] = "infer-x7k2p"
    time.sleep(3)
    validated = cluster.a.call("/validate", admission_review(stored, namespace="team-w"))
    validated_at = time.monotonic()
    assert validated["allowed"] is True
    assert validated["auditAnnotations"] == {"pool": "nvidia/medium/Tesla-T4"}
    time.sleep(max(0.0, mutated_at + SETTLE + 1 - time.monotonic()))
    assert not cluster.a.probe("team-w"), "the confirmed reservation settled with the mutating call's clock"
    assert time.monotonic() < validated_at + SETTLE, "the machine was too slow to tell the two clocks apart"
    wait_until(lambda: cluster.a.probe("team-w"), SETTLE + 7, "the confirmed reservation to settle")
    lines = [line for line in cluster.a.server.log_lines() if line.get("message") == "validation"]
    assert {"pod": "infer-x7k2p", "operation": "CREATE", "outcome": "allowed", "reservation": "confirmed"}.items() <= (
        next(line for line in lines if line.get("pod") == "infer-x7k2p").items()
    )


def test_a_confirmed_pod_is_counted_once_when_the_watch_shows_it(cluster: Cluster) -> None:
    """Once kube-apiserver stores the Pod (quota charged, then the Pod written), the watch takes the
    confirmed reservation over by the Pod's generated name: team-x (2 GPUs) has room for exactly one
    more GPU at once, long before the reservation would have settled, and still after."""
    stored, answer = cluster.create("team-x")
    validated_at = time.monotonic()
    assert answer["allowed"] is True
    cluster.sim.modify(quota("gpus", "team-x", {"requests.nvidia.com/gpu": "2"}, {"requests.nvidia.com/gpu": "1"}))
    stored["spec"]["nodeName"] = "t4-a"
    stored["status"] = {"phase": "Running"}
    cluster.sim.add(stored)
    wait_until(lambda: cluster.a.probe("team-x"), SETTLE - 2, "the watch to take the reservation over")
    assert time.monotonic() < validated_at + SETTLE
    assert not cluster.a.probe("team-x", gpus=2)
    time.sleep(max(0.0, validated_at + SETTLE + 1 - time.monotonic()))
    assert cluster.a.probe("team-x") and not cluster.a.probe("team-x", gpus=2)


def test_validated_by_the_other_replica_the_pod_is_counted_on_both(cluster: Cluster) -> None:
    """kube-apiserver may send the validating call to the other replica: it has no reservation to
    confirm, checks the Pod against its own view and reserves it there; the first keeps its own until its
    watch shows the Pod. Either replica then refuses team-y's next GPU."""
    _, answer = cluster.create("team-y", validated_by=cluster.b)
    assert answer["allowed"] is True
    assert not cluster.b.probe("team-y")
    assert not cluster.a.probe("team-y")
    lines = [line for line in cluster.b.server.log_lines() if line.get("message") == "validation"]
    assert any(line.get("reservation") == "made" and line["namespace"] == "team-y" for line in lines)


# --- UPDATE -------------------------------------------------------------------------------------------


def test_an_update_of_the_pool_or_group_annotation_is_refused_for_a_user_and_allowed_for_gpupool(
    cluster: Cluster,
) -> None:
    """gpupool.io/pool and gpupool.io/group are what the accounting reads: a user who repoints either is
    refused with what changed and who may change it; gpupool's own service account and a member of the
    trusted group (--trusted-groups oncall) may; a label change is anyone's."""
    old, _ = cluster.create("ml", generate_name="sweep-")
    old["metadata"]["annotations"]["gpupool.io/group"] = "sweep"
    for key, value in (("gpupool.io/pool", "nvidia/high/NVIDIA-A100-SXM4-40GB"), ("gpupool.io/group", "other")):
        new = copy.deepcopy(old)
        new["metadata"]["annotations"][key] = value
        refused = cluster.b.update(old, new, "alice")
        assert (refused["allowed"], refused["status"]["code"]) == (False, 403)
        message = refused["status"]["message"]
        assert f"alice changed annotation {key} (changed)" in message
        assert f"only gpupool's service account {GPUPOOL} and group oncall may change" in message
        assert cluster.b.update(old, new, GPUPOOL)["allowed"] is True
        assert cluster.b.update(old, new, "carol", ("system:authenticated", "oncall"))["allowed"] is True
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"app": "sweep"}
    assert cluster.b.update(old, relabelled, "alice")["allowed"] is True
    assert cluster.b.metric("gpupool_validations_total", operation="UPDATE", outcome="denied") >= 2


def queued(namespace: str = "ml") -> Obj:
    """A Pod as the queue's mutating call creates it: the GPU limit and gpupool's gate, no pool."""
    obj = pod("train-0", namespace, annotations={"gpupool.io/gpu-class": "medium"}, gpus=1)
    obj["spec"]["schedulingGates"] = [{"name": QUEUE_GATE}]
    return obj


def release(obj: Obj) -> Obj:
    """The queue's one release PATCH: nodeSelector entries, node-affinity requirements appended, the GPU
    toleration, gpupool.io/pool, and the gate removed."""
    new = copy.deepcopy(obj)
    new["metadata"]["annotations"]["gpupool.io/pool"] = "nvidia/medium/Tesla-T4"
    new["spec"]["nodeSelector"] = {"gpu.accelerator/class": "medium", "nvidia.com/gpu.product": "Tesla-T4"}
    new["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/mig.config.state", "operator": "NotIn",
                                                     "values": ["pending", "rebooting"]}]}]}}}  # fmt: skip
    new["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    del new["spec"]["schedulingGates"]
    return new


def test_the_release_patch_passes_for_gpupools_service_account_only(cluster: Cluster) -> None:
    """The queue's release (as gpupool's service account) is allowed; the same update by the Pod's owner,
    or only removing the gate to jump the queue, is refused naming what changed and who may."""
    old = queued()
    assert cluster.a.update(old, release(old), GPUPOOL)["allowed"] is True
    refused = cluster.a.update(old, release(old), "alice")
    message = refused["status"]["message"]
    assert (refused["allowed"], refused["status"]["code"]) == (False, 403)
    for change in ("annotation gpupool.io/pool (added)", "nodeSelector gpu.accelerator/class, nvidia.com/gpu.product",
                   "required node affinity", "tolerations", f"scheduling gate {QUEUE_GATE} (removed)"):  # fmt: skip
        assert change in message, change
    ungated = copy.deepcopy(old)
    del ungated["spec"]["schedulingGates"]
    jumped = cluster.a.update(old, ungated, "alice")
    assert jumped["allowed"] is False
    assert f"alice changed scheduling gate {QUEUE_GATE} (removed)" in jumped["status"]["message"]
    assert "gpupool releases a queued Pod once its pool has room" in jumped["status"]["message"]
