"""Two `gpupool serve` replicas against the API simulator, as the end-to-end queue tests drive them:
kube-apiserver's part in creating a Pod (review through a replica, patch applied, Pod stored) and the
Pods and nodes they use."""

from __future__ import annotations

import base64
import copy
import itertools
from typing import Any

import jsonpatch
import orjson

from tests.builders import gpu_node
from tests.conftest import ApiServerClient, ServerProcess, admission_review
from tests.queue.helpers import GPU_TOLERATION
from webhook.testing import KubeSim

WAIT = 40.0  # generous: a loaded machine must not fail these


class Cluster:
    """The simulator, two replicas, and kube-apiserver's part in creating a Pod."""

    def __init__(self, sim: KubeSim, replicas: list[ServerProcess], clients: list[ApiServerClient]) -> None:
        self.sim, self.replicas, self.clients = sim, replicas, clients
        self._next = itertools.cycle(range(len(clients)))

    def create(self, name: str, namespace: str, *, replica: int | None = None, **kw: Any) -> dict[str, Any]:
        """Admit through a replica (alternating) and store the patched Pod, as kube-apiserver does."""
        obj = pod(name, namespace, **kw)
        client = self.clients[next(self._next) if replica is None else replica]
        answer = client.review(admission_review(obj, namespace=namespace))["response"]
        assert answer["allowed"], answer
        if "patch" in answer:
            obj = jsonpatch.apply_patch(copy.deepcopy(obj), orjson.loads(base64.b64decode(answer["patch"])))
        return self.sim.add(obj)

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
