"""The Lease as a fence (issue 26, item 1): a release that commits after its leader's term is refused.

Two `gpupool serve` replicas, each with its own credentials, against the API simulator, which calls
gpupool's validating webhook on every Pod update as kube-apiserver would (the shipped matchConditions,
the review encoded as Go encodes it, over HTTPS to both replicas in turn) at the moment the write
commits, and can hold back one replica's writes as a partition would.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest

from tests.builders import gpu_node
from tests.conftest import (
    REPO,
    SERVICE_DNS,
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    serve_argv,
    server_env,
    wait_until,
)
from webhook.testing import KubeSim
from webhook.testing.kubeadmission import ValidatingWebhook

pytestmark = pytest.mark.slow

POLICY = """
namespaces:
  q: {placement: queue, classQuota: {medium: 1}}
"""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SERVICE_ACCOUNT = "system:serviceaccount:gpupool-system:gpupool-webhook"
NAMES = ("replica-a", "replica-b")
WAIT = 60.0  # a failover takes the Lease's 15 s and a catch-up; generous for a loaded machine


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


class Pair:
    def __init__(self, sim: KubeSim, clients: list[ApiServerClient], hook: ValidatingWebhook) -> None:
        self.sim, self.clients, self.hook = sim, clients, hook

    def create(self, obj: dict[str, Any], replica: int) -> None:
        """Admitted through a replica's mutating webhook and stored, as kube-apiserver creates a Pod."""
        answer = self.clients[replica].review(admission_review(obj, namespace="q"))["response"]
        assert answer["allowed"], answer
        patch = orjson.loads(base64.b64decode(answer["patch"]))
        self.sim.add(jsonpatch.apply_patch(copy.deepcopy(obj), patch))

    def released(self, name: str) -> bool:
        found = self.sim.get("Pod", "q", name)
        assert found is not None
        return not found["spec"].get("schedulingGates")

    def leader(self) -> int | None:
        lease = self.sim.get("leases", "gpupool-system", "gpupool") or {}
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        return next((i for i, name in enumerate(NAMES) if holder == name), None)


@pytest.fixture
def pair(tmp_path: Path, cert_dir: Path) -> Iterator[Pair]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, "utf-8")
    with KubeSim(bookmark_interval=0.2) as sim:
        node = gpu_node("t4-a", "Tesla-T4", 4)
        node["status"]["allocatable"]["pods"] = "110"
        sim.load([node])
        ports = [free_port() for _ in NAMES]
        hook = ValidatingWebhook.from_manifest(
            REPO / "manifests/base/validating-webhook.yaml",
            [f"https://127.0.0.1:{port}/validate" for port in ports],
            cert_dir / "ca.crt",
            SERVICE_DNS,
        )
        sim.validating_webhook(hook)
        replicas, clients = [], []
        for name, port in zip(NAMES, ports, strict=True):
            sim.add_client(f"token-{name}", SERVICE_ACCOUNT, ("system:serviceaccounts", "system:authenticated"))
            kubeconfig = sim.write_kubeconfig(tmp_path / f"{name}.kubeconfig", token=f"token-{name}")
            health = free_port()
            argv = serve_argv(cert_dir, port, health, "--kubeconfig", str(kubeconfig), "--policy", str(policy))
            env = server_env(POD_NAME=name, POD_NAMESPACE="gpupool-system")
            replicas.append(ServerProcess(argv, tmp_path / f"{name}.log", env, health).start())
            clients.append(ApiServerClient(port, cert_dir / "ca.crt"))
        try:
            for server in replicas:
                server.wait_ready()
            pair = Pair(sim, clients, hook)
            wait_until(lambda: pair.leader() is not None, WAIT, "a leader")
            yield pair
            assert sim.handler_errors == []
        finally:
            for name in NAMES:
                sim.release_writes(f"token-{name}")
            for client in clients:
                client.close()
            for server in replicas:
                server.stop(timeout=20)


def test_a_release_held_past_its_leaders_term_is_refused(pair: Pair) -> None:
    """The leader's writes are held (a partition) while it releases q/low; its Lease runs out, the other
    replica takes it and releases q/high, which came later with a higher priority; then the held release
    arrives. It is refused: exactly classQuota {medium: 1} Pods of q are released, not two."""
    old = pair.leader()
    assert old is not None
    new = 1 - old
    token = f"token-{NAMES[old]}"
    pair.sim.hold_writes(token)
    pair.create(pod("low", 0), replica=new)
    wait_until(lambda: pair.sim.write_requests("patch", "pods") >= 1, WAIT, "the leader's release of q/low")
    pair.create(pod("high", 1000), replica=new)
    wait_until(lambda: pair.leader() == new, WAIT, "the other replica taking the Lease")
    wait_until(lambda: pair.released("high"), WAIT, "the new leader's release of q/high")
    assert not pair.released("low")
    denied = pair.hook.denied
    held, _ = pair.sim.held_writes(token)
    assert held >= 1
    pair.sim.release_writes(token)
    answered = lambda: pair.sim.held_writes(token)[0] == 0 and pair.sim.held_writes(token)[1] >= held  # noqa: E731
    wait_until(answered, WAIT, "the held writes to arrive and be answered")
    assert [pair.released("low"), pair.released("high")] == [False, True]
    # The held release reached the validating webhook (the Pod was unchanged: the resourceVersion
    # precondition passed) and was refused there.
    assert pair.hook.denied > denied
    high = pair.sim.get("Pod", "q", "high")
    assert high is not None
    holder = pair.sim.get("leases", "gpupool-system", "gpupool")["spec"]
    assert high["metadata"]["annotations"]["gpupool.io/released-by"] == (
        f"{holder['holderIdentity']}/{holder['leaseTransitions']}"
    )
