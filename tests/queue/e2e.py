"""What the end-to-end tests of the queue share: two `gpupool serve` replicas against the API simulator,
a scheduler stand-in binding what is released, and kube-apiserver's part in creating a Pod (the
AdmissionReview sent to one replica or the other, its patch applied, the Pod stored). A helper module,
not a test module, so the test modules that run such a cluster (the queue's, the shipped policy's, its policy
reloads, the monitoring's) share it without importing one another."""

from __future__ import annotations

import base64
import copy
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

from tests.builders import gpu_node
from tests.conftest import (
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    serve_argv,
    server_env,
    stop_all,
    wait_until,
)
from webhook.testing import KubeSim

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
WAIT = 40.0  # generous: a loaded machine must not fail these
REPLICAS = ("replica-a", "replica-b")


class Cluster:
    """The simulator, two replicas, and kube-apiserver's part in creating a Pod."""

    def __init__(self, sim: KubeSim, replicas: list[ServerProcess], clients: list[ApiServerClient]) -> None:
        self.sim, self.replicas, self.clients = sim, replicas, clients
        self._next = itertools.cycle(range(len(clients)))

    def create(self, name: str, namespace: str, *, replica: int | None = None, **kw: Any) -> dict[str, Any]:
        """Admit through a replica (alternating) and store the patched Pod, as kube-apiserver does."""
        client = self.clients[next(self._next) if replica is None else replica]
        stored = admit(self.sim, client, pod(name, namespace, **kw))
        assert stored is not None, f"{namespace}/{name} was refused"
        return stored

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.sim.get("Pod", namespace, name)
        assert found is not None
        return found

    def released(self, namespace: str, name: str) -> bool:
        return not (self.pod(namespace, name)["spec"].get("schedulingGates") or [])

    def pool(self, namespace: str, name: str) -> str:
        return str((self.pod(namespace, name)["metadata"].get("annotations") or {}).get("gpupool.io/pool", ""))

    def leader(self) -> str:
        lease = self.sim.get("leases", "gpupool-system", "gpupool")
        return str((lease or {}).get("spec", {}).get("holderIdentity") or "")


def admit(sim: KubeSim, client: ApiServerClient, obj: dict[str, Any]) -> dict[str, Any] | None:
    """Create `obj` as kube-apiserver does through `client`'s replica: the stored Pod, or None when the
    webhook refused it."""
    namespace = obj["metadata"]["namespace"]
    answer = client.review(admission_review(obj, namespace=namespace))["response"]
    if not answer["allowed"]:
        return None
    if "patch" in answer:
        obj = jsonpatch.apply_patch(copy.deepcopy(obj), orjson.loads(base64.b64decode(answer["patch"])))
    return sim.add(obj)


def pod(name: str, namespace: str, *, gpus: int = 1, cls: str = "medium", priority: int = 0,  # noqa: PLR0913 (a test builder: each field a keyword)
        run: float | None = None, extra: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    annotations = {"gpupool.io/gpu-class": cls, "gpupool.io/gpu-count": str(gpus), **(extra or {})}
    if run is not None:
        annotations["kubesim.io/run-seconds"] = str(run)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "containers": [{"name": "main", "image": "cuda"}],
            "priority": priority,
            "tolerations": [GPU_TOLERATION],
        },
    }


def node(name: str, product: str, **kw: Any) -> dict[str, Any]:
    """A 4-GPU node as the kubelet reports it (with its Pod capacity, which the scheduler checks)."""
    obj = gpu_node(name, product, 4, **kw)
    obj["status"]["allocatable"]["pods"] = "110"
    return obj


def running(name: str, namespace: str, node: str, gpus: int) -> dict[str, Any]:
    obj = pod(name, namespace, gpus=gpus)
    obj["metadata"]["annotations"] = {}
    obj["spec"]["nodeName"] = node
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    obj["status"] = {"phase": "Running"}
    return obj


def resource_quota(namespace: str, hard: dict[str, str]) -> dict[str, Any]:
    meta = {"name": "gpus", "namespace": namespace}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": meta,
        "spec": {"hard": hard},
        "status": {"hard": hard},
    }


@contextmanager
def two_replicas(
    work: Path, cert_dir: Path, policy: Path, nodes: list[dict[str, Any]], *, lease_seconds: int | None = None
) -> Iterator[Cluster]:
    """The simulator with `nodes`, and two replicas serving `policy`, ready and with a leader elected; with
    `lease_seconds`, their `--lease-duration` (a module whose tests wait for a Lease to run out)."""
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load(nodes)
        kubeconfig = sim.write_kubeconfig(work / "kubeconfig")
        scheduler = sim.scheduler()
        replicas, clients = [], []
        for name in REPLICAS:
            port, health = free_port(), free_port()
            argv = serve_argv(cert_dir, port, health, "--kubeconfig", str(kubeconfig), "--policy", str(policy))
            if lease_seconds is not None:
                argv += ["--lease-duration", str(lease_seconds)]
            env = server_env(POD_NAME=name, POD_NAMESPACE="gpupool-system")
            server = ServerProcess(argv, work / f"{name}.log", env, health).start()
            replicas.append(server)
            clients.append(ApiServerClient(port, cert_dir / "ca.crt"))
        try:
            for server in replicas:
                server.wait_ready()
            wait_until(lambda: sim.get("leases", "gpupool-system", "gpupool") is not None, WAIT, "a leader")
            yield Cluster(sim, replicas, clients)
            assert sim.handler_errors == []
            for server in replicas:
                assert "refused a release as invalid" not in server.log()
        finally:
            scheduler.stop()
            for client in clients:
                client.close()
            stop_all(replicas, timeout=20)


def delete_every_pod(cluster: Cluster) -> None:
    """An empty cluster again, once both replicas' watches have seen the deletions."""
    for obj in cluster.sim.objects("Pod"):
        meta = obj["metadata"]
        if cluster.sim.get("Pod", meta["namespace"], meta["name"]) is not None:
            cluster.sim.delete("Pod", meta["namespace"], meta["name"])
    time.sleep(0.5)
