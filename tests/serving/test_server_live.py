"""The server on the live inventory (the API simulator through a kubeconfig): burst safety, workload
groups and quotas across workers, and the garbage collector frozen once the inventory is loaded.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import gpu_node, pod, quota
from tests.conftest import (
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    gpu_pod,
    serve_argv,
    wait_until,
)
from webhook.serving.server import freeze_when_ready
from webhook.testing.kubesim import KubeSim

pytestmark = pytest.mark.slow


class TestLiveInventory:
    """Without --inventory the server watches the cluster: here the API simulator, through a kubeconfig."""

    def test_serves_from_the_live_cluster_with_burst_safety(
        self, cert_dir: Path, start_server: Callable[..., ServerProcess], tmp_path: Path
    ) -> None:
        """Ready after the first list; placements follow the cluster; admissions reserve their GPUs."""
        with KubeSim(bookmark_interval=0.5) as sim:
            sim.load([gpu_node("l4-a", "NVIDIA-L4", 4, memory_mib=23034)])
            kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
            port, health_port = free_port(), free_port()
            argv = serve_argv(cert_dir, port, health_port, "--kubeconfig", str(kubeconfig))
            server = start_server(argv, health_port)
            client = ApiServerClient(port, cert_dir / "ca.crt")
            try:
                medium = gpu_pod(annotations={"gpupool.io/gpu-class": "medium"})
                answers = [client.review(admission_review(medium))["response"] for _ in range(5)]
                assert [a["auditAnnotations"]["pool"] for a in answers] == ["nvidia/medium/NVIDIA-L4"] * 5
                assert [bool(a.get("warnings")) for a in answers] == [False] * 4 + [True]  # 4 free GPUs
                high = gpu_pod(annotations={"gpupool.io/gpu-class": "high"})
                assert not client.review(admission_review(high))["response"]["allowed"]
                sim.add(gpu_node("a100-a", "NVIDIA-A100-SXM4-40GB", 8, gpu_class="high", memory_mib=40960))
                wait_until(
                    lambda: client.review(admission_review(high, dry_run=True))["response"]["allowed"],
                    20,
                    "the new node in the server's decisions",
                )
            finally:
                client.close()
                server.stop()


def job_review(job: str, i: int, *, namespace: str = "ml", gpus: int = 1) -> dict[str, Any]:
    """The review kube-apiserver sends when a Job controller creates its i-th Pod: generateName only, the
    Job as controller owner, no gpupool.io/group annotation (the Job groups them)."""
    pod = gpu_pod(name=None, generate_name=f"{job}-", namespace=namespace,
                  annotations={"gpupool.io/min-memory": "1Gi", "gpupool.io/gpu-count": str(gpus)})  # fmt: skip
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"uid-{job}", "controller": True}
    ]
    return admission_review(pod, uid=f"{job}-{i}", namespace=namespace)


LIVE_POLICY = "defaults: {placement: now}\nnamespaces: {vision: {memoryQuota: 48Gi}}\n"  # admission-time placement


@pytest.fixture(scope="class")
def live(
    cert_dir: Path, start_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KubeSim, ApiServerClient, ServerProcess]]:
    """`gpupool serve` on the API simulator: two pools the ranking cannot tell apart (same class, same
    memory per GPU; 16 GPUs each), a ResourceQuota in the tutorial's form in team-b (1 of 4 GPUs used)
    and a 48Gi GPU-memory quota for vision."""
    tmp = tmp_path_factory.mktemp("live")
    (tmp / "policy.yaml").write_text(LIVE_POLICY)
    with KubeSim(bookmark_interval=0.5) as sim:
        sim.load([
                *(gpu_node(f"a10-{i}", "NVIDIA-A10", 8, memory_mib=23034) for i in range(2)),
                *(gpu_node(f"l4-{i}", "NVIDIA-L4", 8, memory_mib=23034) for i in range(2)),
                quota("compute-resources", "team-b", {"nvidia.com/gpu": "4"}),
                pod("inference", "team-b", gpus=1, node="l4-1", phase="Running"),
            ])  # fmt: skip
        kubeconfig = sim.write_kubeconfig(tmp / "kubeconfig")
        port, health_port = free_port(), free_port()
        argv = serve_argv(
            cert_dir, port, health_port, "--kubeconfig", str(kubeconfig), "--policy", str(tmp / "policy.yaml")
        )
        server = start_server(argv, health_port)
        client = ApiServerClient(port, cert_dir / "ca.crt")
        try:
            yield sim, client, server
        finally:
            client.close()
            server.stop()


class TestGroupsAndQuotasLive:
    """The server on the live inventory (the API simulator): a workload's burst stays on one pool, and the
    quota forms and the GPU-memory quota are enforced, as kube-apiserver would see it."""

    def test_a_burst_of_16_job_pods_lands_on_one_pool_while_it_has_room(
        self, live: tuple[KubeSim, ApiServerClient, ServerProcess]
    ) -> None:
        """16 Pods of one Job, sent back to back, none of them created in the cluster (the watch shows
        none): every one goes to the same pool, which has exactly 16 free GPUs, with no warning; the 17th
        finds it full and is placed on the other pool, saying the group is split. Each admission line
        names the group. (Without groups the ranking alternates between the two pools.)"""
        sim, client, server = live
        answers = [client.review(job_review("train", i))["response"] for i in range(17)]
        pools = [a["auditAnnotations"]["pool"] for a in answers]
        assert len(set(pools[:16])) == 1, pools
        assert pools[16] != pools[0]
        assert all("warnings" not in a for a in answers[:16])
        first, other = pools[0].rsplit("/", 1)[1], pools[16].rsplit("/", 1)[1]
        assert answers[16]["warnings"] == [f"gpupool: group Job/train split across pools {first} and {other}"]
        assert sim.open_watches("pods") >= 1  # watching, and none of the Pods was created in the cluster

        def logged() -> bool:
            return sum(e.get("group") == "Job/train" for e in server.log_lines()) == 17

        wait_until(logged, 30, "17 admission lines naming the group")

    def test_the_tutorials_quota_form_is_enforced(self, live: tuple[KubeSim, ApiServerClient, ServerProcess]) -> None:
        """team-b's `nvidia.com/gpu: 4`: 3 more GPUs fit beside the 1 a running Pod holds; then 4 more do
        not (403: used 1 + 3 just admitted), and the message says Kubernetes does not enforce the form."""
        _, client, _ = live
        fits = client.review(job_review("eval", 0, namespace="team-b", gpus=3))["response"]
        assert fits["allowed"] is True, fits
        denied = client.review(job_review("eval-4", 0, namespace="team-b", gpus=4))["response"]
        assert (denied["allowed"], denied["status"]["code"]) == (False, 403)
        assert denied["status"]["message"].startswith(
            "exceeded quota compute-resources in namespace team-b: nvidia.com/gpu used 4 + requested 4 > hard 4; "
            "Kubernetes does not enforce"
        )

    def test_the_memory_quota_is_enforced(self, live: tuple[KubeSim, ApiServerClient, ServerProcess]) -> None:
        """vision may hold 48Gi of GPU memory: two 22.5Gi GPUs fit, a third does not."""
        _, client, _ = live
        assert client.review(job_review("seg", 0, namespace="vision", gpus=2))["response"]["allowed"] is True
        denied = client.review(job_review("seg", 1, namespace="vision"))["response"]
        assert (denied["allowed"], denied["status"]["code"]) == (False, 403)
        assert denied["status"]["message"] == (
            "GPU memory quota in namespace vision exceeded: used 46068Mi + requested 23034Mi > hard 48Gi"
        )


class TestGcFreeze:
    """The worker's start-up objects are frozen out of full collections once its inventory is loaded."""

    class FakeInventory:
        def __init__(self, ready: bool) -> None:
            self.ready = ready

    @pytest.fixture(autouse=True)
    def unfrozen(self) -> Iterator[None]:
        gc.unfreeze()
        yield
        gc.unfreeze()  # the test process's objects go back to normal collection

    def test_a_loaded_inventory_freezes_at_once(self) -> None:
        freeze_when_ready(self.FakeInventory(ready=True))
        assert gc.get_freeze_count() > 0

    def test_a_live_inventory_freezes_after_its_first_sync(self) -> None:
        inventory = self.FakeInventory(ready=False)
        freeze_when_ready(inventory, poll_seconds=0.01)
        time.sleep(0.1)
        assert gc.get_freeze_count() == 0, "nothing is frozen before the inventory is loaded"
        inventory.ready = True
        wait_until(lambda: gc.get_freeze_count() > 0, 10, "the freeze after the first sync")
