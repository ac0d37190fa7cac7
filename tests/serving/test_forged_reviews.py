"""Forged AdmissionReviews against the real server on a live inventory (the API simulator): what a Pod
that reaches the webhook port without being kube-apiserver can hold, and that real bursts stay exact.

A forged non-dry review is answered and reserves GPUs like kube-apiserver's would (gpupool cannot tell them
apart without client certificates, docs/install.md step 6), but its Pod never appears in the watch: the
reservation is dropped `reservationSettleSeconds` (5 s by default, SETTLE here) after it was made, and a
namespace holds at most `maxReservationsPerNamespace` of them. The real Pods here are created in the
simulator the way kube-apiserver creates them after admission: the ResourceQuota's `status.used` goes up
first (quota admission), then the Pod is written and the watch shows it.
"""

from __future__ import annotations

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
    wait_until,
)
from tests.serving.running import gpu_quotas, metric, start_serving
from webhook.testing.kubesim import KubeSim

pytestmark = pytest.mark.slow

BOUND = 40  # maxReservationsPerNamespace in this module's policy
SETTLE = 2.0  # and its reservationSettleSeconds: the waits below are for it
QUOTAS = {"team-q": 4, "team-r": 6}  # requests.nvidia.com/gpu


class Cluster:
    """The simulator, the server on it and a client that talks like kube-apiserver."""

    def __init__(self, sim: KubeSim, client: ApiServerClient, health_port: int) -> None:
        self.sim, self.client, self.health_port = sim, client, health_port
        self.used = dict.fromkeys(QUOTAS, 0)

    def review(self, name: str, namespace: str, gpus: int, *, dry_run: bool = False) -> dict[str, Any]:
        review = admission_review(pod(name, namespace, gpus=gpus), namespace=namespace, dry_run=dry_run)
        answer: dict[str, Any] = self.client.review(review)["response"]
        return answer

    def create(self, name: str, namespace: str, gpus: int) -> None:
        """What kube-apiserver does after admitting a Pod: charge the quota, then store the Pod."""
        self.used[namespace] += gpus
        used = {"requests.nvidia.com/gpu": str(self.used[namespace])}
        self.sim.modify(quota("gpus", namespace, {"requests.nvidia.com/gpu": str(QUOTAS[namespace])}, used))
        self.sim.add(pod(name, namespace, gpus=gpus, node="t4-a", phase="Running"))

    def reservations(self) -> float:
        value = metric(self.health_port, "gpupool_reservations")
        assert value is not None, "no gpupool_reservations on /metrics"
        return value


@pytest.fixture(scope="module")
def cluster(
    cert_dir: Path, start_server: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("forged")
    defaults = f"placement: now, maxReservationsPerNamespace: {BOUND}, reservationSettleSeconds: {SETTLE}"
    (tmp / "policy.yaml").write_text(f"defaults: {{{defaults}}}\n")
    with KubeSim(bookmark_interval=0.5) as sim:
        sim.load([gpu_node("t4-a", "Tesla-T4", 64, memory_mib=15360), *gpu_quotas(QUOTAS)])
        kubeconfig = sim.write_kubeconfig(tmp / "kubeconfig")
        policy = str(tmp / "policy.yaml")
        server, client, health_port = start_serving(
            start_server, cert_dir, "--kubeconfig", str(kubeconfig), "--policy", policy
        )
        try:
            yield Cluster(sim, client, health_port)
        finally:
            client.close()
            server.stop()


def test_a_forged_review_holds_another_namespaces_quota_only_until_the_settle_time(cluster: Cluster) -> None:
    """A review posted for team-q by someone else (non-dry, 4 GPUs: all of team-q's quota) gets team-q's
    real Pod refused at first; once the settle time has passed, with no Pod in the watch, the real Pod
    is admitted. Polled with dry runs, which reserve nothing."""
    forged_at = time.monotonic()
    assert cluster.review("forged", "team-q", 4)["allowed"] is True
    refused = cluster.review("real", "team-q", 1, dry_run=True)
    assert (refused["allowed"], refused["status"]["code"]) == (False, 403)
    assert "used 4 + requested 1 > hard 4" in refused["status"]["message"]
    wait_until(
        lambda: cluster.review("real", "team-q", 1, dry_run=True)["allowed"],
        SETTLE + 7,  # the settle time, and slack for a loaded machine (the old 15 s would not make it)
        "team-q's quota free again once the forged reservation settled",
    )
    assert time.monotonic() - forged_at >= SETTLE - 0.5  # held, and not dropped before its time


def test_a_burst_of_real_pods_stays_exact_while_another_namespace_is_flooded(cluster: Cluster) -> None:
    """While forged reviews flood team-z (no quota) past its bound, team-r's burst of real Pods is counted
    exactly: its 6 GPUs of quota admit 6 Pods and refuse the 7th, the 6 are created as kube-apiserver
    would, and after the settle time the 7th is still refused: the real Pods count, nothing of theirs was
    dropped. team-z never holds more than its bound of reservations."""
    for i in range(BOUND + 20):
        assert cluster.review(f"flood-{i}", "team-z", 1)["allowed"] is True
    answers = []
    for i in range(7):
        answers.append(cluster.review(f"job-{i}", "team-r", 1))
        cluster.review(f"flood-r-{i}", "team-z", 1)
    assert [a["allowed"] for a in answers] == [True] * 6 + [False]
    for i in range(6):
        cluster.create(f"job-{i}", "team-r", 1)
    wait_until(lambda: cluster.reservations() <= BOUND, 15, f"at most {BOUND} reservations held")
    time.sleep(SETTLE + 1)
    late = cluster.review("job-late", "team-r", 1, dry_run=True)
    assert late["allowed"] is False
    assert "used 6 + requested 1 > hard 6" in late["status"]["message"]
