"""Two `gpupool serve` replicas against the API simulator, each with its own credentials, and the
simulator calling gpupool's validating webhook on every Pod update as kube-apiserver would (the shipped
matchConditions, the review encoded as Go encodes it, over HTTPS to both replicas in turn) at the moment
the write commits. Pods are created as kube-apiserver creates them: through a replica's mutating webhook,
its patch applied, then stored."""

from __future__ import annotations

import base64
import copy
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

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
    stop_all,
    wait_until,
)
from webhook.testing import KubeSim
from webhook.testing.kubeadmission import UserInfo, ValidatingWebhook
from webhook.testing.kubeproto import ApiError

SERVICE_ACCOUNT = "system:serviceaccount:gpupool-system:gpupool-webhook"
NAMES = ("replica-a", "replica-b")
TENANT = UserInfo("alice", ("system:authenticated",))
WAIT = 60.0  # a failover takes the Lease's duration (15 s by default) and a catch-up; generous for a loaded machine


class Pair:
    def __init__(
        self, sim: KubeSim, clients: list[ApiServerClient], hook: ValidatingWebhook, servers: list[ServerProcess]
    ) -> None:
        self.sim, self.clients, self.hook, self.servers = sim, clients, hook, servers
        self._calls = [threading.Lock() for _ in clients]  # one connection per client: one call at a time

    def create(self, obj: dict[str, Any], replica: int = 0) -> dict[str, Any]:
        """Admitted through a replica's mutating webhook and stored, as kube-apiserver creates a Pod."""
        namespace = obj["metadata"]["namespace"]
        answer = self.clients[replica].review(admission_review(obj, namespace=namespace))["response"]
        assert answer["allowed"], answer
        if "patch" in answer:
            obj = jsonpatch.apply_patch(copy.deepcopy(obj), orjson.loads(base64.b64decode(answer["patch"])))
        return self.sim.add(obj)

    def submit(self, obj: dict[str, Any], replica: int = 0, *, stored: bool = True) -> tuple[bool, str]:
        """A Pod CREATE as kube-apiserver makes it, both webhooks included: a replica's mutating call, its
        patch applied, the Pod given its uid, the validating call (on the replicas in turn), then stored
        (`stored` False: the creation fails after the validating call, so no watch ever shows the Pod).
        (allowed, the refusal's message). Safe from several threads: the validating calls run at once."""
        namespace = obj["metadata"]["namespace"]
        with self._calls[replica]:
            answer = self.clients[replica].review(admission_review(obj, namespace=namespace))["response"]
        if not answer["allowed"]:
            return False, str(answer["status"]["message"])
        if "patch" in answer:
            obj = jsonpatch.apply_patch(copy.deepcopy(obj), orjson.loads(base64.b64decode(answer["patch"])))
        obj = copy.deepcopy(obj)
        obj["metadata"]["uid"] = str(uuid.uuid4())
        try:
            self.hook({"kind": "Pod", "apiVersion": "v1", **obj}, None, TENANT, dry_run=False)
        except ApiError as exc:
            return False, exc.message
        if stored:
            self.sim.add(obj)
        return True, ""

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.sim.get("Pod", namespace, name)
        assert found is not None
        return found

    def released(self, namespace: str, name: str) -> bool:
        return not self.pod(namespace, name)["spec"].get("schedulingGates")

    def leader(self) -> int | None:
        lease = self.sim.get("leases", "gpupool-system", "gpupool") or {}
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        return next((i for i, name in enumerate(NAMES) if holder == name), None)

    @staticmethod
    def token(replica: int) -> str:
        return f"token-{NAMES[replica]}"


@contextmanager
def replicas(
    work: Path, cert_dir: Path, policy: str, nodes: list[dict[str, Any]], *, lease_seconds: int | None = None
) -> Iterator[Pair]:
    """The simulator with `nodes`, and two replicas serving `policy`, once one of them leads; with
    `lease_seconds`, their `--lease-duration` (a module whose tests wait for a Lease to run out)."""
    policy_file = work / "policy.yaml"
    policy_file.write_text(policy, "utf-8")
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load(nodes)
        ports = [free_port() for _ in NAMES]
        hook = ValidatingWebhook.from_manifest(
            REPO / "manifests/base/validating-webhook.yaml",
            [f"https://127.0.0.1:{port}/validate" for port in ports],
            cert_dir / "ca.crt",
            SERVICE_DNS,
        )
        sim.validating_webhook(hook)
        servers, clients = [], []
        for name, port in zip(NAMES, ports, strict=True):
            sim.add_client(f"token-{name}", SERVICE_ACCOUNT, ("system:serviceaccounts", "system:authenticated"))
            kubeconfig = sim.write_kubeconfig(work / f"{name}.kubeconfig", token=f"token-{name}")
            health = free_port()
            argv = serve_argv(cert_dir, port, health, "--kubeconfig", str(kubeconfig), "--policy", str(policy_file))
            if lease_seconds is not None:
                argv += ["--lease-duration", str(lease_seconds)]
            env = server_env(POD_NAME=name, POD_NAMESPACE="gpupool-system")
            servers.append(ServerProcess(argv, work / f"{name}.log", env, health).start())
            clients.append(ApiServerClient(port, cert_dir / "ca.crt"))
        try:
            for server in servers:
                server.wait_ready()
            pair = Pair(sim, clients, hook, servers)
            wait_until(lambda: pair.leader() is not None, WAIT, "a leader")
            yield pair
            assert sim.handler_errors == []
        finally:
            for name in NAMES:
                sim.release_writes(f"token-{name}")
            for client in clients:
                client.close()
            stop_all(servers, timeout=20)


def one_t4_node() -> list[dict[str, Any]]:
    """One node of 4 T4s with room for 110 Pods: the fleet of the fence's and the charges' two-replica tests."""
    node = gpu_node("t4-a", "Tesla-T4", 4)
    node["status"]["allocatable"]["pods"] = "110"
    return [node]
